package ratelimit

import (
	"context"
	"sync"
)

// coalescer sends the concurrent admissions of this process to Redis
// together: a few workers each take what is waiting, up to maxBatch
// admissions, and decide it in one call of admit.lua, which admits them in
// arrival order, each all-or-nothing as if sent alone. A limit that several
// of them share (their org, say) is read, decided and charged once per call,
// so Redis spends far less per admission under load. With fewer requests in
// flight than workers, every admission is sent at once, alone: coalescing
// adds no wait.
//
// A call keeps the single admission's guarantees: it is replayed once on a
// dead connection, and when it fails, every admission in it gets the error
// (and on_redis_error applies to each).
type coalescer struct {
	store   *redisStore
	pending chan *admission
	stop    chan struct{}
	done    sync.WaitGroup
}

const (
	coalesceWorkers = 4
	maxBatch        = 64
)

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

func newCoalescer(s *redisStore) *coalescer {
	q := &coalescer{store: s, pending: make(chan *admission), stop: make(chan struct{})}
	q.done.Add(coalesceWorkers)
	for range coalesceWorkers {
		go q.work()
	}
	return q
}

// admit waits for the admission's decision, at most the store's timeout in
// all. An admission that gives up waiting may still be decided, and charged,
// by its call: that errs towards stricter, as a lost reply does.
func (q *coalescer) admit(ctx context.Context, chain []limit, atMillis int64) (decision, error) {
	ctx, cancel := context.WithTimeout(ctx, q.store.timeout)
	defer cancel()
	a := &admission{chain: chain, atMillis: atMillis, decided: make(chan admissionResult, 1)}
	select {
	case q.pending <- a:
	case <-ctx.Done():
		return decision{}, ctx.Err()
	}
	select {
	case r := <-a.decided:
		return r.d, r.err
	case <-ctx.Done():
		return decision{}, ctx.Err()
	}
}

// work sends calls until the coalescer stops. An admission that cannot join
// the call being built (another pinned clock, or counters in the call under
// other caps) starts the next one.
func (q *coalescer) work() {
	defer q.done.Done()
	var next *admission
	for {
		if next == nil {
			select {
			case next = <-q.pending:
			case <-q.stop:
				return
			}
		}
		batch := []*admission{next}
		var c scriptCall
		c.add(next.chain)
		next = nil
	gather:
		for len(batch) < maxBatch {
			select {
			case a := <-q.pending:
				if a.atMillis != batch[0].atMillis || !c.add(a.chain) {
					next = a
					break gather
				}
				batch = append(batch, a)
			default:
				break gather
			}
		}
		ds, err := q.store.call(context.Background(), &c, batch[0].atMillis, false)
		for i, a := range batch {
			if err != nil {
				a.decided <- admissionResult{err: err}
			} else {
				a.decided <- admissionResult{d: ds[i]}
			}
		}
	}
}

// close stops the workers once their calls are answered.
func (q *coalescer) close() {
	close(q.stop)
	q.done.Wait()
}
