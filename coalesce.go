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
// in one call: admissions are decided by one call of admit.lua in arrival
// order, each all-or-nothing as if sent alone (admissionBatch); token charges
// are summed per key (chargeBatch). A limit that several requests share
// (their org, say) is then read, decided and charged once per call.
//
// A call keeps the single request's guarantees: an admission call is
// replayed once on a dead connection, and when a call fails, every item in it
// gets the error (for an admission, on_redis_error applies to each).
type coalescer[T any] struct {
	start    func(first T) batch[T]
	maxCalls int           // calls in flight at once
	linger   time.Duration // how long a call waits for more items; 0: not at all

	mu      sync.Mutex // guards what follows, and every ticket's state
	calls   int
	waiting []*ticket[T]
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
// the call sends on answer, or false if ctx is done before the item is in a
// call. A caller handed the lead just as its ctx was done still makes the
// call, in the background: the items behind it wait for it.
func await[T, R any](ctx context.Context, q *coalescer[T], item T, answer <-chan R) (R, bool) {
	q.mu.Lock()
	if q.calls < q.maxCalls {
		q.calls++
		q.mu.Unlock()
		q.lead(item)
		return <-answer, true
	}
	t := &ticket[T]{item: item, lead: make(chan struct{}, 1)}
	q.waiting = append(q.waiting, t)
	q.mu.Unlock()
	select {
	case r := <-answer:
		return r, true
	case <-t.lead:
		q.lead(item)
		return <-answer, true
	case <-ctx.Done():
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
	var none R
	return none, false
}

// lead makes one call of first and of what waits and can join it, then hands
// the next call to the first item still waiting, if any.
func (q *coalescer[T]) lead(first T) {
	if q.linger > 0 {
		time.Sleep(q.linger)
	}
	b := q.start(first)
	q.mu.Lock()
	// The call takes what waits in arrival order, up to the first item that
	// cannot join it: that one leads the next.
	n, i := 1, 0
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

// admission is one request waiting for its decision.
type admission struct {
	chain    []limit
	atMillis int64
	decided  chan admissionResult // buffered: a call never waits on it
}

type admissionResult struct {
	d   decision
	err error
}

// admissionBatch decides its admissions in one call of admit.lua. An
// admission with another pinned clock, or whose counters are in the call
// under other caps, starts the next call.
type admissionBatch struct {
	store *redisStore
	call  scriptCall
	items []*admission
}

func (b *admissionBatch) add(a *admission) bool {
	if a.atMillis != b.items[0].atMillis || !b.call.add(a.chain) {
		return false
	}
	b.items = append(b.items, a)
	return true
}

func (b *admissionBatch) send() {
	ds, err := b.store.call(context.Background(), &b.call, b.items[0].atMillis, false)
	for i, a := range b.items {
		if err != nil {
			a.decided <- admissionResult{err: err}
		} else {
			a.decided <- admissionResult{d: ds[i]}
		}
	}
}

// admitCoalesced waits for the admission's decision: at most the store's
// timeout in all while others make the calls, and one call (which the timeout
// bounds) more when it is handed one. An admission that gives up waiting may
// still be decided, and charged, by its call: that errs towards stricter, as
// a lost reply does.
func (s *redisStore) admitCoalesced(ctx context.Context, chain []limit, atMillis int64) (decision, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	a := &admission{chain: chain, atMillis: atMillis, decided: make(chan admissionResult, 1)}
	r, ok := await(ctx, s.admissions, a, a.decided)
	if !ok {
		return decision{}, ctx.Err()
	}
	return r.d, r.err
}

// charge is one response's tokens, waiting to be charged.
type charge struct {
	chain    []limit
	tokens   int64
	atMillis int64
	charged  chan error // buffered
}

// chargeBatch charges its charges in one call of record.lua, summed per key.
type chargeBatch struct {
	store *redisStore
	call  chargeCall
	items []*charge
}

func (b *chargeBatch) add(c *charge) bool {
	if c.atMillis != b.items[0].atMillis {
		return false
	}
	b.call.add(c.chain, c.tokens)
	b.items = append(b.items, c)
	return true
}

func (b *chargeBatch) send() {
	err := b.store.charge(context.Background(), &b.call, b.items[0].atMillis)
	for _, c := range b.items {
		c.charged <- err
	}
}

// recordCoalesced waits until the tokens are charged, or the charge failed.
func (s *redisStore) recordCoalesced(ctx context.Context, chain []limit, tokens, atMillis int64) error {
	c := &charge{chain: chain, tokens: tokens, atMillis: atMillis, charged: make(chan error, 1)}
	err, ok := await(ctx, s.charges, c, c.charged)
	if !ok {
		return ctx.Err()
	}
	return err
}
