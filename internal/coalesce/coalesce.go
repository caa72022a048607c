// Package coalesce sends concurrent calls of a process together: items that
// wait while a call is in flight go in the next call, and items nobody waits
// for ride in whichever call comes next.
package coalesce

import (
	"context"
	"runtime"
	"sync"
	"time"
)

// Coalescer sends the concurrent calls of this process together. Whoever
// finds fewer than maxCalls calls in flight makes a call at once, in its own
// goroutine, of its item and of what waits; whoever finds them all busy
// waits to be answered by a later call. Those later calls are made, one
// after another while items wait, by a goroutine that the caller before them
// starts, so that no caller waits on more than its own item's call. A lone
// item thus costs no goroutine hand-off, and under load the items waiting on
// a round trip go in one call, in arrival order. An item nobody waits for
// rides in the next call, and takes a call of its own only when none comes
// within the linger of the moment a call could be made for it: while every
// call is in flight, the end of one either makes the next, which takes it,
// or starts the linger.
//
// A call is one Batch: what it does with its items, and what it answers
// each, is the Batch's.
type Coalescer[T any] struct {
	start    func(first T) Batch[T]
	maxCalls int           // calls in flight at once
	linger   time.Duration // how long a rider waits for a call to ride in

	mu      sync.Mutex // guards what follows, and every ticket's state
	calls   int
	waiting []*ticket[T]
	riders  []T         // items that go in the next call, whoever makes it
	flush   *time.Timer // makes a call for riders that none took within the linger
	armed   bool        // flush is set to fire: riders wait, and a call could be made
}

// maxBatch bounds the items of one call.
const maxBatch = 64

// Batch is a call being built from waiting items.
type Batch[T any] interface {
	// Add joins an item to the call, or reports that it cannot join (it
	// then waits for the next call).
	Add(T) bool
	// Send makes the call and answers each item.
	Send()
}

// ticket is an item's place in the coalescer.
type ticket[T any] struct {
	item  T
	state ticketState
}

type ticketState uint8

const (
	waiting   ticketState = iota
	batched               // in a call, which answers it
	abandoned             // its caller gave up before a call took it
)

// New is a Coalescer that keeps maxCalls calls in flight at once, lets an
// item that rides wait at most linger for a call, and starts each call with
// start.
func New[T any](maxCalls int, linger time.Duration, start func(first T) Batch[T]) *Coalescer[T] {
	return &Coalescer[T]{start: start, maxCalls: maxCalls, linger: linger}
}

// Await makes or joins a call for item and returns the item's answer, which
// the call sends on answer, or an error once ctx is done or timeout has
// passed, whether the item is still waiting or in a call in flight (which
// may then still decide it, for no one). Only a caller that waits starts a
// timer: one that makes the call at once is bounded by the call's own
// timeout, and leaves the calls of the items behind it to a goroutine.
func Await[T, R any](ctx context.Context, q *Coalescer[T], item T, answer <-chan R, timeout time.Duration) (R, error) {
	var none R
	q.mu.Lock()
	if q.calls < q.maxCalls {
		q.calls++
		q.mu.Unlock()
		if next, ok := q.call(item); ok {
			go q.lead(next)
		}
		return <-answer, nil
	}
	t := &ticket[T]{item: item}
	q.waiting = append(q.waiting, t)
	q.mu.Unlock()
	timer := startTimer(timeout)
	defer stopTimer(timer)
	err := context.DeadlineExceeded
	select {
	case r := <-answer:
		return r, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
	}
	q.mu.Lock()
	if t.state == waiting {
		t.state = abandoned
	}
	q.mu.Unlock()
	return none, err
}

// timers are the stopped timers of waits that ended: most calls wait, and
// a timer and its channel are two allocations. A timer that fired unread
// is drained before it is put back: a program built with a go.mod before
// Go 1.23, or with GODEBUG asynctimerchan=1, keeps the stale time in the
// channel, which would end the next wait at once.
var timers sync.Pool

func startTimer(d time.Duration) *time.Timer {
	if t, ok := timers.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

func stopTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	timers.Put(t)
}

// lead makes calls while items wait: the first of first and what waits with
// it, then each of the first item still waiting and what waits with that.
func (q *Coalescer[T]) lead(first T) {
	for {
		next, ok := q.call(first)
		if !ok {
			return
		}
		first = next
		// The callers the call answered run first, and the items that
		// arrive meanwhile join the next call: without the yield, the
		// next call would leave at once with what the round trip
		// gathered, and under load calls would carry a third fewer
		// items (bench/README.md).
		runtime.Gosched()
	}
}

// call makes one call of first and of what waits and can join it. Then it
// takes the first item still waiting, for the next call, and returns it;
// with none waiting, the call slot is free again.
func (q *Coalescer[T]) call(first T) (next T, ok bool) {
	b := q.start(first)
	q.mu.Lock()
	n := 1
	kept := q.riders[:0]
	for _, item := range q.riders {
		if n < maxBatch && b.Add(item) {
			n++
		} else {
			kept = append(kept, item)
		}
	}
	clear(q.riders[len(kept):])
	q.riders = kept
	if len(kept) == 0 && q.armed {
		// Nothing is left for the flush to send: a timer that fired for
		// nothing would cost a goroutine, under load at every call.
		q.armed = false
		q.flush.Stop()
	}
	// The call takes what waits in arrival order, up to the first item that
	// cannot join it: that one is first in the next.
	i := 0
	for ; i < len(q.waiting) && n < maxBatch; i++ {
		t := q.waiting[i]
		if t.state == abandoned {
			continue
		}
		if !b.Add(t.item) {
			break
		}
		t.state = batched
		n++
	}
	rest := copy(q.waiting, q.waiting[i:])
	clear(q.waiting[rest:])
	q.waiting = q.waiting[:rest]
	q.mu.Unlock()
	b.Send()
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.waiting) > 0 {
		t := q.waiting[0]
		q.waiting = q.waiting[1:]
		if t.state == waiting {
			t.state = batched
			return t.item, true
		}
	}
	q.calls--
	q.armFlush() // for the riders this call had no room for, or that came meanwhile
	return next, false
}

// Ride puts item in the next call, whoever makes it: an item nobody waits
// for (a token charge) takes no call of its own while calls come. If none
// comes within the linger, one is made for the riders in the background.
func (q *Coalescer[T]) Ride(item T) {
	q.mu.Lock()
	q.riders = append(q.riders, item)
	q.armFlush()
	q.mu.Unlock()
}

// armFlush sets the flush to fire within the linger if riders wait, a call
// could be made for them, and it is not set already: while every call is in
// flight, the end of one arms it. q.mu is held.
func (q *Coalescer[T]) armFlush() {
	if len(q.riders) == 0 || q.armed || q.calls >= q.maxCalls {
		return
	}
	q.armed = true
	if q.flush == nil {
		q.flush = time.AfterFunc(q.linger, q.flushRiders)
	} else {
		q.flush.Reset(q.linger)
	}
}

// flushRiders makes a call for the riders that no call took, unless every
// call is in flight: the end of one then takes them or arms the flush again.
func (q *Coalescer[T]) flushRiders() {
	q.mu.Lock()
	q.armed = false
	if len(q.riders) == 0 || q.calls >= q.maxCalls {
		q.mu.Unlock()
		return
	}
	q.calls++
	first := q.riders[0]
	rest := copy(q.riders, q.riders[1:])
	clear(q.riders[rest:])
	q.riders = q.riders[:rest]
	q.mu.Unlock()
	q.lead(first)
}
