package limiter

// refusal describes why a request was refused.
type Refusal struct {
	First      int          // index in the chain of the first refusing limit
	Kind       kind         // what that limit refused on
	Window     WindowKind   // the window that refused, if kind counts in one
	Period     BudgetPeriod // the budget that refused, if kind is budget
	Capacity   int64        // its cap (a budget's in nano-dollars)
	WaitMillis int64        // until every refusing limit would admit, absent traffic
	// untilFreed: a concurrency cap refuses, which admits again only once
	// a request in flight ends: no wait is known, unless a budget refuses
	// too (exhausted), which admits nothing before it renews.
	UntilFreed, Exhausted bool
	// A refusing budget's period: what it holds spent and reserved, and
	// when it renews (unix milliseconds).
	Used, RenewsAt int64
}

// windowName is the span of the refusing window, or the period of the
// refusing budget; "" for a bucket or a concurrency cap.
func (r Refusal) WindowName() string {
	switch r.Kind {
	case Burst, Concurrency:
		return ""
	case Budget:
		return r.Period.String()
	}
	return Spans[r.Window.Span()].Name
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
				ref.First, ref.Kind, ref.Window, ref.Capacity = i, k.Kind(), k, capacity
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
				ref.First, ref.Kind, ref.Period, ref.Capacity = i, Budget, p, b
				ref.Used, ref.RenewsAt = c.Spent[p]+c.Reserved[p], d.Now.UnixMillis+renewsIn
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
