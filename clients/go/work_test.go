package mscheduler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func noop(context.Context, Task) (any, error) { return nil, nil }

// waitFor polls until done() or the deadline.
func waitFor(t *testing.T, what string, done func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !done(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWork(t *testing.T) {
	url := serve(t, token)
	client := NewClient(url, token)
	ctx := context.Background()
	fast := WorkOptions{Concurrency: 4, Lease: time.Second, Wait: 200 * time.Millisecond}

	t.Run("runs each task once, extends long ones, records the outcome", func(t *testing.T) {
		name := fresh("work")
		var keys []string
		for n := 0; n < 20; n++ {
			keys = append(keys, fmt.Sprintf("%s:%d", name, n))
			of(first(client.Publish(ctx, keys[n], name, keys[n], nil))).must(t)
		}
		once := &PublishOptions{Options: map[string]any{"max_unexpected_retries": 0}}
		of(first(client.Publish(ctx, name+":bad", name, "bad", once))).must(t)
		of(first(client.Publish(ctx, name+":panic", name, "panic", once))).must(t)
		var mu sync.Mutex
		ran := map[string]int{}
		working, stop := context.WithCancel(ctx)
		done := make(chan error)
		go func() {
			done <- client.Work(working, []string{name}, func(_ context.Context, task Task) (any, error) {
				mu.Lock()
				ran[task.Key]++
				mu.Unlock()
				switch string(task.Payload) {
				case `"bad"`:
					return nil, errors.New("no")
				case `"panic"`:
					panic("oh")
				}
				if task.Key == keys[0] {
					time.Sleep(2500 * time.Millisecond) // outlives its first lease: extended
				}
				return map[string]string{"echoed": task.Key}, nil
			}, fast)
		}()
		all := append(append([]string{}, keys...), name+":bad", name+":panic")
		waitFor(t, "every task ended", func() bool {
			for _, key := range all {
				if task := of(client.Get(ctx, key)).must(t); task.State != "success" && task.State != "fail" {
					return false
				}
			}
			return true
		})
		stop()
		if err := <-done; err != nil {
			t.Fatalf("a stop is no error: %v", err)
		}
		for _, key := range all {
			if ran[key] != 1 {
				t.Errorf("%s ran %d times", key, ran[key])
			}
		}
		for _, key := range keys {
			task := of(client.Get(ctx, key)).must(t)
			if task.State != "success" || string(task.Result) != fmt.Sprintf(`{"echoed":%q}`, key) || len(task.WorkerStates) != 1 {
				t.Errorf("%s: %s %s, %d attempts", key, task.State, task.Result, len(task.WorkerStates))
			}
		}
		for key, message := range map[string]string{name + ":bad": "no", name + ":panic": "panic: oh"} {
			task := of(client.Get(ctx, key)).must(t)
			if task.State != "fail" || task.WorkerStates[0].Error == nil || task.WorkerStates[0].Error.Message != message {
				t.Errorf("%s: %s %+v", key, task.State, task.WorkerStates)
			}
		}
	})

	t.Run("a stop lets the running handler finish and writes its outcome", func(t *testing.T) {
		name := fresh("stop")
		of(first(client.Publish(ctx, name+":1", name, nil, nil))).must(t)
		working, stop := context.WithCancel(ctx)
		started := make(chan struct{})
		done := make(chan error)
		go func() {
			done <- client.Work(working, []string{name}, func(handlerCtx context.Context, _ Task) (any, error) {
				close(started)
				stop()
				time.Sleep(300 * time.Millisecond)
				return "finished", handlerCtx.Err()
			}, fast)
		}()
		<-started
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if task := of(client.Get(ctx, name+":1")).must(t); task.State != "success" || string(task.Result) != `"finished"` {
			t.Fatalf("%s %s", task.State, task.Result)
		}
	})

	for _, permanent := range []struct {
		about  string
		client *Client
		names  []string
		status int
		code   string
	}{
		{"a wrong token", NewClient(url, "wrong-token-0123456789"), []string{"x"}, 401, "unauthorized"},
		{"a route the server does not have", NewClient(url+"/not-the-api", token), []string{"x"}, 404, "no_route"},
		{"a body the server refuses", client, []string{}, 422, "invalid"},
	} {
		t.Run(permanent.about+" stops work", func(t *testing.T) {
			reported := 0
			options := fast
			options.OnError = func(error, *Lease) { reported++ }
			err := permanent.client.Work(ctx, permanent.names, noop, options)
			wantStatus(t, err, permanent.status, permanent.code)
			if reported != 0 {
				t.Fatalf("%d reported", reported)
			}
		})
	}

	t.Run("a permanent error cancels the running handlers and waits for them", func(t *testing.T) {
		name := fresh("revoked")
		revoking := NewClient(url, token)
		var revoked, finished atomic.Bool
		revoking.HTTP = &http.Client{Transport: revokable{&revoked}}
		of(first(revoking.Publish(ctx, name+":1", name, nil, nil))).must(t)
		options := fast
		options.Lease = 300 * time.Millisecond
		err := revoking.Work(ctx, []string{name}, func(handlerCtx context.Context, _ Task) (any, error) {
			revoked.Store(true) // the next extension is refused
			<-handlerCtx.Done()
			finished.Store(true)
			return nil, nil
		}, options)
		wantStatus(t, err, 401, "unauthorized")
		if !finished.Load() {
			t.Fatal("Work returned before its handler")
		}
	})
}

func TestWorkRetriesWhatMayPass(t *testing.T) {
	t.Run("a server that is down is reported each time", func(t *testing.T) {
		listening, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		address := listening.Addr().String()
		listening.Close() // connection refused from now on
		working, stop := context.WithCancel(context.Background())
		var reported []error
		err = NewClient("http://"+address, "").Work(working, []string{"x"}, noop, WorkOptions{
			OnError: func(err error, lease *Lease) {
				if lease != nil {
					t.Error("an own has no lease")
				}
				reported = append(reported, err)
				if len(reported) == 3 {
					stop()
				}
			},
		})
		if err != nil || len(reported) != 3 {
			t.Fatalf("returned %v after %d reports", err, len(reported))
		}
		for _, each := range reported {
			if IsPermanent(each) {
				t.Fatalf("%v is not permanent", each)
			}
		}
	})

	t.Run("a URL that is another web server's stops work with its 404", func(t *testing.T) {
		other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(404)
			fmt.Fprint(w, "<html><body>Not Found</body></html>")
		}))
		defer other.Close()
		err := NewClient(other.URL, "").Work(context.Background(), []string{"x"}, noop, WorkOptions{})
		wantStatus(t, err, 404, "http_error")
	})

	t.Run("503 while the server starts is retried, then 401 stops work", func(t *testing.T) {
		var seen atomic.Int32
		fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if seen.Add(1) <= 2 {
				w.WriteHeader(503)
				fmt.Fprint(w, `{"error": "unavailable", "message": "MongoDB unreachable"}`)
				return
			}
			w.WriteHeader(401)
			fmt.Fprint(w, `{"error": "unauthorized", "message": "no"}`)
		}))
		defer fake.Close()
		var reported []error
		err := NewClient(fake.URL, "").Work(context.Background(), []string{"x"}, noop, WorkOptions{
			OnError: func(err error, _ *Lease) { reported = append(reported, err) },
		})
		wantStatus(t, err, 401, "unauthorized")
		if len(reported) != 2 || seen.Load() != 3 {
			t.Fatalf("%d reported, %d requests", len(reported), seen.Load())
		}
		for _, each := range reported {
			wantStatus(t, each, 503, "unavailable")
		}
	})
}

// revokable sends a wrong token once revoked is true, as if the server's token changed.
type revokable struct{ revoked *atomic.Bool }

func (r revokable) RoundTrip(request *http.Request) (*http.Response, error) {
	if r.revoked.Load() {
		request = request.Clone(request.Context())
		request.Header.Set("Authorization", "Bearer revoked-token-0123456789")
	}
	return http.DefaultTransport.RoundTrip(request)
}
