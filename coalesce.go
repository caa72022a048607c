package ratelimit

import (
	"context"
	"sync"
	"time"
)

// coalescer sends the concurrent Redis calls of this process together: a few
// workers each take what is waiting, up to maxBatch items, and make one call
// of it. Admissions are decided by one call of admit.lua in arrival order,
// each all-or-nothing as if sent alone (admissionBatch); token charges are
// summed per key (chargeBatch). A limit that several requests share (their
// org, say) is then read, decided and charged once per call, so Redis spends
// far less per request under load. With fewer calls in flight than workers,
// every item is sent at once, alone: coalescing adds no wait.
//
// A call keeps the single request's guarantees: an admission call is
// replayed once on a dead connection, and when a call fails, every item in it
// gets the error (for an admission, on_redis_error applies to each).
type coalescer[T any] struct {
	pending chan T
	stop    chan struct{}
	done    sync.WaitGroup
	linger  time.Duration // how long a call waits for more items; 0: not at all
}

// maxBatch bounds the items of one call.
const maxBatch = 64

// batch is a call being built from waiting items.
type batch[T any] interface {
	// add joins an item to the call, or reports that it cannot join (it
	// then starts the next call).
	add(T) bool
	// send makes the call and answers each item.
	send()
}

func newCoalescer[T any](workers int, linger time.Duration, start func(first T) batch[T]) *coalescer[T] {
	q := &coalescer[T]{pending: make(chan T), stop: make(chan struct{}), linger: linger}
	q.done.Add(workers)
	for range workers {
		go q.work(start)
	}
	return q
}

// submit hands an item to a worker.
func (q *coalescer[T]) submit(ctx context.Context, item T) error {
	select {
	case q.pending <- item:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (q *coalescer[T]) work(start func(T) batch[T]) {
	defer q.done.Done()
	var next T
	held := false
	for {
		if !held {
			select {
			case next = <-q.pending:
			case <-q.stop:
				return
			}
		}
		b, n := start(next), 1
		held = false
		var waited <-chan time.Time // nil: take only what is waiting
		if q.linger > 0 {
			waited = time.After(q.linger)
		}
	gather:
		for n < maxBatch {
			var item T
			if waited == nil {
				select {
				case item = <-q.pending:
				default:
					break gather
				}
			} else {
				select {
				case item = <-q.pending:
				case <-waited:
					break gather
				}
			}
			if !b.add(item) {
				next, held = item, true
				break gather
			}
			n++
		}
		b.send()
	}
}

// close stops the workers once their calls are answered.
func (q *coalescer[T]) close() {
	close(q.stop)
	q.done.Wait()
}

// admission is one request waiting for its decision.
type admission struct {
	chain    []limit
	atMillis int64
	decided  chan admissionResult // buffered: a worker never waits on it
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

// admitCoalesced waits for the admission's decision, at most the store's
// timeout in all. An admission that gives up waiting may still be decided,
// and charged, by its call: that errs towards stricter, as a lost reply does.
func (s *redisStore) admitCoalesced(ctx context.Context, chain []limit, atMillis int64) (decision, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	a := &admission{chain: chain, atMillis: atMillis, decided: make(chan admissionResult, 1)}
	if err := s.admissions.submit(ctx, a); err != nil {
		return decision{}, err
	}
	select {
	case r := <-a.decided:
		return r.d, r.err
	case <-ctx.Done():
		return decision{}, ctx.Err()
	}
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
	if err := s.charges.submit(ctx, c); err != nil {
		return err
	}
	select {
	case err := <-c.charged:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
