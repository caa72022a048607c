package limiter

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// The design of requests in flight is in the package doc, section "Requests in flight".

// concurrencyCap is a limit's cap on requests in flight.
type concurrencyCap struct {
	Max         int64 // slots; 0: no cap
	LeaseMillis int64 // how long a holder's slots outlive its last renewal
}

// The lease of slots, by default and at the least: a renewal every third of
// it must reach the store in time.
const (
	DefaultSlotLease = 30 * time.Second
	MinSlotLease     = time.Second
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

// taken is the holding of n slots once some are taken at now, under a
// lease: a live holding's end, which another handler's longer lease may
// have set, is never moved closer.
func (h slotHolding) taken(n, now, lease int64) slotHolding {
	expiry := now + lease
	if h.at(now) > 0 {
		expiry = max(expiry, h.expiry)
	}
	return slotHolding{n, expiry}
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
func HoldsSlots(chain []Limit) bool {
	for _, l := range chain {
		if l.Concurrent.Max > 0 {
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
	shortest int64         // the lease the renewal's period was last figured from, in milliseconds; 0: nothing was held
	taken    chan struct{} // wakes the renewal when the ledger was empty, or a slot of a shorter lease is taken
}

// heldLimit is how many slots of a limit the store holds, in all and by
// the lease their takers asked for.
type heldLimit struct {
	Limit
	n      int64
	leases []heldLease // a lease whose slots were all freed stays until the next renewal
	gauge  Adder       // slots_held of the limit's scope, looked up once
}

// heldLease is how many slots of a limit the store holds under one lease.
type heldLease struct{ millis, n int64 }

// lease is the limit's lease for its renewal: the longest of the slots it
// holds, or, once it holds none, of those it held since the last renewal.
func (e *heldLimit) lease() int64 {
	longest, held := int64(0), int64(0)
	for _, l := range e.leases {
		longest = max(longest, l.millis)
		if l.n > 0 {
			held = max(held, l.millis)
		}
	}
	return cmp.Or(held, longest)
}

func newHeldSlots() *heldSlots {
	return &heldSlots{byPrefix: make(map[string]*heldLimit), taken: make(chan struct{}, 1)}
}

// take adds n (negative: frees) to the slots held of every concurrency cap
// of chain.
func (h *heldSlots) take(chain []Limit, n int64) {
	for _, l := range chain {
		if l.Concurrent.Max > 0 {
			h.takeOne(l, n)
		}
	}
}

// takeOne adds n to the slots held of l, under l's lease.
func (h *heldSlots) takeOne(l Limit, n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	lease := l.Concurrent.LeaseMillis
	e := h.byPrefix[l.Prefix]
	if e == nil {
		if n < 0 {
			return
		}
		e = &heldLimit{Limit: l, gauge: watch.SlotsHeld(l.Scope)}
		h.byPrefix[l.Prefix] = e
	}
	i := slices.IndexFunc(e.leases, func(x heldLease) bool { return x.millis == lease })
	if i < 0 {
		if n < 0 {
			return
		}
		i, e.leases = len(e.leases), append(e.leases, heldLease{millis: lease})
	}
	if n > 0 && (h.shortest == 0 || lease < h.shortest) {
		select {
		case h.taken <- struct{}{}:
		default:
		}
	}
	held := &e.leases[i]
	after := max(held.n+n, 0)
	e.gauge.Add(float64(after - held.n))
	e.n += after - held.n
	held.n = after
}

// limits lists the limits the store holds slots of, or held some of
// since their last renewal.
func (h *heldSlots) limits() []Limit {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Limit, 0, len(h.byPrefix))
	for _, e := range h.byPrefix {
		out = append(out, e.Limit)
	}
	return out
}

// slotRenewal is what a renewal writes of a limit: the slots the store
// holds, for a lease from now.
type slotRenewal struct {
	Limit
	n, leaseMillis int64
}

// renewed is what the renewal writes of l: a limit the store holds no
// slots of any more is dropped from the ledger, as the renewal removes its
// holding, and so is a lease it holds none under.
func (h *heldSlots) renewed(l Limit) slotRenewal {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.byPrefix[l.Prefix]
	if e == nil {
		return slotRenewal{Limit: l}
	}
	r := slotRenewal{Limit: l, n: e.n, leaseMillis: e.lease()}
	if e.n == 0 {
		delete(h.byPrefix, l.Prefix)
	} else {
		e.leases = slices.DeleteFunc(e.leases, func(x heldLease) bool { return x.n == 0 })
	}
	return r
}

// period is a third of the shortest lease of the limits held, each at its
// longest; ok is false when nothing is held.
func (h *heldSlots) period() (every time.Duration, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	shortest := int64(0)
	for _, e := range h.byPrefix {
		if lease := e.lease(); shortest == 0 || lease < shortest {
			shortest = lease
		}
	}
	h.shortest = shortest
	return time.Duration(shortest) * time.Millisecond / 3, shortest > 0
}

// renewEvery calls renew every third of the shortest lease held, while
// anything is held, until stop is closed. A slot taken under a shorter
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
