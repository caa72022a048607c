package limiter

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	_ "time/tzdata" // budget_timezone names a zone whether or not the machine has a zoneinfo database
)

// Spend budgets. A limit may cap what its scope id spends per calendar
// day and per calendar month (budget_day, budget_month), in US dollars, at
// the prices of the models its requests ask for (internal/pricing). Money
// is an int64 of nano-dollars throughout, never a float.
//
// Each budget's period keeps two counters: what is spent (the costs of
// the responses settled in it) and what is reserved (the largest costs of
// the requests admitted in it and not yet settled). A request is admitted
// only if, for every budget of its chain, spent + reserved + its largest
// cost is within the budget, in the same atomic step as everything else
// it is admitted on; it then adds its largest cost to what is reserved.
// When its response ends, the reservation is taken back from what is
// reserved and the real cost added to what is spent, in the period the
// reservation was made in, even if it has just ended (a response that
// runs past midnight is spent in the day it was admitted in), never taking
// a counter below zero. Periods before the previous one are left alone:
// no response outlives them. A
// settlement that fails is not retried (money is never replayed): its
// reservation then stays counted until its period ends, so spend is
// over-counted rather than lost. A request that reserves nothing
// (reserve_tokens off, a realtime session) is admitted while spent +
// reserved is below the budget, and its cost is charged as its usage is
// reported. A request whose store fails is refused whatever
// on_redis_error says (admission.go).
//
// A period is a calendar day or month in the time zone of budget_timezone,
// decided by the store's clock: the keys a call names are those of the
// gateway's minute, and admit.lua runs nothing in another minute than its
// own (window.go). Every time zone starts its days on a whole minute, so
// the minute decides the day and the month too. A period's counters are
// named by its start, "<prefix>spent:day:<unix seconds>" and
// "<prefix>reserved:day:<unix seconds>" (month for a month), and live a
// few days past their period for the settlements of long responses.

// budgetPeriod is what a budget covers: a calendar day or month.
type BudgetPeriod uint8

const (
	BudgetDay BudgetPeriod = iota
	BudgetMonth
	NumBudgetPeriods
)

// String is the period's name in placeholders, metrics, messages and keys.
func (p BudgetPeriod) String() string { return [...]string{"day", "month"}[p] }

// capName is the budget's name in the config.
func (p BudgetPeriod) CapName() string { return "budget_" + p.String() }

// budgetCaps are a limit's spend budgets.
type BudgetCaps struct {
	Max      [NumBudgetPeriods]int64 // nano-dollars, by budgetPeriod; 0: none
	Calendar *Calendar               // whose days and months they cover; set with a budget
}

// eachBudget yields the budgets the limit caps, in budgetPeriod order.
func (c *Caps) EachBudget(yield func(BudgetPeriod, int64) bool) {
	for p, budget := range c.Budgets.Max {
		if budget > 0 && !yield(BudgetPeriod(p), budget) {
			return
		}
	}
}

// hasBudgets reports whether a limit of chain has a budget, an enforced
// one unless shadows count: its requests then need a price.
func HasBudgets(chain []Limit, shadows bool) bool {
	for _, l := range chain {
		if l.Budgets.Max != [NumBudgetPeriods]int64{} && (shadows || !l.Shadow) {
			return true
		}
	}
	return false
}

// fitsBudget reports whether an admission of cost fits a budget whose
// period holds spent and reserved: while spent + reserved + cost is within
// it, or, for a request that reserves nothing, while spent + reserved is
// below it.
func fitsBudget(spent, reserved, budget, cost int64) bool {
	if cost == 0 {
		return spent+reserved < budget
	}
	return spent+reserved+cost <= budget
}

// calendar is the days and months of one time zone. Calendars are shared
// by name, so that the caps of handlers with the same zone compare equal.
type Calendar struct {
	Name     string
	Location *time.Location
	// spans caches the periods of the last minute asked for: every
	// admission of a chain with budgets asks.
	spans atomic.Pointer[calendarMinute]
}

