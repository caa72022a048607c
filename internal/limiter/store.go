package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rolter/caddy-ratelimit/internal/pricing"
)

// store keeps the counters. Both implementations (Redis and in-process) pass
// the same conformance suite (store_test.go).
type Store interface {
	// admit decides one request against every limit of chain in one atomic
	// step: admitted only if every window of every limit fits (a token
	// window fits while its estimate plus the part of reserve it counts is
	// within it; without a reservation, while the estimate is below it),
	// every bucket, every concurrency cap has a slot free, and every budget
	// has room for reserve's cost (budget.go); then charged one request on
	// every request window, its cost on every bucket, reserve on every
	// token window (its total on tpm and tpd, its input on itpm and itpd,
	// its output on otpm and otpd), one slot of every concurrency cap, which
	// free gives back, and reserve's cost on what every budget holds
	// reserved; refused and charged nothing otherwise. A refusal says why, and may come from the store's own
	// record of what it refused (the Redis store's refusal cache) without
	// asking its backend.
	Admit(ctx context.Context, chain []Limit, reserve TokenCounts) (Admission, error)
	// free gives back the slots an admitted request of chain took, once,
	// when it ends, without making its caller wait. A free that fails is
	// not retried: the store's next renewal of its slots mends it
	// (slots.go).
	Free(chain []Limit)
	// refusedUnread answers a refusal of chain that no request body can
	// change (by a request window, a bucket or a concurrency cap) when the
	// store knows it without its backend, so that the body of a request
	// already refused is never read; it charges nothing.
	RefusedUnread(chain []Limit) (Admission, bool)
	// peek reads the chain's counters as admit would, and charges nothing.
	Peek(ctx context.Context, chain []Limit) (Decision, error)
	// Learn writes what the provider's answer to a request of chain
	// reported of its quota to every limit of chain that learns it,
	// without making its caller wait: done gets the outcome, once, as
	// charge's does. It is never replayed.
	Learn(chain []Limit, r Report, done func(error))
	// charge charges c to every token window and budget of chain, without
	// making its caller wait: done gets the outcome, once, from another goroutine or
	// before charge returns. It is never replayed: a double charge would
	// outlive the failure.
	Charge(chain []Limit, c Charge, done func(error))
	// Tally adds n of measure m to the top-consumer tallies of each id of
	// ids in the current day and month of calendar c, without making its
	// caller wait (top.go).
	Tally(c *Calendar, ids []TopID, m TopMeasure, n int64)
	// Top answers the n ids of scope with the most of measure m in its
	// tally of period p, the one holding now by calendar c, most first.
	Top(ctx context.Context, c *Calendar, scope string, m TopMeasure, p BudgetPeriod, n int) (TopTally, error)
	// reset clears l's window counters and its token bucket, and keeps its
	// slots and budgets (the admin API's reset); it answers what it cleared by name.
	Reset(ctx context.Context, l Limit) (cleared []string, err error)
	// describe says what the store is, for the admin API's live view.
	Describe() storeDescription
	// hold keeps the store usable, even after the last config that uses it
	// is unloaded, until the matching release: a response or session
	// admitted under an old config still charges its tokens.
	Hold()
	Release()
}

// storeDescription is what a store is: stores that describe alike share
// their counters.
type storeDescription struct {
	Kind  string // "memory" or "redis"
	Where string // a Redis store's servers; "" in process
	// tagged: every key of a chain carries its root's hash tag (Redis
	// Cluster), so that counters are read under a root.
	Tagged bool
}

// charge is tokens added to the token windows after a response, and its
// cost to the budgets: a reactive charge in the current periods, or a
// settlement, which replaces a reservation by the usage reported and goes
// in the periods the reservation was made in: tokens are then the
// difference, and may be negative, and the reserved cost is taken back
// from the budgets' reservations (unreserve) as the cost is added to what
// they hold spent. A settlement never takes a counter below zero, and
// changes nothing in a window whose period it is out of (older than the
// previous minute, or the previous day), nor in a budget period that has
// ended. A reset of a limit after the reservation's admission took the
// reservation from its windows (the admin API's reset): a settlement then adds its
// reservation back to them with the difference, which charges what the
// request used (windowTokens).
type Charge struct {
	Tokens    TokenCounts // tokens.cost is added to what the budgets hold spent
	Unreserve int64       // nano-dollars the budgets hold reserved for the request
	Minute    int64       // the reservation's minute period (unix_seconds / 60), and its day; 0: the current ones
	// A settlement's reservation: when it was admitted (unix milliseconds,
	// by the store's clock), and what it reserved on the token windows.
	admitted int64
	reserved TokenCounts
}

