package limiter

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	_ "time/tzdata" // budget_timezone names a zone whether or not the machine has a zoneinfo database
)

// The design of spend budgets is in the package doc, section "Spend budgets".

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
