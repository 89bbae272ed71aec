package mscheduler

// How Work ends its runs when it stops on an error or the server stops answering: no lease is
// left to expire (an expiry counts an attempt, and may fail a task for good) and no write
// waits for ever.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestWorkStopsCleanly(t *testing.T) {
	url := serve(t, token)
	ctx := context.Background()

	t.Run("a permanent error releases the leases whose handlers it cancels", func(t *testing.T) {
		name := fresh("refused")
		var started atomic.Bool
		client := NewClient(url, token)
		client.HTTP = &http.Client{Transport: refusingOwn{&started}}
		once := &PublishOptions{Options: map[string]any{"max_unexpected_retries": 0}}
		of(first(client.Publish(ctx, name+":1", name, nil, once))).must(t)
		err := client.Work(ctx, []string{name}, func(handlerCtx context.Context, _ Task) (any, error) {
			started.Store(true) // the next own is refused for good
			<-handlerCtx.Done()
			return nil, handlerCtx.Err()
		}, WorkOptions{Concurrency: 2, Lease: 30 * time.Second, Wait: 100 * time.Millisecond})
		wantStatus(t, err, 422, "invalid")
		task := of(NewClient(url, token).Get(ctx, name+":1")).must(t)
		if task.State == "running" || len(task.WorkerStates) != 1 || task.WorkerStates[0].State != "released" {
			t.Fatalf("the task is %s, its attempts %+v: left running until its lease expires",
				task.State, task.WorkerStates)
		}
	})

	t.Run("a lease lost while its handler runs cancels that handler only, and writes nothing", func(t *testing.T) {
		name := fresh("lost")
		client := NewClient(url, token)
		for _, key := range []string{name + ":cancelled", name + ":kept"} {
			of(first(client.Publish(ctx, key, name, nil, nil))).must(t)
		}
		working, stop := context.WithCancel(ctx)
		told := make(chan string, 2)
		done := make(chan error, 1)
		go func() {
			done <- client.Work(working, []string{name}, func(handlerCtx context.Context, task Task) (any, error) {
				if task.Key == name+":kept" { // outlives several leases, extended each time
					time.Sleep(time.Second)
					return "kept", handlerCtx.Err()
				}
				if _, err := client.Do(ctx, "POST", "/tasks/"+task.Key+"/cancel", nil, nil); err != nil {
					t.Error(err) // not Fatal: this is the handler's goroutine
				}
				select {
				case <-handlerCtx.Done():
					told <- task.Key
				case <-time.After(10 * time.Second):
				}
				return "written after the lease was lost", nil
			}, WorkOptions{Concurrency: 2, Lease: 300 * time.Millisecond, Wait: 100 * time.Millisecond})
		}()
		select {
		case <-told:
		case <-time.After(15 * time.Second):
			t.Fatal("the handler of a cancelled task was not told")
		}
		waitFor(t, "the other task succeeded", func() bool {
			return of(client.Get(ctx, name+":kept")).must(t).State == "success"
		})
		stop()
		if err := <-done; err != nil {
			t.Fatalf("a lost lease stops nothing else: %v", err)
		}
		if task := of(client.Get(ctx, name+":cancelled")).must(t); task.State != "cancelled" || string(task.Result) != "null" {
			t.Fatalf("%s %s", task.State, task.Result)
		}
		if task := of(client.Get(ctx, name+":kept")).must(t); len(task.WorkerStates) != 1 || string(task.Result) != `"kept"` {
			t.Fatalf("%d attempts, %s", len(task.WorkerStates), task.Result)
		}
	})
}

// refusingOwn answers every own with a 422 once refused is true, as a server would that
// no longer takes the worker's names.
type refusingOwn struct{ refused *atomic.Bool }

func (r refusingOwn) RoundTrip(request *http.Request) (*http.Response, error) {
	if r.refused.Load() && strings.HasSuffix(request.URL.Path, "/v1/own") {
		body := `{"error": "invalid", "message": "names: not taken here"}`
		return &http.Response{
			StatusCode: 422, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(body)), Request: request,
		}, nil
	}
	return http.DefaultTransport.RoundTrip(request)
}

func TestWorkDoesNotWaitForAServerThatNeverAnswers(t *testing.T) {
	for _, route := range []string{"/v1/leases/succeed", "/v1/leases/extend"} {
		t.Run(route, func(t *testing.T) {
			hanging := make(chan struct{})
			var owned atomic.Int32
			fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				switch r.URL.Path {
				case route:
					select { // a server that took the request and went silent
					case <-r.Context().Done():
					case <-hanging:
					}
				case "/v1/own":
					leases := []Lease{}
					if owned.Add(1) == 1 {
						expires := time.Now().Add(300 * time.Millisecond)
						leases = append(leases, Lease{Key: "k", WorkerID: "w", RunID: "r", ExpiresAt: &expires})
					} else {
						time.Sleep(20 * time.Millisecond)
					}
					var answer bytes.Buffer
					_ = json.NewEncoder(&answer).Encode(map[string]any{"leases": leases})
					_, _ = w.Write(answer.Bytes())
				default:
					expires := time.Now().Add(300 * time.Millisecond)
					_ = json.NewEncoder(w).Encode(Lease{Key: "k", WorkerID: "w", RunID: "r", ExpiresAt: &expires})
				}
			}))
			defer fake.Close()
			defer close(hanging)
			working, stop := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- NewClient(fake.URL, "").Work(working, []string{"x"}, func(context.Context, Task) (any, error) {
					stop() // a graceful stop: the outcome is still written
					time.Sleep(250 * time.Millisecond)
					return "ok", nil
				}, WorkOptions{Concurrency: 1, Lease: 300 * time.Millisecond, Wait: 50 * time.Millisecond})
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal(fmt.Sprintf("Work waits on %s after its 300 ms lease has long expired", route))
			}
		})
	}
}

func TestAStopDuringAnAnswerKeepsItsLeases(t *testing.T) {
	headers, resume := make(chan struct{}), make(chan struct{})
	ended := make(chan string, 4)
	var owned atomic.Int32
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/own":
			if owned.Add(1) > 1 {
				time.Sleep(20 * time.Millisecond)
				fmt.Fprint(w, `{"leases": []}`)
				return
			}
			w.WriteHeader(200) // the answer has begun: the server counts its leases as given
			w.(http.Flusher).Flush()
			close(headers)
			<-resume
			expires := time.Now().Add(10 * time.Second)
			_ = json.NewEncoder(w).Encode(map[string]any{"leases": []Lease{{Key: "k", WorkerID: "w", RunID: "r", ExpiresAt: &expires}}})
		default:
			ended <- r.URL.Path
			fmt.Fprint(w, `{"key": "k"}`)
		}
	}))
	defer fake.Close()
	working, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- NewClient(fake.URL, "").Work(working, []string{"x"}, func(context.Context, Task) (any, error) {
			return "ok", nil
		}, WorkOptions{Concurrency: 1, Lease: 10 * time.Second})
	}()
	<-headers
	time.Sleep(100 * time.Millisecond) // the worker has the answer's head
	stop()
	time.Sleep(100 * time.Millisecond)
	close(resume)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Work did not return")
	}
	select {
	case path := <-ended:
		if path != "/v1/leases/succeed" && path != "/v1/leases/release" {
			t.Fatalf("the lease ended with %s", path)
		}
	default:
		t.Fatal("the lease of an answer the stop cut short was dropped: it runs out its 10 s and counts an attempt")
	}
}