// settling is c as the settlement of the reservation that the admission d
// made: in its periods, giving back its reserved cost.
func (c Charge) Settling(d Decision) Charge {
	c.Minute, c.admitted, c.reserved, c.Unreserve = d.Now.Minute, d.Now.UnixMillis, d.Reserve, d.Reserve.Cost
	return c
}

// settles reports whether c may change a counter of window k at now: it
// has tokens of k's kind, or reserved some, and its period is still in k's
// window.
func (c Charge) settles(k WindowKind, now moment) bool {
	if c.Tokens.Of(k.Kind()) == 0 && c.reserved.Of(k.Kind()) == 0 {
		return false
	}
	return c.Minute == 0 || c.periodIn(k.Span()) >= now.In(k.Span()).Period-1
}

// windowTokens is what c adds to a window that counts k, whose limit was
// last reset at resetAt (unix milliseconds; 0: never): the difference, and
// what the reservation held if the reset came after its admission. A
// request admitted in the very millisecond of the reset, before it, is
// taken as admitted after it: its settlement charges only what it used
// beyond its reservation, and never anything twice.
func (c Charge) windowTokens(k kind, resetAt int64) int64 {
	n := c.Tokens.Of(k)
	if resetAt > c.admitted {
		n += c.reserved.Of(k)
	}
	return n
}

// changes reports whether c changes a counter of chain at now.
func (c Charge) changes(chain []Limit, now moment) bool {
	for _, l := range chain {
		for k := range l.Each {
			if k.Kind() != Requests && c.settles(k, now) {
				return true
			}
		}
		for p := range l.EachBudget {
			if c.settlesBudget(l.Budgets.Calendar, p, now) {
				return true
			}
		}
	}
	return false
}

// periodIn is c's period in span s; 0 is the current one.
func (c Charge) periodIn(s span) int64 {
	if s == Day && c.Minute != 0 {
		return DayOf(c.Minute)
	}
	return c.Minute
}

// admission is a store's answer to a request.
type Admission struct {
	Decision
	// limits are the limits whose counters decision holds, in chain order:
	// the chain, or, for a refusal answered by the refusal cache, the
	// chain's limits that the cache refuses.
	Limits []Limit
	// refusal says why a refused request is refused; first is -1 for an
	// admitted one.
	Refusal Refusal
}

// admissionOf is the answer that the decision d of the store's backend on
// chain gives. A refusal that no limit's counts explain is a bad reply.
func admissionOf(chain []Limit, d Decision) (Admission, error) {
	a := Admission{Decision: d, Limits: chain, Refusal: Refusal{First: -1}}
	if !d.Admitted {
		if a.Refusal = RefusalOf(chain, d); a.Refusal.First < 0 {
			return Admission{}, ErrBadReply
		}
	}
	return a, nil
}

// lifetime closes a store once it is both unloaded and released by every
// holder.
type lifetime struct {
	holders  atomic.Int64
	unloaded atomic.Bool
	once     sync.Once
}

func (l *lifetime) Hold() { l.holders.Add(1) }

func (l *lifetime) release(close func()) {
	if l.holders.Add(-1) == 0 && l.unloaded.Load() {
		l.once.Do(close)
	}
}

// unload is called when no loaded config uses the store any more.
func (l *lifetime) unload(close func()) {
	l.unloaded.Store(true)
	if l.holders.Load() == 0 {
		l.once.Do(close)
	}
}

