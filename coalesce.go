package ratelimit

import (
	"context"
	"sync"
	"time"
)

// coalescer sends the concurrent Redis calls of this process together.
// Whoever finds fewer than maxCalls calls in flight makes a call at once, in
// its own goroutine, of its item and of what waits; whoever finds them all
// busy waits, and is either answered by a later call or handed the lead of
// the next one by the caller before it. A lone request thus costs no
// goroutine hand-off, and under load the items waiting on a round trip go
// in one call of admit.lua (scriptBatch): it charges the tokens of finished
// responses, summed per key, then decides the admissions in arrival order,
// each all-or-nothing as if sent alone. A limit that several requests share
// (their org, say) is then read, decided and charged once per call. A token
// charge rides in the next call that admits, and takes a call of its own
// only when none comes within a millisecond.
//
// A call keeps the single request's guarantees: its admissions are replayed
// once on a dead connection (its token charges never are), and when a call
// fails, every item in it gets the error (for an admission, on_redis_error
// applies to each).
type coalescer[T any] struct {
	start    func(first T) batch[T]
	maxCalls int           // calls in flight at once
	linger   time.Duration // how long a rider waits for a call to ride in

	mu      sync.Mutex // guards what follows, and every ticket's state
	calls   int
	waiting []*ticket[T]
	riders  []T         // items that go in the next call, whoever makes it
	flush   *time.Timer // makes a call for riders that none took within the linger
	armed   bool        // flush is set to fire
}

// maxBatch bounds the items of one call.
const maxBatch = 64

// batch is a call being built from waiting items.
type batch[T any] interface {
	// add joins an item to the call, or reports that it cannot join (it
	// then waits for the next call).
	add(T) bool
	// send makes the call and answers each item.
	send()
}

// ticket is an item's place in the coalescer.
type ticket[T any] struct {
	item  T
	state ticketState
	lead  chan struct{} // buffered: the holder makes the next call
}

type ticketState uint8

const (
	waiting   ticketState = iota
	batched               // in a call, which answers it
	leading               // handed the next call
	abandoned             // its caller gave up before either
)

func newCoalescer[T any](maxCalls int, linger time.Duration, start func(first T) batch[T]) *coalescer[T] {
	return &coalescer[T]{start: start, maxCalls: maxCalls, linger: linger}
}

// await makes or joins a call for item and returns the item's answer, which
// the call sends on answer, or an error if ctx is done, or timeout passes,
// before the item is in a call. Only a caller that waits starts a timer: one
// that makes the call at once is bounded by the call's own timeout. A caller
// handed the lead just as it gave up still makes the call, in the background:
// the items behind it wait for it.
func await[T, R any](ctx context.Context, q *coalescer[T], item T, answer <-chan R, timeout time.Duration) (R, error) {
	var none R
	q.mu.Lock()
	if q.calls < q.maxCalls {
		q.calls++
		q.mu.Unlock()
		q.lead(item)
		return <-answer, nil
	}
	t := &ticket[T]{item: item, lead: make(chan struct{}, 1)}
	q.waiting = append(q.waiting, t)
	q.mu.Unlock()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	err := context.DeadlineExceeded
	select {
	case r := <-answer:
		return r, nil
	case <-t.lead:
		q.lead(item)
		return <-answer, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
	}
	q.mu.Lock()
	state := t.state
	if state == waiting {
		t.state = abandoned
	}
	q.mu.Unlock()
	if state == leading {
		go q.lead(item)
	}
	return none, err
}

