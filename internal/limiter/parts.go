package limiter

import (
	"math/bits"
	"sync/atomic"
)

// Part is one thing a limit counts, whose counters the stores keep: a
// window (its number is its WindowKind), the token bucket, the requests in
// flight, or a budget. A limit's parts, in Part order, are the layout that
// every reader of its counters shares (Caps.Parts): the keys of a call of
// admit.lua, its caps' arguments and its reply, the decoder, AddTo,
// the refusal, the reset and the in-process store. admit.lua numbers them
// alike. A new kind of cap is a Part, its case in the functions below and
// in the in-process store, and its arithmetic in admit.lua.
type Part uint8

const (
	// The windows are parts 0 to NumWindows-1, by WindowKind.
	BucketPart Part = Part(NumWindows) + iota
	SlotsPart
	DayBudgetPart
	MonthBudgetPart
	// LearnedPart is the provider's own quota, as the limit learned it.
	LearnedPart
	// FloorsPart is what the limit's floors keep for their classes
	// (floors.go): it refuses nothing itself, but takes from the room of
	// each of the other parts it divides.
	FloorsPart
	// NotifyPart is what the limit last reported of its caps' crossings
	// (notify.go): it refuses nothing.
	NotifyPart
	NumParts
)

// WindowPart is the part of window k.
func WindowPart(k WindowKind) Part { return Part(k) }

// BudgetPart is the part of budget p.
func BudgetPart(p BudgetPeriod) Part { return DayBudgetPart + Part(p) }

// Window is a window part's window, and whether p is one.
func (p Part) Window() (WindowKind, bool) { return WindowKind(p), p < Part(NumWindows) }

// Budget is a budget part's period.
func (p Part) Budget() BudgetPeriod { return BudgetPeriod(p - DayBudgetPart) }

// isBudget reports whether p is a budget's part.
func (p Part) isBudget() bool { return p == DayBudgetPart || p == MonthBudgetPart }

// String is the part's name in the admin API's reset: a window's cap, or
// "bucket", "concurrent", "budget_day" or "budget_month".
func (p Part) String() string {
	if k, ok := p.Window(); ok {
		return k.String()
	}
	switch p {
	case BucketPart:
		return "bucket"
	case SlotsPart:
		return "concurrent"
	case LearnedPart:
		return "learn"
	case FloorsPart:
		return "floors"
	case NotifyPart:
		return "notify"
	}
	return p.Budget().CapName()
}

// refusalKind is what a refusal by the part says it refused on.
func (p Part) refusalKind() kind {
	if k, ok := p.Window(); ok {
		return k.Kind()
	}
	switch p {
	case BucketPart:
		return Burst
	case SlotsPart:
		return Concurrency
	case LearnedPart:
		return Provider
	}
	return Budget
}

// cachedRefusal reports whether the Redis store's refusal cache keeps the
// part's refusals: those of a request window and of the bucket, which end
// at a moment the refusal tells. The others it leaves to Redis: a token
// window's and a budget's depend on the request's reservation, and
// requests in flight end at no moment known.
func (p Part) cachedRefusal() bool {
	k, ok := p.Window()
	return ok && k.Kind() == Requests || p == BucketPart
}

// KeptByReset reports whether the admin API's reset keeps what the part
// counts: the requests in flight, which are still in flight, what a
// budget holds, which was spent, what the provider said of its quota,
// which is the provider's to say, and what the classes of the floors
// used, which ages out as the windows slide and the deficits refill, and
// what the limit reported of its crossings in their periods.
func (p Part) KeptByReset() bool { return p >= SlotsPart }

// replies is how many numbers the reply of a call of admit.lua gives of
// c's part p: one for each of its keys (a window's current and previous
// count, the bucket's deficit, the slots in flight, a budget's spent and
// reserved); for the learned quota, until when it is paused and where
// from, then each quota's limit, deficit, rate, end, report's moment and
// where from (LearnedCounts); for the floors, what they hold of each share
// c has and by which class, then until when (FloorCounts); for notify,
// what it holds of each cap it watches (NotifyState).
func (c *Caps) replies(p Part) int {
	switch _, window := p.Window(); {
	case window || p.isBudget():
		return 2
	case p == LearnedPart:
		return 2 + 6*NumLearned
	case p == FloorsPart:
		return 2*c.floorShares() + 1
	case p == NotifyPart:
		return bits.OnesCount16(uint16(c.notified()))
	}
	return 1
}

