// Package mscheduler is a worker and publisher for mscheduler's HTTP API (mscheduler serve),
// on the standard library only.
//
// The words are the protocol's (docs/protocol.md): a worker owns tasks, extends each lease
// while it works, and ends it with Succeed, Fail or Release. Every write of a lease is fenced
// by its run_id: once the lease is gone (expired, taken over, the task cancelled or ended)
// it returns an error that matches ErrLeaseLost, and the worker must stop working on it.
//
//	client := mscheduler.NewClient("http://127.0.0.1:8700", os.Getenv("MSCHEDULER_HTTP_TOKEN"))
//	err := client.Work(ctx, []string{"email"}, func(ctx context.Context, task mscheduler.Task) (any, error) {
//		return send(ctx, task.Payload)
//	}, mscheduler.WorkOptions{Concurrency: 8})
package mscheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client calls one server. Its fields may be set before the first call.
type Client struct {
	// URL is the server's, e.g. http://127.0.0.1:8700 (the API is under /v1).
	URL string
	// Token is the server's --token, sent as Authorization: Bearer; empty: none.
	Token string
	// HTTP sends the requests; an own that waits holds its request that long.
	HTTP *http.Client
}

// NewClient is a client of the server at baseURL, with its token ("" for none).
func NewClient(baseURL, token string) *Client {
	return &Client{URL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: &http.Client{}}
}

// Task is a task as the API returns it: the task document's fields (docs/protocol.md),
// times in UTC. Payload and Result are JSON as stored; a BSON value beyond JSON is relaxed
// extended JSON ({"$date": ...}).
type Task struct {
	Key          string          `json:"key"`
	Name         string          `json:"name"`
	State        string          `json:"state"`
	Payload      json.RawMessage `json:"payload"`
	Result       json.RawMessage `json:"result"`
	Error        *TaskError      `json:"error"`
	Options      map[string]any  `json:"options"`
	DependsOn    []string        `json:"depends_on"`
	DepsPending  []string        `json:"deps_pending"`
	WorkerStates []WorkerState   `json:"worker_states"`
	NotBefore    *time.Time      `json:"not_before"`
	NextClaimAt  *time.Time      `json:"next_claim_at"`
	CreatedAt    time.Time       `json:"created_at"`
	UpdatedAt    time.Time       `json:"updated_at"`
	FinishedAt   *time.Time      `json:"finished_at"`
	Runs         int             `json:"runs"`
	Version      int64           `json:"version"`
}

// WorkerState is one attempt of a task: running, success, fail, timeout or released.
type WorkerState struct {
	WorkerID     string          `json:"worker_id"`
	RunID        string          `json:"run_id"`
	State        string          `json:"state"`
	StartedAt    *time.Time      `json:"started_at"`
	PingExpireAt *time.Time      `json:"ping_expire_at"`
	FinishedAt   *time.Time      `json:"finished_at"`
	Error        *TaskError      `json:"error"`
	Result       json.RawMessage `json:"result"`
}

// TaskError is a failed attempt's error.
type TaskError struct {
	Type      string `json:"type"`
	Message   string `json:"message"`
	Traceback string `json:"traceback"`
}

// Lease is an owned task: the three fields that fence its writes, when it ends unless
// extended, and the task.
type Lease struct {
	Key       string     `json:"key"`
	WorkerID  string     `json:"worker_id"`
	RunID     string     `json:"run_id"`
	ExpiresAt *time.Time `json:"expires_at"`
	Task      Task       `json:"task"`
}

// APIError is an error the server answered with: Status is the HTTP status, Code the
// protocol's error code (invalid, unauthorized, not_found, no_route, lease_lost, timeout,
// unavailable, ...), Message its one line.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("mscheduler: %d %s: %s", e.Status, e.Code, e.Message)
}

// Is makes errors.Is(err, ErrLeaseLost) and errors.Is(err, ErrNotFound) true of the
// server's lease_lost and not_found answers.
func (e *APIError) Is(target error) bool {
	return (target == ErrLeaseLost && e.Code == "lease_lost") ||
		(target == ErrNotFound && e.Code == "not_found")
}

