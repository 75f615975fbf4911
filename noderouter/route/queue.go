package route

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
)

// ErrQueueFull is Wait's answer when the function already has its maximum
// of queued requests.
var ErrQueueFull = errors.New("the function's request queue is full")

// queue holds the requests of one function waiting for an instance below
// its concurrency limit, in arrival order. A released slot is handed to the
// head waiter directly, so a newcomer cannot take it first.
type queue struct {
	mu sync.Mutex
	ws []*waiter
	n  atomic.Int32 // len(ws), read without mu on the release path
}

// waiter is one queued request. ch carries at most one value per time the
// waiter was queued: an instance whose slot is now the waiter's, or nil to
// make it try again (the assignment changed, a slot was freed).
type waiter struct{ ch chan *Instance }

// push queues w, at the front when it was woken and queues again; a new
// waiter is refused when max are already queued.
func (q *queue) push(w *waiter, front bool, max int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if front {
		q.ws = slices.Insert(q.ws, 0, w)
	} else {
		if len(q.ws) >= max {
			return false
		}
		q.ws = append(q.ws, w)
	}
	q.n.Store(int32(len(q.ws)))
	return true
}

// remove takes w out of the queue and reports whether it was there; false
// means it was popped and a value is (or will be) in w.ch.
func (q *queue) remove(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := slices.Index(q.ws, w)
	if i < 0 {
		return false
	}
	q.ws = slices.Delete(q.ws, i, i+1)
	q.n.Store(int32(len(q.ws)))
	return true
}

// pop takes the head waiter, nil when none. q.mu must be held.
func (q *queue) pop() *waiter {
	if len(q.ws) == 0 {
		return nil
	}
	w := q.ws[0]
	q.ws[0] = nil
	q.ws = q.ws[1:]
	if len(q.ws) == 0 {
		q.ws = nil // let the backing array go
	}
	q.n.Store(int32(len(q.ws)))
	return w
}

// wakeAll makes every waiter try again: the assignment changed.
func (q *queue) wakeAll() {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	ws := q.ws
	q.ws = nil
	q.n.Store(0)
	q.mu.Unlock()
	for _, w := range ws {
		w.ch <- nil
	}
}

// Queued returns how many requests wait for an instance of the function.
func (e *Entry) Queued() int { return int(e.q.n.Load()) }

// Release gives back the slot a request held on in (taken by Acquire or
// handed over by Wait). When requests are queued and in is still in the
// current assignment below its limit, the slot goes to the head waiter
// as it is; otherwise in's in-flight count drops.
func (e *Entry) Release(in *Instance) {
	if e.q.n.Load() > 0 && e.handOff(in) {
		return
	}
	in.InFlight.Add(-1)
	// A waiter that queued after the check above may have found in full
	// before the decrement: wake the head to try again. (Both sides write
	// then read, so at least one sees the other.)
	if e.q.n.Load() > 0 {
		e.q.mu.Lock()
		w := e.q.pop()
		e.q.mu.Unlock()
		if w != nil {
			w.ch <- nil
		}
	}
}

func (e *Entry) handOff(in *Instance) bool {
	a := e.assignment.Load()
	if !a.has(in) {
		return false // withdrawn or evicted: new requests must not go there
	}
	if l := a.Config.ConcurrencyLimit; l > 0 && in.InFlight.Load() > int64(l) {
		return false // the limit was lowered: shed the slot
	}
	e.q.mu.Lock()
	w := e.q.pop()
	e.q.mu.Unlock()
	if w == nil {
		return false
	}
	w.ch <- in
	return true
}

// Wait queues the request until an instance of the function's current
// assignment has room below the concurrency limit, and returns it with a
// slot held (give it back with Release). It returns ErrQueueFull at once
// when max requests already wait, ctx's error when ctx ends first, and
// nil, nil when the assignment is gone or has no instances (the caller
// asks the control plane). Waiting costs no goroutine.
func (e *Entry) Wait(ctx context.Context, max int) (*Instance, error) {
	w := &waiter{ch: make(chan *Instance, 1)}
	// settle takes w out of the queue; if it was popped meanwhile, the value
	// sent to it is taken, and a handed slot given back.
	settle := func() {
		if !e.q.remove(w) {
			if in := <-w.ch; in != nil {
				e.Release(in)
			}
		}
	}
	for front := false; ; front = true {
		if !e.q.push(w, front, max) {
			return nil, ErrQueueFull
		}
		// Try after queueing, so a slot released in between is not missed.
		a := e.assignment.Load()
		if a == nil || len(a.Instances) == 0 {
			settle()
			return nil, nil
		}
		if in := a.Acquire(rand.Uint64(), a.Config.ConcurrencyLimit, nil); in != nil {
			settle()
			return in, nil
		}
		select {
		case in := <-w.ch:
			if in != nil {
				return in, nil
			}
		case <-ctx.Done():
			settle()
			return nil, ctx.Err()
		}
	}
}