// floorShares is how many shares c's floors divide: each window it caps,
// its bucket, the learned quotas.
func (c *Caps) floorShares() int {
	n := bits.OnesCount8(c.Capped)
	if c.Bucket.Rate > 0 {
		n++
	}
	if c.Learn {
		n += NumLearned
	}
	return n
}

// eachShare yields the shares c's floors divide, in share order.
func (c *Caps) eachShare(yield func(int) bool) {
	for k := range c.Each {
		if !yield(int(k)) {
			return
		}
	}
	if c.Bucket.Rate > 0 && !yield(BucketShare) {
		return
	}
	if c.Learn {
		for k := range NumLearned {
			if !yield(LearnedShare(k)) {
				return
			}
		}
	}
}

// partSet is a set of parts: bit p is set where part p is in it.
type partSet uint16

// splitParts are the parts that count a reservation's input or output
// apart: those windows, and the learned quotas (Anthropic's input and
// output tokens).
const splitParts partSet = 1<<ITPM | 1<<OTPM | 1<<ITPD | 1<<OTPD | 1<<LearnedPart

// parts are the parts c has.
func (c *Caps) parts() partSet {
	m := partSet(c.Capped)
	if c.Bucket.Rate > 0 {
		m |= 1 << BucketPart
	}
	if c.Concurrent.Max > 0 {
		m |= 1 << SlotsPart
	}
	for p, budget := range c.Budgets.Max {
		if budget > 0 {
			m |= 1 << BudgetPart(BudgetPeriod(p))
		}
	}
	if c.Learn {
		m |= 1 << LearnedPart
	}
	if c.Floors[0] > 0 {
		m |= 1 << FloorsPart
	}
	if c.Notify[0] > 0 {
		m |= 1 << NotifyPart
	}
	return m
}

// All yields the parts of s, in Part order. (A loop over c.parts().All
// compiles to a plain loop, where a loop over c.Parts calls its body once
// per part.)
func (s partSet) All(yield func(Part) bool) {
	for ; s != 0; s &= s - 1 {
		if !yield(Part(bits.TrailingZeros16(uint16(s)))) {
			return
		}
	}
}

// Parts yields the parts c has, in Part order.
func (c *Caps) Parts(yield func(Part) bool) { c.parts().All(yield) }

// Has reports whether c has part p.
func (c *Caps) Has(p Part) bool { return c.parts()&(1<<p) != 0 }

// Without leaves part p out of c.
func (c *Caps) Without(p Part) {
	if k, ok := p.Window(); ok {
		c.Windows[k] = 0
		c.Capped = c.Windows.Mask()
		return
	}
	switch p {
	case BucketPart:
		c.Bucket = TokenBucket{}
	case SlotsPart:
		c.Concurrent = concurrencyCap{}
	case LearnedPart:
		c.Learn = false
	case FloorsPart:
		c.Floors = [MaxFloors]uint8{}
	case NotifyPart:
		c.Notify = [MaxNotify]uint8{}
	default:
		c.Budgets.Max[p.Budget()] = 0
	}
}

