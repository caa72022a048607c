package ratelimit

import "fmt"

// refusal describes why a request was refused.
type refusal struct {
	first      int        // index in the chain of the first refusing limit
	kind       kind       // what that limit refused on
	window     windowKind // the window that refused, unless kind is burst
	capacity   int64      // its cap
	waitMillis int64      // until every refusing limit would admit, absent traffic
	// untilFreed: a concurrency cap refuses, which admits again only once
	// a request in flight ends: no wait is known.
	untilFreed bool
}

// windowName is the span of the refusing window, "" for a bucket or a
// concurrency cap.
func (r refusal) windowName() string {
	if r.kind == burst || r.kind == concurrency {
		return ""
	}
	return spans[r.window.span()].name
}

// refusalOf finds the first refusing limit and the wait until the last of the
// refusing limits releases, so that a client that waits Retry-After is not
// refused by the next limit of the chain.
func refusalOf(chain []limit, d decision) refusal {
	ref := refusal{first: -1}
	at := [...]position{d.now.in(minute), d.now.in(day)}
	for i, l := range chain {
		for k, capacity := range l.each {
			size, p, w := d.size(k.kind()), at[k.span()], d.counts[i].w[k]
			if fits(w, capacity, size, p) {
				continue
			}
			if ref.first < 0 {
				ref.first, ref.kind, ref.window, ref.capacity = i, k.kind(), k, capacity
			}
			ref.waitMillis = max(ref.waitMillis, releaseIn(w, capacity, size, p))
		}
		if b := l.bucket; b.rate > 0 && !b.fits(d.counts[i].deficit) {
			if ref.first < 0 {
				ref.first, ref.kind, ref.capacity = i, burst, b.burst
			}
			ref.waitMillis = max(ref.waitMillis, b.releaseIn(d.counts[i].deficit))
		}
		if m := l.concurrent.max; m > 0 && d.counts[i].slots >= m {
			if ref.first < 0 {
				ref.first, ref.kind, ref.capacity = i, concurrency, m
			}
			ref.untilFreed = true
		}
	}
	return ref
}

// retryAfterSeconds is the wait rounded up to whole seconds, at least 1.
func (r refusal) retryAfterSeconds() int64 { return ceilSeconds(r.waitMillis, 1) }

func ceilSeconds(millis, atLeast int64) int64 {
	return max((millis+999)/1000, atLeast)
}

// message names the scope and the cap, never the id, and the wait when it
// is known.
func (r refusal) message(chain []limit) string {
	scope := chain[r.first].scope
	var reached string
	switch r.kind {
	case concurrency:
		reached = fmt.Sprintf("Concurrency limit reached for %s: %d requests in flight.", scope, r.capacity)
	case burst:
		b := chain[r.first].bucket
		reached = fmt.Sprintf("Rate limit reached for %s: burst capacity %d, refilled at %s per second; a request takes %d.",
			scope, b.burst, b.rateText, b.cost)
	default:
		reached = fmt.Sprintf("Rate limit reached for %s: limit %d %s (%s per %s).",
			scope, r.capacity, r.window.unit(), r.window.noun(), spans[r.window.span()].name)
	}
	if r.untilFreed {
		return reached + " Please try again once a request in flight has ended."
	}
	return fmt.Sprintf("%s Please try again in %ds.", reached, r.retryAfterSeconds())
}
