package ratelimit

import (
	"fmt"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/pricing"
)

// refusal describes why a request was refused.
type refusal struct {
	first      int          // index in the chain of the first refusing limit
	kind       kind         // what that limit refused on
	window     windowKind   // the window that refused, if kind counts in one
	budget     budgetPeriod // the budget that refused, if kind is budget
	capacity   int64        // its cap (a budget's in nano-dollars)
	waitMillis int64        // until every refusing limit would admit, absent traffic
	// untilFreed: a concurrency cap refuses, which admits again only once
	// a request in flight ends: no wait is known, unless a budget refuses
	// too (exhausted), which admits nothing before it renews.
	untilFreed, exhausted bool
	// A refusing budget's period: what it holds spent and reserved, and
	// when it renews (unix milliseconds).
	used, renewsAt int64
}

// windowName is the span of the refusing window, or the period of the
// refusing budget; "" for a bucket or a concurrency cap.
func (r refusal) windowName() string {
	switch r.kind {
	case burst, concurrency:
		return ""
	case budget:
		return r.budget.String()
	}
	return spans[r.window.span()].name
}

// knowsWait reports whether the refusal knows when its request would be
// admitted.
func (r refusal) knowsWait() bool { return !r.untilFreed || r.exhausted }

// passes reports whether the refusal ends by itself at its wait: not a
// spent budget's, renewed only in its next period, nor a concurrency cap's,
// whose wait no one knows. Only such a refusal is waited out.
func (r refusal) passes() bool { return !r.untilFreed && !r.exhausted }

// refusalOf finds the first refusing limit and the wait until the last of the
// refusing limits releases, so that a client that waits Retry-After is not
// refused by the next limit of the chain. Shadow limits refuse nothing.
func refusalOf(chain []limit, d decision) refusal { return refusalAmong(chain, d, false) }

// shadowRefusalOf is the refusal the shadow limits of chain would make of
// an admission that read d, as if they were enforced (and the others
// were not).
func shadowRefusalOf(chain []limit, d decision) refusal { return refusalAmong(chain, d, true) }

// refusalAmong is the refusal of the limits of chain that are shadow
// limits, or that are not.
func refusalAmong(chain []limit, d decision, shadow bool) refusal {
	ref := refusal{first: -1}
	at := [...]position{d.now.in(minute), d.now.in(day)}
	for i, l := range chain {
		if l.shadow != shadow {
			continue
		}
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
		c, calendar := d.counts[i], l.budgets.calendar
		for p, b := range l.eachBudget {
			if fitsBudget(c.spent[p], c.reserved[p], b, d.reserve.cost) {
				continue
			}
			renewsIn := calendar.renewsIn(p, d.now)
			if ref.first < 0 {
				ref.first, ref.kind, ref.budget, ref.capacity = i, budget, p, b
				ref.used, ref.renewsAt = c.spent[p]+c.reserved[p], d.now.unixMillis+renewsIn
			}
			ref.exhausted = true
			ref.waitMillis = max(ref.waitMillis, renewsIn)
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
	case budget:
		l := chain[r.first]
		renews := time.UnixMilli(r.renewsAt).In(l.budgets.calendar.loc).Format(time.RFC3339)
		return fmt.Sprintf("Budget reached for %s: $%s per %s, of which $%s is spent or reserved. It renews at %s (%s); please try again then.",
			scope, pricing.FormatUSD(r.capacity), r.budget, pricing.FormatUSD(r.used), renews, l.budgets.calendar.name)
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
	if !r.knowsWait() {
		return reached + " Please try again once a request in flight has ended."
	}
	return fmt.Sprintf("%s Please try again in %ds.", reached, r.retryAfterSeconds())
}
