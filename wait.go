package ratelimit

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
)

// The design of waiting is in the package doc, section "Waiting instead of refusing".

// defaultMaxWaiting is how many requests may wait at once in a process by
// default.
const defaultMaxWaiting = 1000

// waitingRequests counts the requests waiting in this process.
var waitingRequests atomic.Int64

func (h *Handler) maxWaiting() int64 { return cmp.Or(h.MaxWaiting, defaultMaxWaiting) }

// waitFor is how long a request refused with ref, after waiting waited
// already, waits before it is admitted again, and whether it waits.
func (h *Handler) waitFor(ref limiter.Refusal, waited time.Duration) (time.Duration, bool) {
	if h.Wait <= 0 || !ref.Passes() {
		return 0, false
	}
	d := time.Duration(max(ref.WaitMillis, 1)) * time.Millisecond
	return d, waited+d <= time.Duration(h.Wait)
}

// beginWaiting takes a place among the process's waiting requests, unless
// max_waiting of them wait already or the request's body cannot be held
// whole while it waits (heldWhole: its client's departure would go
// unnoticed), by the time by if it is not zero. The body is read before
// the place is taken: a client slow to send it, or that never does, holds
// no place meanwhile, and a refused one is answered by the end of its
// wait. A body that found no room under body_memory is an error: its
// request must not go on.
func (h *Handler) beginWaiting(req *request, by time.Time) (bool, error) {
	if waitingRequests.Load() >= h.maxWaiting() {
		waitsDeclinedTotal.Inc()
		return false, nil // its body is not worth reading
	}
	if whole, err := heldWhole(req, h.bodyMemory(), by); !whole {
		return false, err
	}
	for {
		n := waitingRequests.Load()
		if n >= h.maxWaiting() {
			waitsDeclinedTotal.Inc()
			return false, nil
		}
		if waitingRequests.CompareAndSwap(n, n+1) {
			return true, nil
		}
	}
}

// errClientGone ends the wait of a request whose client went away.
var errClientGone = errors.New("rolter_ratelimit: the client went away while its request waited")

// admitWaiting admits the request's chain with reserve, waiting for a
// refusal that wait allows, and records how long it waited. Waiters stand
// in line per refusing limit, in the order they started waiting: only the
// head sleeps until its release and tries again, and hands over when it is
// admitted or gives up; a request of a chain with a line in this process
// joins it before it tries at all, so that new requests do not overtake
// those waiting.
func (h *Handler) admitWaiting(req *request, chain []limiter.Limit, reserve limiter.TokenCounts) (limiter.Admission, error) {
	if h.Wait <= 0 {
		return h.admit(req, chain, reserve)
	}
	start, waiting := time.Now(), false
	var place *waitPlace
	var next time.Time // when the limit of the line admits the next, once this one is admitted
	defer func() {
		place.leave(next)
		var waited time.Duration // 0 for a request that did not wait
		if waiting {
			waitingRequests.Add(-1)
			waited = time.Since(start)
			waitDuration.Observe(waited.Seconds())
		}
		req.repl.Set(placeholderWaitedMillis, waited.Milliseconds())
	}()
	var release time.Time // when the last refusal would admit: the head sleeps until then
	end := start.Add(time.Duration(h.Wait))
	// Not yet refused, it reads its body without a deadline: one cut short
	// could not be passed on if it were then admitted.
	if key, ok := waitLines.lineOf(chain); ok {
		if waits, err := h.beginWaiting(req, time.Time{}); err != nil {
			return limiter.Admission{}, err
		} else if waits {
			waiting, place = true, waitLines.join(key)
		}
	}
	for {
		if place != nil {
			if err := place.await(req.Context(), release, end); err != nil {
				return limiter.Admission{}, err
			}
		}
		a, err := h.admit(req, chain, reserve)
		if err == nil && a.Admitted && place != nil {
			next = nextRelease(chain, a.Decision, place.key)
		}
		if err != nil || a.Admitted {
			return a, err
		}
		d, ok := h.waitFor(a.Refusal, time.Since(start))
		release = time.Now().Add(d)
		if !ok {
			return a, nil
		}
		if !waiting {
			// A body that found no room is refused as it would be
			// without wait.
			if waits, _ := h.beginWaiting(req, end); !waits {
				return a, nil
			}
		}
		waiting = true
		if key := a.Limits[a.Refusal.First].Prefix; place == nil || place.key != key {
			place.leave(time.Time{})
			place = waitLines.join(key)
		}
	}
}

