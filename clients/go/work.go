package mscheduler

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net/http/httptrace"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Handler runs one task. Its result is stored as the task's result (marshalled as JSON); an
// error (or a panic) fails the attempt, which is retried by the task's rules. ctx is
// cancelled when the lease is lost or Work stops on a permanent error: stop then, as nothing
// the handler returns will be written.
type Handler func(ctx context.Context, task Task) (result any, err error)

// WorkOptions: how Work owns and runs tasks. Zero values take the defaults.
type WorkOptions struct {
	// Concurrency: handlers at once (default 4).
	Concurrency int
	// Lease: each lease's length, extended every third of it while the handler runs
	// (default 30 s).
	Lease time.Duration
	// WorkerID: default go-<pid>-<random>.
	WorkerID string
	// Wait: how long one own waits for a task (default 5 s).
	Wait time.Duration
	// OnError is told of each transient error (the server unreachable, starting or
	// failing) as it happens; lease is the run it hit, nil for an own. The request is tried
	// again after a growing wait.
	OnError func(err error, lease *Lease)
}

// Work owns tasks of names and runs handler on each, up to opts.Concurrency at once,
// extending each lease while its handler runs and writing the outcome.
//
// It returns nil once ctx is cancelled and the running handlers have finished and their
// outcomes are written (a graceful stop: ctx is not passed to the handlers). It returns the
// error when the server answers with one that retrying cannot mend (IsPermanent: a wrong
// token, Origin, route or body), after cancelling the running handlers' contexts, waiting
// for them and releasing their tasks. Any other error is given to opts.OnError and the
// request tried again. A request about a lease (an extension, an outcome) is abandoned
// after opts.Lease without an answer.
func (c *Client) Work(ctx context.Context, names []string, handler Handler, opts WorkOptions) error {
	if opts.Concurrency <= 0 {
		opts.Concurrency = 4
	}
	if opts.Lease <= 0 {
		opts.Lease = 30 * time.Second
	}
	if opts.Wait <= 0 {
		opts.Wait = 5 * time.Second
	}
	if opts.WorkerID == "" {
		opts.WorkerID = fmt.Sprintf("go-%d-%06x", os.Getpid(), rand.Intn(1<<24))
	}
	stopping, stop := context.WithCancel(ctx)
	defer stop()
	broken, breakAll := context.WithCancel(context.Background()) // the handlers' parent
	defer breakAll()
	w := &worker{client: c, opts: opts, handler: handler, broken: broken}
	w.stopWith = func(err error) {
		w.mu.Lock()
		if w.permanent == nil {
			w.permanent = err
		}
		w.mu.Unlock()
		breakAll()
		stop()
	}

	slots := make(chan struct{}, opts.Concurrency) // one per running handler
	var running sync.WaitGroup
	failures := 0
	for stopping.Err() == nil {
		select { // at least one slot free before asking
		case slots <- struct{}{}:
		case <-stopping.Done():
			continue
		}
		free := 1
		for free < opts.Concurrency && len(slots) < cap(slots) {
			slots <- struct{}{}
			free++
		}
		leases, err := w.own(stopping, names, OwnOptions{
			WorkerID: opts.WorkerID, MaxTasks: free, Lease: opts.Lease, Wait: opts.Wait,
		})
		for unused := len(leases); unused < free; unused++ {
			<-slots
		}
		if err != nil {
			if stopping.Err() != nil {
				break
			}
			if IsPermanent(err) {
				w.stopWith(err)
				break
			}
			failures++
			w.report(err, nil)
			sleep(stopping, backoff(failures))
			continue
		}
		failures = 0
		for _, lease := range leases {
			running.Add(1)
			go func(lease Lease) {
				defer running.Done()
				defer func() { <-slots }()
				w.run(lease)
			}(lease)
		}
	}
	running.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.permanent
}

// worker is what one Work shares with its runs.
type worker struct {
	client    *Client
	opts      WorkOptions
	handler   Handler
	broken    context.Context // cancelled on a permanent error
	stopWith  func(error)
	mu        sync.Mutex
	permanent error
}

func (w *worker) report(err error, lease *Lease) {
	if w.opts.OnError != nil {
		w.opts.OnError(err, lease)
	}
}

// own is one own of Work's loop. A stop cancels it only while no answer has begun to
// arrive: the server releases what a request it sees closed had won, but an answer it has
// begun to send is the only record of its leases, so that one is read to its end (and its
// leases run, as a graceful stop lets running handlers finish).
func (w *worker) own(stopping context.Context, names []string, opts OwnOptions) ([]Lease, error) {
	var answering atomic.Bool
	trace := &httptrace.ClientTrace{GotFirstResponseByte: func() { answering.Store(true) }}
	asking, cancel := context.WithCancel(httptrace.WithClientTrace(context.Background(), trace))
	defer cancel()
	asked := make(chan struct{})
	defer close(asked) // before cancel: the watcher below has ended by then
	go func() {
		select {
		case <-stopping.Done():
			if !answering.Load() {
				cancel()
			}
		case <-asked:
		}
	}()
	return w.client.Own(asking, names, opts)
}