var (
	// ErrLeaseLost: the lease is gone (expired, taken over, the task cancelled or ended);
	// nothing more is written for that run.
	ErrLeaseLost = errors.New("mscheduler: lease lost")
	// ErrNotFound: no task has the key.
	ErrNotFound = errors.New("mscheduler: no such task")
)

// IsPermanent tells an error that retrying cannot mend: the server refused the token (401),
// the Origin (403) or the Host (400), has no such route (404 other than a task not found:
// a wrong URL), or refused the body (422). Anything else (no answer, 5xx, 408, 429) may pass.
func IsPermanent(err error) bool {
	var api *APIError
	if !errors.As(err, &api) {
		return false
	}
	switch api.Status {
	case 400, 401, 403, 422:
		return true
	case 404:
		return api.Code != "not_found"
	}
	return false
}

// Do sends one request of the API (path under /v1, e.g. "/stats"; body nil for none) and
// decodes the answer into out (nil: ignored). Every route is reachable this way; the methods
// below are the worker's and the publisher's.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) (int, error) {
	var reader io.Reader
	if body != nil {
		encoded, err := json.Marshal(body)
		if err != nil {
			return 0, fmt.Errorf("mscheduler: %s %s: the body: %w", method, path, err)
		}
		reader = bytes.NewReader(encoded)
	}
	request, err := http.NewRequestWithContext(ctx, method, c.URL+"/v1"+path, reader)
	if err != nil {
		return 0, err
	}
	request.Header.Set("Accept", "application/json")
	if body != nil {
		request.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		request.Header.Set("Authorization", "Bearer "+c.Token)
	}
	sender := c.HTTP
	if sender == nil {
		sender = http.DefaultClient
	}
	reply, err := sender.Do(request)
	if err != nil {
		return 0, err
	}
	defer reply.Body.Close()
	data, err := io.ReadAll(reply.Body)
	if err != nil {
		return reply.StatusCode, err
	}
	if reply.StatusCode >= 400 {
		var answer struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		if json.Unmarshal(data, &answer) != nil || answer.Error == "" {
			// Our errors are JSON; a proxy's or another server's page is not.
			page := strings.TrimSpace(string(data))
			if len(page) > 200 {
				page = page[:200]
			}
			answer.Error, answer.Message = "http_error", fmt.Sprintf("HTTP %d: %s", reply.StatusCode, page)
		}
		return reply.StatusCode, &APIError{reply.StatusCode, answer.Error, answer.Message}
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return reply.StatusCode, fmt.Errorf("mscheduler: %s %s: the answer: %w", method, path, err)
		}
	}
	return reply.StatusCode, nil
}

func milliseconds(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	ms := d.Milliseconds()
	if ms == 0 {
		ms = 1
	}
	return &ms
}

// PublishOptions are publish's parameters beyond the key, name and payload.
type PublishOptions struct {
	// Options: the task's options (priority, max_unexpected_retries, ...: docs/protocol.md).
	Options map[string]any
	// DependsOn: keys this task waits for; AllowMissing: a missing one counts as met.
	DependsOn    []string
	AllowMissing bool
	// Delay: not claimable before this long from now. Debounce: the same, and a publish of
	// the key again before it started gives it the new payload and pushes its start back.
	Delay, Debounce time.Duration
	// UpdatePayload: an existing task not running gets the new payload. ReplaceFinished: a
	// finished task is published anew.
	UpdatePayload, ReplaceFinished bool
}

// Publish publishes a task, idempotently by key: created is false when a task had the key
// (returned unchanged, unless opts says otherwise). payload is marshalled as JSON.
func (c *Client) Publish(ctx context.Context, key, name string, payload any, opts *PublishOptions) (task *Task, created bool, err error) {
	if opts == nil {
		opts = &PublishOptions{}
	}
	body := map[string]any{"key": key, "name": name, "payload": payload}
	if opts.Options != nil {
		body["options"] = opts.Options
	}
	if opts.DependsOn != nil {
		body["depends_on"] = opts.DependsOn
	}
	for field, value := range map[string]*int64{"delay_ms": milliseconds(opts.Delay), "debounce_ms": milliseconds(opts.Debounce)} {
		if value != nil {
			body[field] = *value
		}
	}
	for field, value := range map[string]bool{"allow_missing": opts.AllowMissing, "update_payload": opts.UpdatePayload, "replace_finished": opts.ReplaceFinished} {
		if value {
			body[field] = true
		}
	}
	task = &Task{}
	status, err := c.Do(ctx, http.MethodPost, "/tasks", body, task)
	if err != nil {
		return nil, false, err
	}
	return task, status == http.StatusCreated, nil
}