// limit is one configured cap applied to one scope id of a request.
type Limit struct {
	Scope  string // the scope's name, for messages and logs
	ID     string // the id as it appears in keys: digested unless its scope is readable
	Prefix string // of the limit's keys: keys.go spells them
	// Class is the request's class on the limit's floors: the first floor
	// (1-based) whose scope id its chain has; 0 for none (floors.go).
	Class uint8
	// The caps, shared by every limit of one line and never changed once
	// a limit has them: a chain is copied and walked many times a request,
	// and the caps are most of a limit's size.
	*Caps
}

// limitCaps are what one limit caps.
type Caps struct {
	Windows    WindowCaps
	Capped     uint8 // bit k: windows[k] is capped
	Bucket     TokenBucket
	Concurrent concurrencyCap
	Budgets    BudgetCaps
	// shadow: the limit is counted as the others are, in the same atomic
	// step, but never refuses (the module's shadow limits).
	Shadow bool
	// Learn: the limit learns the provider's own quota from its answers
	// (Store.Learn), and admits within what it learned (learned.go).
	Learn bool
	// Floors are the percents of each share of the limit that the
	// floors of classes 1, 2, … keep for their requests while they ask
	// (floors.go); 0 ends them.
	Floors [MaxFloors]uint8
	// Notify are the fractions of each of the limit's caps, in whole
	// percents from low to high, whose crossings its ids report once
	// (notify.go); 0 ends them.
	Notify [MaxNotify]uint8
}

// windowLimitCaps are the caps of windows w, without a bucket.
func CapsOfWindows(w WindowCaps) Caps { return Caps{Windows: w, Capped: w.Mask()} }

// meters reports whether a token window or a budget is capped: the
// request's usage is then metered.
func (c *Caps) Meters() bool {
	return c.capsTokens() || c.Budgets.Max != [NumBudgetPeriods]int64{}
}

// capsTokens reports whether a token window is capped.
func (c *Caps) capsTokens() bool { return c.Capped&^(1<<RPM|1<<RPD) != 0 }

// each yields the windows the limit caps, in windowKind order, with their
// caps: most limits cap two of the eight, and a request walks them a few
// times.
func (c *Caps) Each(yield func(WindowKind, int64) bool) {
	for m := c.Capped; m != 0; m &= m - 1 {
		k := WindowKind(bits.TrailingZeros8(m))
		if !yield(k, c.Windows[k]) {
			return
		}
	}
}

// describe is the caps after name, for the log.
func (c Caps) Describe(name string) string {
	var s strings.Builder
	s.WriteString(name)
	for k, n := range c.Windows {
		if n > 0 {
			fmt.Fprintf(&s, " %s %d", WindowKind(k), n)
		}
	}
	if c.Bucket.Rate > 0 {
		fmt.Fprintf(&s, " rate %s burst %d cost %d", c.Bucket.RateText, c.Bucket.Burst, c.Bucket.Cost)
	}
	if c.Concurrent.Max > 0 {
		fmt.Fprintf(&s, " concurrent %d", c.Concurrent.Max)
	}
	for p, budget := range c.EachBudget {
		fmt.Fprintf(&s, " %s %s", p.CapName(), pricing.FormatUSD(budget))
	}
	if c.Budgets.Calendar != nil {
		fmt.Fprintf(&s, " (%s)", c.Budgets.Calendar.Name)
	}
	if c.Learn {
		s.WriteString(" learn")
	}
	if n := c.NumNotify(); n > 0 {
		s.WriteString(" notify")
		for _, pct := range c.Notify[:n] {
			fmt.Fprintf(&s, " %d%%", pct)
		}
	}
	if c.Shadow {
		s.WriteString(" shadow")
	}
	return s.String()
}

// newTaggedLimit is a limit whose keys carry a Redis Cluster hash tag,
// "{<root-scope>:<root-id>}:", so that every key of a chain is in one slot;
// tag is "" elsewhere.
func NewLimit(tag, scope, id string, caps Caps) Limit {
	l := []Limit{{Scope: scope, ID: id, Caps: &caps}}
	TagPrefixes(tag, l)
	return l[0]
}

