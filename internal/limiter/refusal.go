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
	// Floor is the class whose floor holds what the first refusing limit
	// refused, if what refused fits without the floors (floors.go); 0:
	// none.
	Floor uint8
}

// windowName is the span of the refusing window, or the period of the
// refusing budget; "" for a bucket or a concurrency cap.
func (r Refusal) WindowName() string {
	switch r.Kind {
	case Burst, Concurrency, Provider:
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
		c := &d.Counts[i] // read only; a copy would cost more than the checks
		f := &c.Extra().Floors
		for p := range l.parts().All {
			var capacity, wait int64
			var floor uint8
			k, isWindow := p.Window()
			switch {
			case isWindow:
				size, at, held := d.size(k.Kind()), at[k.Span()], f.Held[k]
				if capacity = l.Windows[k]; fitsBeside(c.Window[k], capacity, size, held, at) {
					continue
				}
				wait = releaseIn(c.Window[k], capacity, size, at)
				if held > 0 {
					wait = f.wait(wait, windowReleaseBeside(c.Window[k], capacity, size, held, at), d.Now)
					if fits(c.Window[k], capacity, size, at) {
						floor = f.By[k]
					}
				}
			case p == BucketPart:
				held := f.Held[BucketShare]
				if l.Bucket.fits(c.Deficit + held) {
					continue
				}
				capacity, wait = l.Bucket.Burst, l.Bucket.releaseIn(c.Deficit)
				if held > 0 {
					wait = f.wait(wait, l.Bucket.releaseIn(c.Deficit+held), d.Now)
					if l.Bucket.fits(c.Deficit) {
						floor = f.By[BucketShare]
					}
				}
			case p == SlotsPart:
				if capacity = l.Concurrent.Max; c.Slots < capacity {
					continue
				}
				ref.UntilFreed = true
			case p == FloorsPart: // each share refuses beside its floors
				continue
			case p == NotifyPart:
				continue
			case p == LearnedPart:
				var refuses bool
				if capacity, wait, floor, refuses = learnedRefusal(c.Extra().Learned, f, d); !refuses {
					continue
				}
			default:
				b := p.Budget()
				if capacity = l.Budgets.Max[b]; fitsBudget(c.Spent[b], c.Reserved[b], capacity, d.Reserve.Cost) {
					continue
				}
				wait, ref.Exhausted = l.Budgets.Calendar.renewsIn(b, d.Now), true
				if ref.First < 0 {
					ref.Period, ref.Used, ref.RenewsAt = b, c.Spent[b]+c.Reserved[b], d.Now.UnixMillis+wait
				}
			}
			if ref.First < 0 {
				ref.First, ref.Kind, ref.Capacity, ref.Floor = i, p.refusalKind(), capacity, floor
				if isWindow {
					ref.Window = k
				}
			}
			ref.WaitMillis = max(ref.WaitMillis, wait)
		}
	}
	return ref
}

// retryAfterSeconds is the wait rounded up to whole seconds, at least 1.
func (r Refusal) RetryAfterSeconds() int64 { return CeilSeconds(r.WaitMillis, 1) }

func CeilSeconds(millis, atLeast int64) int64 {
	return max((millis+999)/1000, atLeast)
}