// nextRelease is when the limit of chain with prefix key, which d admitted
// a request to, would admit another at the earliest, absent other traffic:
// what the head of its line hands on to the next, which then makes no call
// before that. The earliest: a request window or a bucket counts any
// request alike, and a token window is tried as if the next reserved
// nothing; a wait that is not known is none.
func nextRelease(chain []limiter.Limit, d limiter.Decision, key string) time.Time {
	for i, l := range chain {
		if l.Prefix != key {
			continue
		}
		after := limiter.Decision{Now: d.Now, Counts: []limiter.Counts{d.Counts[i]}}
		d.AddTo(l, &after.Counts[0])
		if ref := limiter.RefusalOf(chain[i:i+1], after); ref.First >= 0 && ref.Passes() {
			return time.Now().Add(time.Duration(ref.WaitMillis) * time.Millisecond)
		}
	}
	return time.Time{}
}

// waitLines are the lines of the process's waiters, by the prefix of the
// limit they wait for.
var waitLines = &lines{byLimit: make(map[string][]*waitPlace)}

type lines struct {
	mu      sync.Mutex
	byLimit map[string][]*waitPlace
}

// waitPlace is a waiter's place in the line of the limit with prefix key.
type waitPlace struct {
	key  string
	turn chan struct{} // closed once it is the line's head
	left bool
	// handed is when the limit admits again, as the head before it learnt
	// on its admission; set before turn is closed.
	handed time.Time
}

// lineOf is the key of a line that a limit of chain has, if any.
func (l *lines) lineOf(chain []limiter.Limit) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, lim := range chain {
		if len(l.byLimit[lim.Prefix]) > 0 {
			return lim.Prefix, true
		}
	}
	return "", false
}

// join puts a waiter at the end of key's line.
func (l *lines) join(key string) *waitPlace {
	p := &waitPlace{key: key, turn: make(chan struct{})}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byLimit[key] = append(l.byLimit[key], p)
	if len(l.byLimit[key]) == 1 {
		close(p.turn)
	}
	return p
}

// leave takes p out of its line, once, and gives the head's turn to the
// next, with next, when the limit admits again if known; a nil place is in
// no line.
func (p *waitPlace) leave(next time.Time) {
	if p == nil {
		return
	}
	l := waitLines
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.left {
		return
	}
	p.left = true
	line := l.byLimit[p.key]
	i := slices.Index(line, p)
	line = slices.Delete(line, i, i+1)
	if len(line) == 0 {
		delete(l.byLimit, p.key)
		return
	}
	if i == 0 {
		line[0].handed = next
		close(line[0].turn)
	}
	l.byLimit[p.key] = line
}

// await waits for the waiter's turn at the head of its line, then sleeps
// until release, the moment its last refusal would admit, or the moment
// handed to it, whichever is later; until the end of its wait at most,
// after which it tries once more all the same. A client that goes away
// ends it.
func (p *waitPlace) await(ctx context.Context, release, end time.Time) error {
	deadline := time.NewTimer(time.Until(end))
	defer deadline.Stop()
	select {
	case <-p.turn:
	case <-deadline.C:
		return nil
	case <-ctx.Done():
		return errClientGone
	}
	wake := release
	if p.handed.After(wake) {
		wake = p.handed
	}
	sleep := min(time.Until(wake), time.Until(end))
	if sleep <= 0 {
		return nil
	}
	t := time.NewTimer(sleep)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return errClientGone
	}
	return nil
}