// Get is the task of key; an error matching ErrNotFound if there is none.
func (c *Client) Get(ctx context.Context, key string) (*Task, error) {
	task := &Task{}
	if _, err := c.Do(ctx, http.MethodGet, "/tasks/"+url.PathEscape(key), nil, task); err != nil {
		return nil, err
	}
	return task, nil
}

// Wait is the task once it has ended (success, fail or cancelled); an APIError of status 408
// (code timeout) if it has not within timeout (at most 5 minutes; 0: 30 s).
func (c *Client) Wait(ctx context.Context, key string, timeout time.Duration) (*Task, error) {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	path := fmt.Sprintf("/tasks/%s/wait?timeout_ms=%d", url.PathEscape(key), timeout.Milliseconds())
	task := &Task{}
	if _, err := c.Do(ctx, http.MethodGet, path, nil, task); err != nil {
		return nil, err
	}
	return task, nil
}

// OwnOptions: who owns, how many, for how long, and how long to wait for one.
type OwnOptions struct {
	WorkerID string
	// MaxTasks: at most this many (0: 1).
	MaxTasks int
	// Lease: each lease's length (0: the task's worker_timeout_ms).
	Lease time.Duration
	// Wait: when none is claimable, wait up to this long for one (at most 5 minutes).
	Wait time.Duration
}

// Own owns up to opts.MaxTasks tasks of names, best first (none: an empty slice).
func (c *Client) Own(ctx context.Context, names []string, opts OwnOptions) ([]Lease, error) {
	maxTasks := opts.MaxTasks
	if maxTasks <= 0 {
		maxTasks = 1
	}
	body := map[string]any{"names": names, "worker_id": opts.WorkerID, "max_tasks": maxTasks}
	if ms := milliseconds(opts.Lease); ms != nil {
		body["lease_ms"] = *ms
	}
	if ms := milliseconds(opts.Wait); ms != nil {
		body["wait_ms"] = *ms
	}
	var answer struct {
		Leases []Lease `json:"leases"`
	}
	if _, err := c.Do(ctx, http.MethodPost, "/own", body, &answer); err != nil {
		return nil, err
	}
	return answer.Leases, nil
}

func fence(lease Lease) map[string]any {
	return map[string]any{"key": lease.Key, "worker_id": lease.WorkerID, "run_id": lease.RunID}
}

// Extend extends the lease to length from now (0: the task's worker_timeout_ms).
func (c *Client) Extend(ctx context.Context, lease Lease, length time.Duration) (Lease, error) {
	body := fence(lease)
	if ms := milliseconds(length); ms != nil {
		body["lease_ms"] = *ms
	}
	var extended Lease
	_, err := c.Do(ctx, http.MethodPost, "/leases/extend", body, &extended)
	return extended, err
}

// Succeed ends the attempt with result (marshalled as JSON) and returns the task.
func (c *Client) Succeed(ctx context.Context, lease Lease, result any) (*Task, error) {
	body := fence(lease)
	body["result"] = result
	return c.finish(ctx, "/leases/succeed", body)
}

// Fail ends the attempt as failed, with cause's text: the task is retried by its rules.
func (c *Client) Fail(ctx context.Context, lease Lease, cause error) (*Task, error) {
	body := fence(lease)
	text := "failed"
	if cause != nil && cause.Error() != "" {
		text = cause.Error()
	}
	body["error"] = text
	return c.finish(ctx, "/leases/fail", body)
}

// Release hands the task back unrun: claimable at once, no attempt counted.
func (c *Client) Release(ctx context.Context, lease Lease) (*Task, error) {
	return c.finish(ctx, "/leases/release", fence(lease))
}

func (c *Client) finish(ctx context.Context, path string, body map[string]any) (*Task, error) {
	task := &Task{}
	if _, err := c.Do(ctx, http.MethodPost, path, body, task); err != nil {
		return nil, err
	}
	return task, nil
}