// counts are a limit's counters as an admission read them, before the
// admitted request was charged.
type Counts struct {
	Window  [NumWindows]Window // by windowKind; only the capped ones are read
	Deficit int64              // the bucket's, refilled to the store's clock
	Slots   int64              // the concurrency cap's slots held, by every holder
	// spent and reserved are each budget's, in its current period, by
	// budgetPeriod.
	Spent, Reserved [NumBudgetPeriods]int64
	// extra are the counts of the parts few limits have (Extra), nil for a
	// limit with none of them. They are three times the size of the
	// others, which every admission reads, copies and allocates for each
	// limit of its chain. Copies of counts share them: a store fills them
	// in as it reads them (fillExtra), and any other change is to a copy
	// (ownExtra).
	extra *ExtraCounts
}

// ExtraCounts are what a limit that learns the provider's quota, has floors
// or notifies reads of those parts.
type ExtraCounts struct {
	Learned LearnedCounts // a limit that learns the provider's quota
	Floors  FloorCounts   // what a limit's floors hold for other classes
	// Notified is what a limit that notifies reported of its caps, by
	// part (notify.go).
	Notified [LearnedPart]NotifyState
}

// noExtra is what counts without extra counts read of them: zeros, never
// written.
var noExtra ExtraCounts

// Extra is c's extra counts, to read and never to write: copies of c share
// them, and counts without them all read the same zeros.
func (c *Counts) Extra() *ExtraCounts {
	if c.extra == nil {
		return &noExtra
	}
	return c.extra
}

// ownExtra is c's extra counts, to write: a copy of those c shared with
// the counts it was copied from, or zeros.
func (c *Counts) ownExtra() *ExtraCounts {
	e := new(ExtraCounts)
	if c.extra != nil {
		*e = *c.extra
	}
	c.extra = e
	return e
}

// fillExtra is the extra counts of c, counts a store is reading afresh, to
// fill in: made once, whichever part comes first.
func (c *Counts) fillExtra() *ExtraCounts {
	if c.extra == nil {
		c.extra = new(ExtraCounts)
	}
	return c.extra
}

// decision is what a store answers to an admission.
type Decision struct {
	Admitted bool
	Now      moment   // the store's clock (Redis TIME for the Redis store)
	Counts   []Counts // one per limit of the chain, in chain order
	// reserve is the tokens the admission reserves on the token windows of
	// its chain, in their current periods (its size against them).
	Reserve TokenCounts
}

// size is what an admission of d adds to a counter of kind k (a budget's
// reservation: budget).
func (d Decision) size(k kind) int64 { return d.Reserve.Of(k) }

// AddTo makes c, the counts of limit l that d read, the counts d's
// admission leaves, part by part, in place (a copy in and out would cost
// an admission more than its arithmetic): its size added to the current
// period of each window l caps, l's cost to its bucket's deficit, a slot
// to its concurrency cap's, and the reserved cost to what its budgets hold
// reserved. The in-process store writes them, a call of admit.lua replays
// them for the admissions after, and the headers of an admitted request
// count it in them.
func (d Decision) AddTo(l Limit, c *Counts) {
	for p := range l.parts().All {
		if k, ok := p.Window(); ok {
			c.Window[k].Cur += d.size(k.Kind())
			continue
		}
		switch p {
		case BucketPart:
			c.Deficit += l.Bucket.Cost * MicroTokens
		case SlotsPart:
			c.Slots++
		case LearnedPart:
			learned := &c.ownExtra().Learned
			for k, q := range learned.Quotas {
				if q.Limit > 0 {
					learned.Quotas[k].Deficit += d.size(learnedKinds[k]) * MicroTokens
				}
			}
		case FloorsPart, NotifyPart: // the floors' hold is other classes'; noticed follows the notify part
		default:
			c.Reserved[p.Budget()] += d.Reserve.Cost
		}
	}
}

// errBadReply marks a store answer of the wrong shape; it is handled like an
// outage.
var ErrBadReply = errors.New("rolter_ratelimit: unexpected reply from the store")

// resetNames is what a reset of l clears, by name: each part it has that
// the reset does not keep (each window it caps, then "bucket").
func resetNames(l Limit) []string {
	names := make([]string, 0, NumWindows+1)
	for p := range l.parts().All {
		if !p.KeptByReset() {
			names = append(names, p.String())
		}
	}
	return names
}
