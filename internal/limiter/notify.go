package limiter

// A limit may name fractions of its caps (Caps.Notify) at which its ids'
// crossings are reported: the admission that first takes a cap's level to
// or past a fraction reports it, in the same atomic step as it decides,
// so that across every replica each crossing is reported once. A window's
// and a budget's crossing is reported once per period (its minute or day,
// the budget's day or month); a bucket's and the requests in flight's
// again only after their level fell back below the fraction, as an
// admission saw it. The notify part keeps, per cap, the period of its
// last report and how many of the fractions it reported (NotifyState).
//
// A level is what the cap counts after the admission (or, for a refused
// one, as it read it): a window's estimate, the bucket's deficit, the
// requests in flight, what a budget holds spent and reserved. It reaches
// a fraction f of a cap c at ceil(f × c) exactly, in integers (a window's
// in its span's units times its length), which admit.lua gets from the
// gateway (notifyArgs) rather than computes in its doubles.

// MaxNotify is how many fractions a limit may notify at.
const MaxNotify = 8

// notifiable are the parts whose levels the notify part watches: the
// windows, the bucket, the requests in flight and the budgets. (What a
// limit learned is the provider's, and the floors are shares of the
// others.)
const notifiable partSet = 1<<LearnedPart - 1

// NotifyState is what the notify part holds of one cap: the period of its
// last report (0 for the bucket and the requests in flight, which have
// none) times 16, plus how many of the fractions it reported in it.
type NotifyState int64

func notifyState(period int64, reported int) NotifyState {
	return NotifyState(period*16 + int64(reported))
}

func (s NotifyState) period() int64 { return FloorDiv(int64(s), 16) }
func (s NotifyState) reported() int { return int(int64(s) - s.period()*16) }

// NumNotify is how many fractions c notifies at.
func (c *Caps) NumNotify() int {
	n := 0
	for n < MaxNotify && c.Notify[n] > 0 {
		n++
	}
	return n
}

// notified are the parts of c whose crossings its notify part reports.
func (c *Caps) notified() partSet {
	if c.Notify[0] == 0 {
		return 0
	}
	return c.parts() & notifiable
}

// whole is what the level of c's part p is at its cap, in the level's
// units: a window's cap in its span's units times its length, the bucket's
// burst in micro-tokens, the most requests in flight, a budget's
// nano-dollars.
func (c *Caps) whole(p Part) int64 {
	if k, ok := p.Window(); ok {
		return c.Windows[k] * Spans[k.Span()].Length
	}
	switch p {
	case BucketPart:
		return c.Bucket.Burst * MicroTokens
	case SlotsPart:
		return c.Concurrent.Max
	}
	return c.Budgets.Max[p.Budget()]
}

// threshold is the level at which c's part p reaches its i-th fraction:
// the fraction of whole, rounded up.
func (c *Caps) threshold(p Part, i int) int64 {
	return CeilDiv(int64(c.Notify[i])*c.whole(p), 100)
}

// level is the level of c's part p in counts at now (at: its position in
// each span).
func (c *Caps) level(p Part, counts *Counts, at [2]Position) int64 {
	if k, ok := p.Window(); ok {
		return counts.Window[k].weighted(at[k.Span()].into, Spans[k.Span()].Length)
	}
	switch p {
	case BucketPart:
		return counts.Deficit
	case SlotsPart:
		return counts.Slots
	}
	return counts.Spent[p.Budget()] + counts.Reserved[p.Budget()]
}

// notifyPeriod is the period in which l's part p reports each fraction
// once at now, and its first moment (unix milliseconds): a window's period
// of its span, a budget's first minute; 0 for the bucket and the requests
// in flight, which report a fraction again once their level fell below it.
func notifyPeriod(l Limit, p Part, at [2]Position, now moment) (period, start int64) {
	if k, ok := p.Window(); ok {
		return at[k.Span()].Period, now.UnixMillis - at[k.Span()].intoMillis
	}
	if p.isBudget() {
		start = l.Budgets.Calendar.SpanAt(p.Budget(), now).Start
		return FloorDiv(start, MinuteMillis), start
	}
	return 0, 0
}

// noticed is what l's notify part holds of each of its caps once an
// admission at now left l's counts as c (or read them so, refused): how
// many fractions the level reached, or, for a window and a budget in the
// period of their last report, as many as c's notify part held if more.
func (c *Counts) noticed(l Limit, now moment) [LearnedPart]NotifyState {
	at := [...]Position{now.In(Minute), now.In(Day)}
	notified := c.Extra().Notified
	for p := range l.notified().All {
		reached := l.reached(p, l.level(p, c, at))
		period, _ := notifyPeriod(l, p, at, now)
		held := notified[p]
		if period != 0 && held.period() == period {
			reached = max(reached, held.reported())
		}
		notified[p] = notifyState(period, reached)
	}
	return notified
}

// reached is how many of c's fractions the level of its part p reached.
func (c *Caps) reached(p Part, level int64) int {
	n := 0
	for n < c.NumNotify() && level >= c.threshold(p, n) {
		n++
	}
	return n
}

// Crossing is a fraction of a cap of a limit of a chain that an admission
// was the first to reach.
type Crossing struct {
	Limit   int   // the limit's index in the chain
	Part    Part  // the cap
	Percent uint8 // the fraction, in percent
	// Period is the first moment (unix milliseconds) of the window's or
	// budget's period in which it is reported; 0 for the bucket and the
	// requests in flight.
	Period int64
	// Level and Whole are the cap's level after the admission and its cap,
	// in the level's units (Caps.whole).
	Level, Whole int64
}

// Crossings are the fractions of the caps of chain that the admission d
// reached first, in chain and part order: those of a window or a budget
// not yet reported in its period, those of the bucket and the requests in
// flight that the level the admission read was below.
func Crossings(chain []Limit, d Decision) []Crossing {
	var out []Crossing
	at := [...]Position{d.Now.In(Minute), d.Now.In(Day)}
	for i, l := range chain {
		if l.Notify[0] == 0 {
			continue
		}
		after := d.Counts[i]
		if d.Admitted {
			d.AddTo(l, &after)
		}
		noticed := after.noticed(l, d.Now)
		for p := range l.notified().All {
			before, now := d.Counts[i].Extra().Notified[p], noticed[p]
			from := before.reported()
			switch {
			case before.period() != now.period():
				from = 0
			case now.period() == 0: // fallen back below since its report?
				from = min(from, l.reached(p, l.level(p, &d.Counts[i], at)))
			}
			if from >= now.reported() {
				continue
			}
			_, start := notifyPeriod(l, p, at, d.Now)
			level := l.level(p, &after, at)
			for _, pct := range l.Notify[from:now.reported()] {
				out = append(out, Crossing{Limit: i, Part: p, Percent: pct, Period: start, Level: level, Whole: l.whole(p)})
			}
		}
	}
	return out
}

// notifyArgs appends the notify part's arguments of a call whose keys name
// the minute period atMinute: how many fractions, then for each notified
// cap (a budget's first minute of its current period before it) the
// threshold of each fraction.
func (c *Caps) notifyArgs(a *callArgs, atMinute int64) {
	n := c.NumNotify()
	a.hex(int64(n))
	for p := range c.notified().All {
		if p.isBudget() {
			a.hex(FloorDiv(c.Budgets.Calendar.Span(p.Budget(), atMinute).Start, MinuteMillis))
		}
		for i := range n {
			a.hex(c.threshold(p, i))
		}
	}
}
