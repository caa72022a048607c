package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
)

// capValue is what a cap's value is written as.
type capValue uint8

const (
	capInteger capValue = iota // a positive integer, at most capKind.most
	capRate                    // tokens per second: a decimal of at most three places
	capUSD                     // US dollars: a decimal of at most nine places
)

// capKind is one cap a limit line may give. It is the one place that tells
// the cap's name, how its value is written and bounded, its field in
// LimitConfig and what the load log leaves out when the cap comes per
// request: the Caddyfile's limit lines, the caps per request (set, given,
// nominal, described) and the messages that list the caps all read it.
type capKind struct {
	name  string
	value capValue
	most  int64 // an integer's largest value
	// nominal is the value a cap per request without else is checked
	// with at load, and the live view reads its counters with.
	nominal string
	integer func(*LimitConfig) *int64       // an integer's field
	decimal func(*LimitConfig) *json.Number // a decimal's field
	// omit leaves the cap out of caps, for the load log of a cap that
	// comes per request.
	omit func(*limiter.Caps)
	// kept says why the admin API's reset keeps what the cap counts, and
	// in whether a limit's caps have the cap; "" for a cap the reset
	// clears.
	kept string
	in   func(*limiter.Caps) bool
}

// capKinds are the caps a limit line may give, in the order the messages
// list them: the windows (limiter.WindowKind), the token bucket, requests
// in flight and the budgets.
var capKinds = func() []capKind {
	kinds := make([]capKind, 0, limiter.NumWindows+6)
	for k := range limiter.NumWindows {
		kinds = append(kinds, capKind{name: k.String(), value: capInteger, most: limiter.MaxCap, nominal: "1",
			integer: func(l *LimitConfig) *int64 { return l.windowCapFields()[k] },
			omit:    func(c *limiter.Caps) { c.Windows[k] = 0; c.Capped = c.Windows.Mask() }})
	}
	noBucket := func(c *limiter.Caps) { c.Bucket = limiter.TokenBucket{} }
	return append(kinds,
		capKind{name: "rate", value: capRate, nominal: "1",
			decimal: func(l *LimitConfig) *json.Number { return &l.Rate }, omit: noBucket},
		capKind{name: "burst", value: capInteger, most: limiter.MaxBurst, nominal: strconv.Itoa(limiter.MaxBurst),
			integer: func(l *LimitConfig) *int64 { return &l.Burst }, omit: noBucket},
		capKind{name: "cost", value: capInteger, most: limiter.MaxCap, nominal: "1",
			integer: func(l *LimitConfig) *int64 { return &l.Cost }, omit: noBucket},
		capKind{name: "concurrent", value: capInteger, most: limiter.MaxCap, nominal: "1",
			integer: func(l *LimitConfig) *int64 { return &l.Concurrent },
			omit:    func(c *limiter.Caps) { c.Concurrent.Max = 0 },
			kept:    keptSlotsWhy, in: func(c *limiter.Caps) bool { return c.Concurrent.Max > 0 }},
		budgetKind(limiter.BudgetDay, func(l *LimitConfig) *json.Number { return &l.BudgetDay }),
		budgetKind(limiter.BudgetMonth, func(l *LimitConfig) *json.Number { return &l.BudgetMonth }),
	)
}()

// budgetKind is the cap of budget p, whose value is field.
func budgetKind(p limiter.BudgetPeriod, field func(*LimitConfig) *json.Number) capKind {
	return capKind{name: p.CapName(), value: capUSD, nominal: "1", decimal: field,
		omit: func(c *limiter.Caps) { c.Budgets.Max[p] = 0 },
		kept: keptSpentWhy, in: func(c *limiter.Caps) bool { return c.Budgets.Max[p] > 0 }}
}

// capKindNamed is the cap called name.
func capKindNamed(name string) (capKind, bool) {
	for _, k := range capKinds {
		if k.name == name {
			return k, true
		}
	}
	return capKind{}, false
}

// capNames lists the caps' names, joined by sep and the last by last.
func capNames(sep, last string) string {
	var b strings.Builder
	for i, k := range capKinds {
		switch {
		case i == len(capKinds)-1 && i > 0:
			b.WriteString(last)
		case i > 0:
			b.WriteString(sep)
		}
		b.WriteString(k.name)
	}
	return b.String()
}

// given reports whether the line gives the cap a value of its own.
func (k capKind) given(l *LimitConfig) bool {
	if k.decimal != nil {
		return *k.decimal(l) != ""
	}
	return *k.integer(l) != 0
}

// set sets the cap of the line to the value v, as the config reads it, or
// says why v is not valid for it.
func (k capKind) set(l *LimitConfig, v string) error {
	switch k.value {
	case capRate:
		if _, err := limiter.ParseRate(v); err != nil {
			return err
		}
	case capUSD:
		budget, err := pricing.ParseBudget(v)
		if err == nil && budget == 0 {
			err = errors.New("a budget of 0 would refuse every request")
		}
		if err != nil {
			return err
		}
	default:
		// ParseUint takes neither a sign nor '_'; bit size 63 fits an int64.
		n, err := strconv.ParseUint(v, 10, 63)
		if err != nil || n == 0 || n > uint64(k.most) {
			return fmt.Errorf("%s must be a positive integer of at most %d, not %q", k.name, k.most, v)
		}
		*k.integer(l) = int64(n)
		return nil
	}
	*k.decimal(l) = json.Number(v)
	return nil
}