// lead makes one call of first and of what waits and can join it, then hands
// the next call to the first item still waiting, if any.
func (q *coalescer[T]) lead(first T) {
	b := q.start(first)
	q.mu.Lock()
	n := 1
	kept := q.riders[:0]
	for _, item := range q.riders {
		if n < maxBatch && b.add(item) {
			n++
		} else {
			kept = append(kept, item)
		}
	}
	clear(q.riders[len(kept):])
	q.riders = kept
	q.armFlush()
	// The call takes what waits in arrival order, up to the first item that
	// cannot join it: that one leads the next.
	i := 0
	for ; i < len(q.waiting) && n < maxBatch; i++ {
		t := q.waiting[i]
		if t.state == abandoned {
			continue
		}
		if !b.add(t.item) {
			break
		}
		t.state = batched
		n++
	}
	rest := copy(q.waiting, q.waiting[i:])
	clear(q.waiting[rest:])
	q.waiting = q.waiting[:rest]
	q.mu.Unlock()
	b.send()
	q.mu.Lock()
	for len(q.waiting) > 0 {
		next := q.waiting[0]
		q.waiting = q.waiting[1:]
		if next.state == waiting {
			next.state = leading
			q.mu.Unlock()
			next.lead <- struct{}{}
			return
		}
	}
	q.calls--
	q.mu.Unlock()
}

// ride puts item in the next call, whoever makes it: an item nobody waits
// for (a token charge) takes no call of its own while calls come. If none
// comes within the linger, one is made for the riders in the background.
func (q *coalescer[T]) ride(item T) {
	q.mu.Lock()
	q.riders = append(q.riders, item)
	q.armFlush()
	q.mu.Unlock()
}

// armFlush sets the flush to fire within the linger if riders wait and it is
// not set already. q.mu is held.
func (q *coalescer[T]) armFlush() {
	if len(q.riders) == 0 || q.armed {
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
// call is in flight: their ends are looked at again after the linger.
func (q *coalescer[T]) flushRiders() {
	q.mu.Lock()
	q.armed = false
	if len(q.riders) == 0 || q.calls >= q.maxCalls {
		q.armFlush()
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

// scriptItem is one request's part of a call of admit.lua: its admission, or
// the token charge of its finished response (tokens > 0).
type scriptItem struct {
	chain    []limit
	tokens   int64
	atMillis int64
	answer   chan scriptAnswer // an admission's; buffered: a call never waits on it
	charged  func(error)       // a charge's
}

// scriptAnswer is an admission's decision, or a charge's outcome.
type scriptAnswer struct {
	d   decision
	err error
}

// scriptBatch is one call of admit.lua. An item with another pinned clock,
// or an admission whose counters are in the call under other caps, waits for
// the next call.
type scriptBatch struct {
	store *redisStore
	call  scriptCall
	items []*scriptItem
}

func (b *scriptBatch) add(item *scriptItem) bool {
	if len(b.items) > 0 && item.atMillis != b.items[0].atMillis {
		return false
	}
	if item.tokens > 0 {
		b.call.charges.add(item.chain, item.tokens)
	} else if !b.call.add(item.chain) {
		return false
	}
	b.items = append(b.items, item)
	return true
}

func (b *scriptBatch) send() {
	ds, charged, err := b.store.call(context.Background(), &b.call, b.items[0].atMillis, false)
	k := 0
	for _, item := range b.items {
		switch {
		case item.tokens > 0:
			item.charged(charged)
		case err != nil:
			item.answer <- scriptAnswer{err: err}
		default:
			item.answer <- scriptAnswer{d: ds[k]}
			k++
		}
	}
}

// admitCoalesced waits for the admission's decision: at most the store's
// timeout in all while others make the calls, and one call (which the
// timeout bounds) more when it is handed one. An admission that gives up
// waiting may still be decided, and charged, by its call: that errs towards
// stricter, as a lost reply does.
func (s *redisStore) admitCoalesced(ctx context.Context, chain []limit, atMillis int64) (decision, error) {
	item := &scriptItem{chain: chain, atMillis: atMillis, answer: make(chan scriptAnswer, 1)}
	a, err := await(ctx, s.calls, item, item.answer, s.timeout)
	if err != nil {
		return decision{}, err
	}
	return a.d, a.err
}