// run is one lease's run: the handler, the lease kept alive meanwhile, the outcome.
func (w *worker) run(lease Lease) {
	handlerCtx, lose := context.WithCancel(w.broken)
	defer lose()
	var mu sync.Mutex
	current := lease
	var lost atomic.Bool
	keeping := make(chan struct{})
	kept := make(chan struct{})
	go func() { // extends the lease every third of its length until the handler returns
		defer close(kept)
		ticker := time.NewTicker(maxDuration(w.opts.Lease/3, 10*time.Millisecond))
		defer ticker.Stop()
		for {
			select {
			case <-keeping:
				return
			case <-ticker.C:
			}
			mu.Lock()
			was := current
			mu.Unlock()
			asking, done := w.bounded(w.broken)
			extended, err := w.client.Extend(asking, was, w.opts.Lease)
			done()
			switch {
			case err == nil:
				mu.Lock()
				current = extended
				mu.Unlock()
			case errors.Is(err, ErrLeaseLost):
				lost.Store(true)
				lose()
				return
			case IsPermanent(err):
				w.stopWith(err)
				return
			case w.broken.Err() == nil:
				w.report(err, &lease) // tried again at the next tick
			}
		}
	}()
	result, failure := w.call(handlerCtx, lease.Task)
	close(keeping)
	<-kept
	if lost.Load() {
		return
	}
	if w.broken.Err() != nil {
		// Work stops on a permanent error and cancelled the handler: the task goes back
		// unrun now, as a stopped Python worker's does, instead of waiting out its lease,
		// whose expiry would count an attempt (and could fail the task for good). A server
		// that refuses this too (the token it stopped on) leaves it to expire.
		mu.Lock()
		final := current
		mu.Unlock()
		releasing, done := w.bounded(context.Background())
		defer done()
		_, _ = w.client.Release(releasing, final)
		return
	}
	mu.Lock()
	final := current
	mu.Unlock()
	var err error
	if failure != nil {
		err = w.write(final, func(ctx context.Context) error { _, err := w.client.Fail(ctx, final, failure); return err })
	} else {
		err = w.write(final, func(ctx context.Context) error { _, err := w.client.Succeed(ctx, final, result); return err })
		var api *APIError
		if errors.As(err, &api) && api.Status == 422 {
			// The result was refused (too large, not storable): the attempt fails, as it
			// would in a Python worker, with the server's reason.
			err = w.write(final, func(ctx context.Context) error { _, err := w.client.Fail(ctx, final, api); return err })
		}
	}
	switch {
	case err == nil, errors.Is(err, ErrLeaseLost), w.broken.Err() != nil:
	case IsPermanent(err):
		w.stopWith(err)
	default:
		w.report(err, &lease)
	}
}

// call runs the handler; a panic is its failure.
func (w *worker) call(ctx context.Context, task Task) (result any, err error) {
	defer func() {
		if caught := recover(); caught != nil {
			err = fmt.Errorf("panic: %v", caught)
		}
	}()
	return w.handler(ctx, task)
}

// bounded is parent with a deadline one lease long: a request of a run (an extension, an
// outcome) that the server has not answered by then is abandoned, as the lease it is about
// has expired meanwhile; without it a server that takes requests and goes silent would hold
// the run, and a stopping Work, for ever.
func (w *worker) bounded(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, w.opts.Lease)
}

// write sends an outcome, again after a transient error (reported each time), until the
// lease has expired, when the server would refuse it anyway.
func (w *worker) write(lease Lease, send func(context.Context) error) error {
	for failures := 1; ; failures++ {
		sending, done := w.bounded(w.broken)
		err := send(sending)
		done()
		var api *APIError
		if err == nil || (errors.As(err, &api) && api.Status < 500) || w.broken.Err() != nil {
			return err
		}
		if lease.ExpiresAt == nil || !time.Now().Before(*lease.ExpiresAt) {
			return err
		}
		w.report(err, &lease)
		sleep(w.broken, minDuration(backoff(failures), time.Until(*lease.ExpiresAt)))
	}
}

// backoff is the wait after the nth failure in a row: doubling from 100 ms to 5 s, jittered.
func backoff(failures int) time.Duration {
	if failures > 7 {
		failures = 7
	}
	wait := minDuration(5*time.Second, 100*time.Millisecond<<(failures-1))
	return time.Duration(float64(wait) * (0.5 + rand.Float64()/2))
}

func sleep(ctx context.Context, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}

func minDuration(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

func maxDuration(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}