// writeKeys writes the keys of l's part p in a call of admit.lua whose
// minute period is atMinute: a window's current period and previous one,
// the bucket's, the slots', a budget's spent and reserved in its current
// period.
func writeKeys(keys *cutText, l Limit, p Part, atMinute int64) {
	if k, ok := p.Window(); ok {
		b := atMinute
		if k.Span() == Day {
			b = DayOf(atMinute)
		}
		writePeriodKey(&keys.text, l.Prefix, k, b)
		keys.end()
		writePeriodKey(&keys.text, l.Prefix, k, b-1)
		keys.end()
		return
	}
	switch p {
	case BucketPart:
		writeBucketKey(&keys.text, l)
		keys.end()
	case SlotsPart:
		writeSlotsKey(&keys.text, l)
		keys.end()
	case LearnedPart:
		writeLearnedKey(&keys.text, l.Prefix)
		keys.end()
	case FloorsPart:
		for class := range l.NumFloors() {
			for k := range l.Each {
				writeKeys(keys, l.ofClass(uint8(class+1)), WindowPart(k), atMinute)
			}
		}
		writeFloorsKey(&keys.text, l.Prefix)
		keys.end()
	case NotifyPart:
		writeNotifyKey(&keys.text, l.Prefix)
		keys.end()
	default:
		s := l.Budgets.Calendar.Span(p.Budget(), atMinute)
		s.writeKey(&keys.text, l.Prefix, p.Budget(), false)
		keys.end()
		s.writeKey(&keys.text, l.Prefix, p.Budget(), true)
		keys.end()
	}
}

// writeArgs appends c's caps of part p to a call's arguments: a window's
// cap; the bucket's rate (milli-tokens per second), burst and cost; the
// most requests in flight and the lease of a slot (milliseconds); a
// budget's cap (nano-dollars); the floors' percents, a byte each; the
// notify part's thresholds (notifyArgs) in the call's minute period
// atMinute. The learned quota has none: the provider's answers give them.
func (c *Caps) writeArgs(a *callArgs, p Part, atMinute int64) {
	if k, ok := p.Window(); ok {
		a.hex(c.Windows[k])
		return
	}
	switch p {
	case BucketPart:
		a.hex(c.Bucket.Rate)
		a.hex(c.Bucket.Burst)
		a.hex(c.Bucket.Cost)
	case SlotsPart:
		a.hex(c.Concurrent.Max)
		a.hex(c.Concurrent.LeaseMillis)
	case LearnedPart:
	case FloorsPart:
		a.args = append(a.args, string(c.Floors[:c.NumFloors()]))
	case NotifyPart:
		c.notifyArgs(a, atMinute)
	default:
		a.hex(c.Budgets.Max[p.Budget()])
	}
}

// partsArgs are, for each mask of parts, the parts as admit.lua reads them:
// a byte each. Each is made and boxed on first use, once.
var partsArgs [1 << NumParts]atomic.Value

// partsArg is the argument of the parts of c.
func (c *Caps) partsArg() any {
	m := c.parts()
	if arg := partsArgs[m].Load(); arg != nil {
		return arg
	}
	var parts []byte
	for p := range m.All {
		parts = append(parts, byte(p))
	}
	partsArgs[m].Store(string(parts))
	return partsArgs[m].Load()
}

// read reads part p of caps from the start of a reply into c, and returns
// the rest.
func (c *Counts) read(caps *Caps, p Part, r []int64) []int64 {
	if k, ok := p.Window(); ok {
		c.Window[k] = Window{Cur: r[0], Prev: r[1]}
		return r[2:]
	}
	switch p {
	case BucketPart:
		c.Deficit = r[0]
	case SlotsPart:
		c.Slots = r[0]
	case LearnedPart:
		learned := &c.fillExtra().Learned
		learned.PausedUntil, learned.PausedFrom = r[0], r[1]
		for k := range learned.Quotas {
			q := r[2+6*k:]
			learned.Quotas[k] = LearnedCount{Limit: q[0], Deficit: q[1], RatePico: q[2], Until: q[3], Reported: q[4], From: q[5]}
		}
	case FloorsPart:
		floors, at := &c.fillExtra().Floors, 0
		for share := range caps.eachShare {
			floors.Held[share], floors.By[share] = r[at], uint8(r[at+1])
			at += 2
		}
		floors.Until = r[at]
	case NotifyPart:
		notified, at := &c.fillExtra().Notified, 0
		for q := range caps.notified().All {
			notified[q] = NotifyState(r[at])
			at++
		}
	default:
		c.Spent[p.Budget()], c.Reserved[p.Budget()] = r[0], r[1]
	}
	return r[caps.replies(p):]
}