// calendarMinute is the periods that hold one minute period.
type calendarMinute struct {
	minute int64
	spans  [NumBudgetPeriods]periodSpan
}

// periodSpan is a budget period: its start and its end, in unix
// milliseconds, and the start in unix seconds as its keys name it.
type periodSpan struct {
	Start, End int64
	name       string
}

// writeKey writes to text the key of the budget period s, spent or
// reserved, of the limit with prefix.
func (s periodSpan) writeKey(text *strings.Builder, prefix string, p BudgetPeriod, reserved bool) {
	what := "spent:"
	if reserved {
		what = "reserved:"
	}
	text.WriteString(prefix)
	text.WriteString(what)
	text.WriteString(p.String())
	text.WriteByte(':')
	text.WriteString(s.name)
}

var calendars sync.Map // zone name → *calendar

// calendarOf is the calendar of the IANA time zone name ("" is UTC). Local
// is refused: gateways in different zones would disagree on the periods.
func CalendarOf(name string) (*Calendar, error) {
	if name == "" {
		name = "UTC"
	}
	if c, ok := calendars.Load(name); ok {
		return c.(*Calendar), nil
	}
	if name == "Local" {
		return nil, fmt.Errorf("budget_timezone must name an IANA time zone such as Europe/Paris, not Local: every gateway must agree on when a day starts")
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("budget_timezone %q is not an IANA time zone such as Europe/Paris or America/New_York", name)
	}
	c, _ := calendars.LoadOrStore(name, &Calendar{Name: name, Location: loc})
	return c.(*Calendar), nil
}

// span is the period p that holds the minute period minute.
func (c *Calendar) Span(p BudgetPeriod, minute int64) periodSpan {
	if m := c.spans.Load(); m != nil && m.minute == minute {
		return m.spans[p]
	}
	m := &calendarMinute{minute: minute}
	t := time.UnixMilli(minute * MinuteMillis).In(c.Location)
	y, mo, d := t.Date()
	m.spans[BudgetDay] = c.between(time.Date(y, mo, d, 0, 0, 0, 0, c.Location), time.Date(y, mo, d+1, 0, 0, 0, 0, c.Location))
	m.spans[BudgetMonth] = c.between(time.Date(y, mo, 1, 0, 0, 0, 0, c.Location), time.Date(y, mo+1, 1, 0, 0, 0, 0, c.Location))
	c.spans.Store(m)
	return m.spans[p]
}

// between is the period from start to end, each the first moment of its
// local date: where a change of clocks skips midnight, time.Date gives the
// moment an hour before it, in the previous date, and the date starts
// when that zone ends.
func (c *Calendar) between(start, end time.Time) periodSpan {
	first := firstMoment(start)
	return periodSpan{Start: first, End: firstMoment(end), name: strconv.FormatInt(FloorDiv(first, 1000), 10)}
}

func firstMoment(t time.Time) int64 {
	if t.Hour() != 0 {
		_, end := t.ZoneBounds()
		return end.UnixMilli()
	}
	return t.UnixMilli()
}

// spanAt is the period p of c that holds the moment now.
func (c *Calendar) SpanAt(p BudgetPeriod, now moment) periodSpan { return c.Span(p, now.Minute) }

// renewsIn is how many milliseconds after now the period p that holds it
// ends: when a budget exhausted in it renews.
func (c *Calendar) renewsIn(p BudgetPeriod, now moment) int64 {
	return c.SpanAt(p, now).End - now.UnixMillis
}

// settlesBudget reports whether ch changes a budget of period p of c at
// now: it has a cost to add or a reservation to take back, and it is for
// the current period or the one before it.
func (ch Charge) settlesBudget(c *Calendar, p BudgetPeriod, now moment) bool {
	if ch.Tokens.Cost == 0 && ch.Unreserve == 0 {
		return false
	}
	return ch.Minute == 0 || c.Span(p, ch.Minute).End >= c.SpanAt(p, now).Start
}
