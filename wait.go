package ratelimit

import (
	"cmp"
	"errors"
	"sync/atomic"
	"time"
)

// Waiting instead of refusing. With wait set, a request refused by a window
// or a bucket whose exact wait (the refusal's, from the store's own
// arithmetic) is within what is left of wait is held until then and
// admitted again through the normal atomic admission; refused again (others
// took the room meanwhile), it waits again while the total stays within
// wait, and otherwise gets the refusal then true. A refusal by a budget, by
// a cap on requests in flight (no wait is known), too large, a missing
// scope or a store failure never waits. A waiting request holds nothing
// in the store: no slot, reservation or spend. The requests waiting in one
// process are capped (max_waiting); past the cap a request is refused at
// once. One whose client goes away ends its wait, charged nothing.

// defaultMaxWaiting is how many requests may wait at once in a process by
// default.
const defaultMaxWaiting = 1000

// waitingRequests counts the requests waiting in this process.
var waitingRequests atomic.Int64

func (h *Handler) maxWaiting() int64 { return cmp.Or(h.MaxWaiting, defaultMaxWaiting) }

// waitFor is how long a request refused with ref, after waiting waited
// already, waits before it is admitted again, and whether it waits.
func (h *Handler) waitFor(ref refusal, waited time.Duration) (time.Duration, bool) {
	if h.Wait <= 0 || ref.untilFreed || ref.exhausted {
		return 0, false
	}
	d := time.Duration(max(ref.waitMillis, 1)) * time.Millisecond
	return d, waited+d <= time.Duration(h.Wait)
}

// startWaiting takes a place among the process's waiting requests, unless
// max of them wait already.
func startWaiting(max int64) bool {
	for {
		n := waitingRequests.Load()
		if n >= max {
			return false
		}
		if waitingRequests.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// errClientGone ends the wait of a request whose client went away.
var errClientGone = errors.New("rolter_ratelimit: the client went away while its request waited")

// admitWaiting admits the request's chain with reserve, waiting for a
// refusal that wait allows (wait.go), and records how long it waited.
func (h *Handler) admitWaiting(req *request, chain []limit, reserve tokenCounts) (admission, error) {
	start, waiting := time.Now(), false
	defer func() {
		if waiting {
			waitingRequests.Add(-1)
			waited := time.Since(start)
			waitDuration.Observe(waited.Seconds())
			req.repl.Set(placeholderWaitedMillis, waited.Milliseconds())
		}
	}()
	for {
		a, err := h.store.admit(req.Context(), chain, reserve)
		if err != nil || a.admitted {
			return a, err
		}
		d, ok := h.waitFor(a.refusal, time.Since(start))
		if !ok || !waiting && !startWaiting(h.maxWaiting()) {
			return a, nil
		}
		waiting = true
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-req.Context().Done():
			t.Stop()
			return admission{}, errClientGone
		}
	}
}
