package mscheduler

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A mixed fleet on one collection: a Python consumer (in the server's process), the Node
// worker (clients/js) and this Go worker; every task runs exactly once, and each language
// runs some. Once means once as the server recorded it (one attempt, its result naming the
// language) and as the Go and Node handlers saw it (each ran the keys its language's results
// name, each once).
func TestMixedFleet(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the fleet needs Node 18+ for its JavaScript worker")
	}
	const fleetToken = "fleet-token-0123456789abcdef"
	url := startPython(t, "clients/js/test/fleet_server.py", "--consumers", "1", "--token", fleetToken)
	client := NewClient(url, fleetToken)
	ctx := context.Background()

	nodeWorker := exec.Command(node, "testdata/node_worker.mjs", url, fleetToken)
	stdout, err := nodeWorker.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	nodeWorker.Stderr = &testWriter{t}
	if err := nodeWorker.Start(); err != nil {
		t.Fatal(err)
	}
	nodeDone := make(chan error, 1)
	nodeRan := map[string]int{} // read once nodeDone has answered
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if line := lines.Text(); strings.HasPrefix(line, "ran ") {
				nodeRan[strings.TrimPrefix(line, "ran ")]++
			}
		}
		nodeDone <- nodeWorker.Wait()
	}()
	nodeStopped := false
	stopNode := func() {
		if !nodeStopped {
			nodeStopped = true
			_ = nodeWorker.Process.Signal(syscall.SIGTERM)
			if err := <-nodeDone; err != nil {
				t.Errorf("the Node worker: %v", err)
			}
		}
	}
	defer stopNode()

	working, stop := context.WithCancel(ctx)
	goDone := make(chan error, 1)
	var goMu sync.Mutex
	goRan := map[string]int{}
	go func() {
		goDone <- client.Work(working, []string{"fleet"}, func(_ context.Context, task Task) (any, error) {
			goMu.Lock()
			goRan[task.Key]++
			goMu.Unlock()
			time.Sleep(2 * time.Millisecond)
			return map[string]string{"by": "go"}, nil
		}, WorkOptions{Concurrency: 8, Lease: 10 * time.Second, Wait: 200 * time.Millisecond})
	}()

	const tasks = 300
	keys := make([]string, tasks)
	for n := range keys {
		keys[n] = fmt.Sprintf("fleet:%d", n)
		of(first(client.Publish(ctx, keys[n], "fleet", keys[n], nil))).must(t)
	}
	var ended []Task
	waitFor(t, "every fleet task succeeded", func() bool {
		var listed struct {
			Tasks []Task `json:"tasks"`
		}
		of(client.Do(ctx, "GET", "/tasks?name=fleet&state=success&limit=1000", nil, &listed)).must(t)
		ended = listed.Tasks
		return len(ended) == tasks
	})
	stop()
	if err := <-goDone; err != nil {
		t.Fatalf("the Go worker: %v", err)
	}
	stopNode()
	handled := map[string]map[string]int{"go": goRan, "node": nodeRan}

	runs := map[string]int{}
	duplicates := 0
	for _, task := range ended {
		duplicates += len(task.WorkerStates) - 1
		var result struct {
			By string `json:"by"`
		}
		if err := json.Unmarshal(task.Result, &result); err != nil {
			t.Fatalf("%s: %s", task.Key, task.Result)
		}
		runs[result.By]++
		for language, ran := range handled {
			want := 0
			if result.By == language {
				want = 1
			}
			if ran[task.Key] != want {
				t.Errorf("%s (its result by %s): the %s handler ran it %d times", task.Key, result.By, language, ran[task.Key])
			}
		}
	}
	t.Logf("mixed fleet: %d tasks, runs %v, duplicates %d", len(ended), runs, duplicates)
	if len(ended) != tasks || duplicates != 0 || runs["python"]+runs["node"]+runs["go"] != tasks {
		t.Fatalf("%d tasks, runs %v, duplicates %d", len(ended), runs, duplicates)
	}
	for _, language := range []string{"python", "node", "go"} {
		if runs[language] == 0 {
			t.Errorf("the %s worker ran none", language)
		}
	}
}

// testWriter passes a child's stderr to the test's log.
type testWriter struct{ t *testing.T }

func (w *testWriter) Write(data []byte) (int, error) {
	w.t.Log(string(data))
	return len(data), nil
}
