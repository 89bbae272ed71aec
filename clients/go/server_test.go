package mscheduler

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The project's root: this module is clients/go of it.
var root, _ = filepath.Abs(filepath.Join("..", ".."))

var (
	pythonOnce  sync.Once
	python      string
	pythonError error
)

// findPython is $MSCHEDULER_PYTHON, else the checkout's .venv (the project's set-up makes it),
// else python3: the first of them that imports mscheduler's HTTP API.
func findPython() (string, error) {
	pythonOnce.Do(func() {
		candidates := []string{}
		if given := os.Getenv("MSCHEDULER_PYTHON"); given != "" {
			candidates = append(candidates, given)
		} else {
			venv := filepath.Join(root, ".venv", "bin", "python")
			if _, err := os.Stat(venv); err == nil {
				candidates = append(candidates, venv)
			}
			candidates = append(candidates, "python3")
		}
		for _, candidate := range candidates {
			check := exec.Command(candidate, "-c", "import mscheduler.http, uvicorn")
			check.Dir, check.Env = root, append(os.Environ(), "PYTHONPATH="+root)
			if check.Run() == nil {
				python = candidate
				return
			}
		}
		pythonError = fmt.Errorf("no Python here runs mscheduler serve (tried %s): run the "+
			"project's set-up at its root (python3 -m venv .venv && .venv/bin/pip install -e "+
			"'.[http]'), or set MSCHEDULER_PYTHON to a Python that has it",
			strings.Join(candidates, ", "))
	})
	return python, pythonError
}

var announced = regexp.MustCompile(`serve: (http://\S+?)/ `)

// startPython runs python with args in the project's root until the test ends; it must
// announce its address on stderr as mscheduler serve does.
func startPython(t testing.TB, args ...string) string {
	t.Helper()
	python, err := findPython()
	if err != nil {
		t.Fatal(err)
	}
	command := exec.Command(python, args...)
	command.Dir, command.Env = root, append(os.Environ(), "PYTHONPATH="+root)
	stderr, err := command.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := command.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		_ = command.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = command.Process.Kill()
			<-exited
		}
	})
	found := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stderr)
		seen := []string{}
		for lines.Scan() {
			seen = append(seen, lines.Text())
			if match := announced.FindStringSubmatch(lines.Text() + " "); match != nil {
				found <- match[1]
				for lines.Scan() { // keep reading: a full pipe would block the server
				}
				break
			}
		}
		_ = command.Wait()
		close(exited)
		select {
		case found <- "exited: " + strings.Join(seen, "\n"):
		default:
		}
	}()
	select {
	case address := <-found:
		if strings.HasPrefix(address, "exited: ") {
			t.Fatalf("the server exited: %s", strings.TrimPrefix(address, "exited: "))
		}
		return address
	case <-time.After(60 * time.Second):
		t.Fatal("the server did not announce its address within 60 s")
		return ""
	}
}

// serve is `mscheduler serve` on a private memory:// database, with token.
func serve(t testing.TB, token string) string {
	t.Helper()
	uri := fmt.Sprintf("memory://go-%d-%d", os.Getpid(), time.Now().UnixNano())
	return startPython(t, "-m", "mscheduler", "--uri", uri, "serve", "--port", "0", "--token", token)
}
