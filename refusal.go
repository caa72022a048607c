package ratelimit

import (
	"fmt"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/pricing"
)

// refusal describes why a request was refused.
type Refusal struct {
	First      int          // index in the chain of the first refusing limit
	Kind       kind         // what that limit refused on
	window     WindowKind   // the window that refused, if kind counts in one
	budget     BudgetPeriod // the budget that refused, if kind is budget
	Capacity   int64        // its cap (a budget's in nano-dollars)
	WaitMillis int64        // until every refusing limit would admit, absent traffic
	// untilFreed: a concurrency cap refuses, which admits again only once
	// a request in flight ends: no wait is known, unless a budget refuses
	// too (exhausted), which admits nothing before it renews.
	UntilFreed, Exhausted bool
	// A refusing budget's period: what it holds spent and reserved, and
	// when it renews (unix milliseconds).
	used, renewsAt int64
}

// windowName is the span of the refusing window, or the period of the
// refusing budget; "" for a bucket or a concurrency cap.
func (r Refusal) WindowName() string {
	switch r.Kind {
	case Burst, Concurrency:
		return ""
	case Budget:
		return r.budget.String()
	}
	return Spans[r.window.Span()].Name
}

// knowsWait reports whether the refusal knows when its request would be
// admitted.
func (r Refusal) KnowsWait() bool { return !r.UntilFreed || r.Exhausted }

// passes reports whether the refusal ends by itself at its wait: not a
// spent budget's, renewed only in its next period, nor a concurrency cap's,
// whose wait no one knows. Only such a refusal is waited out.
func (r Refusal) Passes() bool { return !r.UntilFreed && !r.Exhausted }

// refusalOf finds the first refusing limit and the wait until the last of the
// refusing limits releases, so that a client that waits Retry-After is not
// refused by the next limit of the chain. Shadow limits refuse nothing.
func RefusalOf(chain []Limit, d Decision) Refusal { return refusalAmong(chain, d, false) }

// shadowRefusalOf is the refusal the shadow limits of chain would make of
// an admission that read d, as if they were enforced (and the others
// were not).
func ShadowRefusalOf(chain []Limit, d Decision) Refusal { return refusalAmong(chain, d, true) }

// refusalAmong is the refusal of the limits of chain that are shadow
// limits, or that are not.
func refusalAmong(chain []Limit, d Decision, shadow bool) Refusal {
	ref := Refusal{First: -1}
	at := [...]Position{d.Now.In(Minute), d.Now.In(Day)}
	for i, l := range chain {
		if l.Shadow != shadow {
			continue
		}
		for k, capacity := range l.Each {
			size, p, w := d.size(k.Kind()), at[k.Span()], d.Counts[i].Window[k]
			if fits(w, capacity, size, p) {
				continue
			}
			if ref.First < 0 {
				ref.First, ref.Kind, ref.window, ref.Capacity = i, k.Kind(), k, capacity
			}
			ref.WaitMillis = max(ref.WaitMillis, releaseIn(w, capacity, size, p))
		}
		if b := l.Bucket; b.Rate > 0 && !b.fits(d.Counts[i].Deficit) {
			if ref.First < 0 {
				ref.First, ref.Kind, ref.Capacity = i, Burst, b.Burst
			}
			ref.WaitMillis = max(ref.WaitMillis, b.releaseIn(d.Counts[i].Deficit))
		}
		if m := l.Concurrent.Max; m > 0 && d.Counts[i].Slots >= m {
			if ref.First < 0 {
				ref.First, ref.Kind, ref.Capacity = i, Concurrency, m
			}
			ref.UntilFreed = true
		}
		c, calendar := d.Counts[i], l.Budgets.Calendar
		for p, b := range l.EachBudget {
			if fitsBudget(c.Spent[p], c.Reserved[p], b, d.Reserve.Cost) {
				continue
			}
			renewsIn := calendar.renewsIn(p, d.Now)
			if ref.First < 0 {
				ref.First, ref.Kind, ref.budget, ref.Capacity = i, Budget, p, b
				ref.used, ref.renewsAt = c.Spent[p]+c.Reserved[p], d.Now.UnixMillis+renewsIn
			}
			ref.Exhausted = true
			ref.WaitMillis = max(ref.WaitMillis, renewsIn)
		}
	}
	return ref
}

// retryAfterSeconds is the wait rounded up to whole seconds, at least 1.
func (r Refusal) RetryAfterSeconds() int64 { return CeilSeconds(r.WaitMillis, 1) }

func CeilSeconds(millis, atLeast int64) int64 {
	return max((millis+999)/1000, atLeast)
}

// message names the scope and the cap, never the id, and the wait when it
// is known.
func (r Refusal) message(chain []Limit) string {
	scope := chain[r.First].Scope
	var reached string
	switch r.Kind {
	case Budget:
		l := chain[r.First]
		renews := time.UnixMilli(r.renewsAt).In(l.Budgets.Calendar.Location).Format(time.RFC3339)
		return fmt.Sprintf("Budget reached for %s: $%s per %s, of which $%s is spent or reserved. It renews at %s (%s); please try again then.",
			scope, pricing.FormatUSD(r.Capacity), r.budget, pricing.FormatUSD(r.used), renews, l.Budgets.Calendar.Name)
	case Concurrency:
		reached = fmt.Sprintf("Concurrency limit reached for %s: %d requests in flight.", scope, r.Capacity)
	case Burst:
		b := chain[r.First].Bucket
		reached = fmt.Sprintf("Rate limit reached for %s: burst capacity %d, refilled at %s per second; a request takes %d.",
			scope, b.Burst, b.RateText, b.Cost)
	default:
		reached = fmt.Sprintf("Rate limit reached for %s: limit %d %s (%s per %s).",
			scope, r.Capacity, r.window.Unit(), r.window.Noun(), Spans[r.window.Span()].Name)
	}
	if !r.KnowsWait() {
		return reached + " Please try again once a request in flight has ended."
	}
	return fmt.Sprintf("%s Please try again in %ds.", reached, r.RetryAfterSeconds())
}
