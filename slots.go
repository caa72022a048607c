package ratelimit

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Requests in flight. A limit may cap how many requests of its scope id are
// in flight at once (concurrent). An admitted request takes one slot of
// every such limit of its chain, in the same atomic step as its windows and
// buckets, and frees them when it ends, however it ends (the handler frees
// them in a deferred call: a complete response, an error, a client or an
// upstream gone mid-stream, reverse_proxy's panic, handle_errors). A
// WebSocket session holds its slots for its whole life.
//
// Slots are counted per holder: each store (a gateway process's Redis
// client, or the in-process store) holds some of a limit's slots, written
// with the moment its lease on them ends. A holder that stops renewing (a
// process killed, a crash, a lost network) loses its slots once that lease
// has passed: a limit counts only its holders' slots whose lease has not.
// Each store renews everything it holds, every third of the shortest lease,
// in steps of a call each (renewalStep limits; on Redis Cluster, a pipeline
// of a call per chain root), writing the count it knows it holds: that
// count is the truth, so a free that never reached the store, or a Redis
// that restarted empty, is mended by the next renewal instead of leaking or
// being counted twice. No call that takes or frees slots is in flight while
// a step is (redisStore.slotCalls), so its counts are exact. Lease times
// are the store's clock (Redis TIME), as every window's.

// concurrencyCap is a limit's cap on requests in flight.
type concurrencyCap struct {
	max         int64 // slots; 0: no cap
	leaseMillis int64 // how long a holder's slots outlive its last renewal
}

// The lease of slots, by default and at the least: a renewal every third of
// it must reach the store in time.
const (
	defaultSlotLease = 30 * time.Second
	minSlotLease     = time.Second
)

// slotHolding is one holder's slots of a limit: n of them, live until
// expiry (unix milliseconds, by the store's clock).
type slotHolding struct{ n, expiry int64 }

// at is how many slots the holding holds at now.
func (h slotHolding) at(now int64) int64 {
	if h.expiry > now {
		return h.n
	}
	return 0
}

// freed is the holding once one slot is freed at now: a lapsed lease
// holds nothing to free.
func (h slotHolding) freed(now int64) slotHolding {
	if h.at(now) <= 1 {
		return slotHolding{}
	}
	return slotHolding{h.n - 1, h.expiry}
}

// holdsSlots reports whether a limit of chain caps requests in flight: an
// admission then takes slots, which must be freed.
func holdsSlots(chain []limit) bool {
	for _, l := range chain {
		if l.concurrent.max > 0 {
			return true
		}
	}
	return false
}

// heldSlots is a store's ledger of the slots its admissions hold, per
// limit: what it renews. An entry that falls to 0 is renewed once more (its
// holding is removed) and then dropped.
type heldSlots struct {
	mu       sync.Mutex
	byPrefix map[string]*heldLimit
	shortest int64         // the lease the renewal's period was last figured from, in milliseconds
	taken    chan struct{} // wakes the renewal when the ledger was empty, or a limit of a shorter lease is taken
}

// heldLimit is how many slots of a limit the store holds.
type heldLimit struct {
	limit
	n     int64
	gauge prometheus.Gauge // slots_held of the limit's scope, looked up once
}

func newHeldSlots() *heldSlots {
	return &heldSlots{byPrefix: make(map[string]*heldLimit), taken: make(chan struct{}, 1)}
}

// take adds n (negative: frees) to the slots held of every concurrency cap
// of chain.
func (h *heldSlots) take(chain []limit, n int64) {
	for _, l := range chain {
		if l.concurrent.max > 0 {
			h.takeOne(l, n)
		}
	}
}

// takeOne adds n to the slots held of l.
func (h *heldSlots) takeOne(l limit, n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.byPrefix[l.prefix]
	if e == nil {
		if n < 0 {
			return
		}
		e = &heldLimit{limit: l, gauge: slotsHeld.WithLabelValues(l.scope)}
		h.byPrefix[l.prefix] = e
		if len(h.byPrefix) == 1 || l.concurrent.leaseMillis < h.shortest {
			select {
			case h.taken <- struct{}{}:
			default:
			}
		}
	}
	after := max(e.n+n, 0)
	e.gauge.Add(float64(after - e.n))
	e.n = after
}

// limits lists the limits the store holds slots of, or held some of
// since their last renewal.
func (h *heldSlots) limits() []limit {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]limit, 0, len(h.byPrefix))
	for _, e := range h.byPrefix {
		out = append(out, e.limit)
	}
	return out
}

// renewed is how many slots of the limit with prefix the store holds, for
// its renewal: a limit it holds none of any more is dropped from the
// ledger, as the renewal removes its holding.
func (h *heldSlots) renewed(prefix string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.byPrefix[prefix]
	if e == nil {
		return 0
	}
	if e.n == 0 {
		delete(h.byPrefix, prefix)
	}
	return e.n
}

// period is a third of the shortest lease of the limits held; ok is false
// when nothing is held.
func (h *heldSlots) period() (every time.Duration, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	shortest := int64(0)
	for _, e := range h.byPrefix {
		if shortest == 0 || e.concurrent.leaseMillis < shortest {
			shortest = e.concurrent.leaseMillis
		}
	}
	h.shortest = shortest
	return time.Duration(shortest) * time.Millisecond / 3, shortest > 0
}

// renewEvery calls renew every third of the shortest lease held, while
// anything is held, until stop is closed. A limit taken with a shorter
// lease than that of the period it waits out makes it figure the period
// again, from the last renewal.
func (h *heldSlots) renewEvery(renew func(), stop <-chan struct{}) {
	last := time.Now()
	for {
		every, ok := h.period()
		if !ok {
			select {
			case <-h.taken:
				last = time.Now()
				continue
			case <-stop:
				return
			}
		}
		t := time.NewTimer(time.Until(last.Add(every)))
		select {
		case <-t.C:
			renew()
			last = time.Now()
		case <-h.taken:
			t.Stop()
		case <-stop:
			t.Stop()
			return
		}
	}
}
