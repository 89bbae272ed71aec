package mscheduler

// The protocol's scenarios (docs/protocol.md, tests/conformance/) through this client,
// against a `mscheduler serve` the test starts.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"
)

const token = "go-token-0123456789abcdef"

func fresh(prefix string) string { return fmt.Sprintf("%s-%08x", prefix, rand.Uint32()) }

// outcome is a call's two results, so that a test can say of(call()).must(t).
type outcome[T any] struct {
	value T
	err   error
}

func of[T any](value T, err error) outcome[T] { return outcome[T]{value, err} }

func (o outcome[T]) must(t *testing.T) T {
	t.Helper()
	if o.err != nil {
		t.Fatal(o.err)
	}
	return o.value
}

func keys(leases []Lease) []string {
	out := []string{}
	for _, lease := range leases {
		out = append(out, lease.Key)
	}
	return out
}

func wantStatus(t *testing.T, err error, status int, code string) {
	t.Helper()
	var api *APIError
	if !errors.As(err, &api) || api.Status != status || api.Code != code {
		t.Fatalf("want %d %s, got %v", status, code, err)
	}
}

func TestProtocol(t *testing.T) {
	url := serve(t, token)
	client := NewClient(url, token)
	ctx := context.Background()
	own := func(t *testing.T, name string, opts OwnOptions) []Lease {
		t.Helper()
		if opts.WorkerID == "" {
			opts.WorkerID = "go-conformance"
		}
		return of(client.Own(ctx, []string{name}, opts)).must(t)
	}
	state := func(t *testing.T, key string) string {
		t.Helper()
		return of(client.Get(ctx, key)).must(t).State
	}

	t.Run("publish is idempotent by key", func(t *testing.T) {
		name := fresh("pub")
		task, created := must2(t)(client.Publish(ctx, name+":1", name, map[string]int{"n": 1}, nil))
		if !created || task.State != "pending" {
			t.Fatalf("created %v, state %s", created, task.State)
		}
		again, created := must2(t)(client.Publish(ctx, name+":1", name, map[string]int{"n": 2}, nil))
		if created || string(again.Payload) != `{"n":1}` {
			t.Fatalf("created %v, payload %s", created, again.Payload)
		}
		_, err := client.Get(ctx, name+":none")
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("want ErrNotFound, got %v", err)
		}
	})

	t.Run("a bad body is 422 and writes nothing", func(t *testing.T) {
		name := fresh("bad")
		_, _, err := client.Publish(ctx, name+":1", name, nil, &PublishOptions{Options: map[string]any{"priority": "high"}})
		wantStatus(t, err, 422, "invalid")
		if !IsPermanent(err) {
			t.Fatal("a 422 is permanent")
		}
		_, err = client.Get(ctx, name+":1")
		wantStatus(t, err, 404, "not_found")
	})

	t.Run("the token is required", func(t *testing.T) {
		_, err := NewClient(url, "").Own(ctx, []string{"x"}, OwnOptions{WorkerID: "w"})
		wantStatus(t, err, 401, "unauthorized")
	})

	t.Run("own takes the best first, extend, then succeed", func(t *testing.T) {
		name := fresh("own")
		for n, priority := range []int{0, 5, 0} {
			must2(t)(client.Publish(ctx, fmt.Sprintf("%s:%d", name, n), name, nil, &PublishOptions{Options: map[string]any{"priority": priority}}))
		}
		leases := own(t, name, OwnOptions{MaxTasks: 2, Lease: 30 * time.Second})
		if got := strings.Join(keys(leases), ","); got != name+":1,"+name+":0" {
			t.Fatalf("owned %s", got)
		}
		extended := of(client.Extend(ctx, leases[0], time.Minute)).must(t)
		if extended.RunID != leases[0].RunID || !extended.ExpiresAt.After(*leases[0].ExpiresAt) {
			t.Fatalf("extended %+v", extended)
		}
		done := of(client.Succeed(ctx, leases[0], map[string]bool{"ok": true})).must(t)
		if done.State != "success" || string(done.Result) != `{"ok":true}` {
			t.Fatalf("state %s result %s", done.State, done.Result)
		}
		_, err := client.Succeed(ctx, leases[0], nil)
		if !errors.Is(err, ErrLeaseLost) || IsPermanent(err) {
			t.Fatalf("want ErrLeaseLost, got %v", err)
		}
		if released := of(client.Release(ctx, leases[1])).must(t); released.State != "pending" {
			t.Fatalf("released: %s", released.State)
		}
	})

	t.Run("a lease is fenced after its expiry", func(t *testing.T) {
		name := fresh("late")
		must2(t)(client.Publish(ctx, name+":1", name, nil, nil))
		lease := own(t, name, OwnOptions{Lease: 200 * time.Millisecond})[0]
		time.Sleep(500 * time.Millisecond)
		_, err := client.Succeed(ctx, lease, nil)
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("want ErrLeaseLost, got %v", err)
		}
		taken := own(t, name, OwnOptions{})[0]
		if taken.Key != lease.Key || taken.RunID == lease.RunID {
			t.Fatalf("taken %+v", taken)
		}
		if of(client.Succeed(ctx, taken, nil)).must(t).State != "success" {
			t.Fatal("not a success")
		}
	})

	t.Run("a failed attempt is retried and a release is no attempt", func(t *testing.T) {
		name := fresh("fail")
		key := name + ":1"
		options := map[string]any{"max_unexpected_retries": 1, "unexpected_retry_delay_ms": 0}
		must2(t)(client.Publish(ctx, key, name, nil, &PublishOptions{Options: options}))
		of(client.Release(ctx, own(t, name, OwnOptions{})[0])).must(t)
		for _, expected := range []string{"pending", "fail"} {
			failed := of(client.Fail(ctx, own(t, name, OwnOptions{})[0], errors.New("broken"))).must(t)
			if failed.State != expected {
				t.Fatalf("want %s, got %s", expected, failed.State)
			}
		}
		if len(own(t, name, OwnOptions{})) != 0 {
			t.Fatal("a failed task was owned")
		}
		var retried Task
		of(client.Do(ctx, http.MethodPost, "/tasks/"+key+"/retry", nil, &retried)).must(t)
		if retried.State != "pending" {
			t.Fatalf("retried: %s", retried.State)
		}
	})

	t.Run("a dependent waits for its dependency", func(t *testing.T) {
		name := fresh("deps")
		first, then := name+":first", name+":then"
		must2(t)(client.Publish(ctx, first, name, nil, nil))
		task, _ := must2(t)(client.Publish(ctx, then, name, nil, &PublishOptions{DependsOn: []string{first}}))
		if task.State != "blocked" {
			t.Fatalf("state %s", task.State)
		}
		leases := own(t, name, OwnOptions{MaxTasks: 5})
		if len(leases) != 1 || leases[0].Key != first {
			t.Fatalf("owned %v", keys(leases))
		}
		of(client.Succeed(ctx, leases[0], nil)).must(t)
		if state(t, then) != "pending" {
			t.Fatal("the dependent is not pending")
		}
	})

	t.Run("a paused name is not owned", func(t *testing.T) {
		name := fresh("paused")
		must2(t)(client.Publish(ctx, name+":1", name, nil, nil))
		of(client.Do(ctx, http.MethodPost, "/names/"+name+"/pause", map[string]string{"reason": "go"}, nil)).must(t)
		if len(own(t, name, OwnOptions{})) != 0 {
			t.Fatal("a paused name was owned")
		}
		of(client.Do(ctx, http.MethodPost, "/names/"+name+"/resume", nil, nil)).must(t)
		if len(own(t, name, OwnOptions{})) != 1 {
			t.Fatal("not owned after resume")
		}
	})

	t.Run("max_running holds across owners", func(t *testing.T) {
		name := fresh("limited")
		of(client.Do(ctx, http.MethodPut, "/limits/"+name, map[string]int{"max_running": 1}, nil)).must(t)
		defer client.Do(ctx, http.MethodDelete, "/limits/"+name, nil, nil)
		for n := 0; n < 3; n++ {
			must2(t)(client.Publish(ctx, fmt.Sprintf("%s:%d", name, n), name, nil, nil))
		}
		leases := own(t, name, OwnOptions{MaxTasks: 3})
		if len(leases) != 1 || len(own(t, name, OwnOptions{MaxTasks: 3, WorkerID: "other"})) != 0 {
			t.Fatal("more than one running")
		}
		of(client.Succeed(ctx, leases[0], nil)).must(t)
		if len(own(t, name, OwnOptions{MaxTasks: 3})) != 1 {
			t.Fatal("the freed slot was not taken")
		}
	})

	t.Run("wait returns the ended task or 408", func(t *testing.T) {
		name := fresh("wait")
		key := name + ":1"
		must2(t)(client.Publish(ctx, key, name, nil, nil))
		_, err := client.Wait(ctx, key, 100*time.Millisecond)
		wantStatus(t, err, 408, "timeout")
		of(client.Do(ctx, http.MethodPost, "/tasks/"+key+"/cancel", nil, nil)).must(t)
		if of(client.Wait(ctx, key, 5*time.Second)).must(t).State != "cancelled" {
			t.Fatal("not cancelled")
		}
	})

	t.Run("publish takes publish's parameters", func(t *testing.T) {
		name := fresh("params")
		later := of(first(client.Publish(ctx, name+":later", name, nil, &PublishOptions{Delay: time.Minute}))).must(t)
		if later.NotBefore == nil && later.Options["not_before"] == nil {
			t.Fatal("no start time")
		}
		must2(t)(client.Publish(ctx, name+":p", name, 1, nil))
		updated := of(first(client.Publish(ctx, name+":p", name, 2, &PublishOptions{UpdatePayload: true}))).must(t)
		if string(updated.Payload) != "2" {
			t.Fatalf("payload %s", updated.Payload)
		}
		got := keys(own(t, name, OwnOptions{MaxTasks: 5}))
		sort.Strings(got)
		if strings.Join(got, ",") != name+":p" {
			t.Fatalf("owned %v", got)
		}
	})

	t.Run("every time is UTC with Z", func(t *testing.T) {
		name := fresh("times")
		must2(t)(client.Publish(ctx, name+":1", name, nil, nil))
		var raw struct {
			Leases []map[string]any `json:"leases"`
		}
		of(client.Do(ctx, http.MethodPost, "/own", map[string]any{"names": []string{name}, "worker_id": "w"}, &raw)).must(t)
		encoded := of(json.Marshal(raw)).must(t)
		for _, field := range []string{"expires_at", "created_at", "ping_expire_at"} {
			if !strings.Contains(string(encoded), `"`+field+`":"`) {
				t.Fatalf("no %s in %s", field, encoded)
			}
		}
		if strings.Contains(string(encoded), "+00:00") {
			t.Fatalf("a time not in Z: %s", encoded)
		}
	})
}

func must2(t *testing.T) func(*Task, bool, error) (*Task, bool) {
	return func(task *Task, created bool, err error) (*Task, bool) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return task, created
	}
}

func first(task *Task, _ bool, err error) (*Task, error) { return task, err }
