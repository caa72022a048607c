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
// LimitConfig, and the part of a limit it caps (limiter.Part), which says
// what a refusal by it is, what the admin API's reset keeps and what the
// load log leaves out when the cap comes per request: the Caddyfile's
// limit lines, the caps per request (set, given, nominal, described), the
// reset and the messages that list the caps all read it.
type capKind struct {
	name  string
	value capValue
	most  int64 // an integer's largest value
	// nominal is the value a cap per request without else is checked
	// with at load, and the live view reads its counters with.
	nominal string
	index   int // its place in capKinds, and in LimitConfig.capFields
	part    limiter.Part
}

// capKinds are the caps a limit line may give, in the order the messages
// list them: the windows (limiter.WindowKind), the token bucket, requests
// in flight and the budgets.
var capKinds = func() []capKind {
	kinds := make([]capKind, 0, numCapKinds)
	for k := range limiter.NumWindows {
		kinds = append(kinds, capKind{name: k.String(), value: capInteger, most: limiter.MaxCap, nominal: "1", part: limiter.WindowPart(k)})
	}
	kinds = append(kinds,
		capKind{name: "rate", value: capRate, nominal: "1", part: limiter.BucketPart},
		capKind{name: "burst", value: capInteger, most: limiter.MaxBurst, nominal: strconv.Itoa(limiter.MaxBurst), part: limiter.BucketPart},
		capKind{name: "cost", value: capInteger, most: limiter.MaxCap, nominal: "1", part: limiter.BucketPart},
		capKind{name: "concurrent", value: capInteger, most: limiter.MaxCap, nominal: "1", part: limiter.SlotsPart},
	)
	for p := range limiter.NumBudgetPeriods {
		kinds = append(kinds, capKind{name: p.CapName(), value: capUSD, nominal: "1", part: limiter.BudgetPart(p)})
	}
	for i := range kinds {
		kinds[i].index = i
	}
	return kinds
}()

// numCapKinds is how many caps a limit line may give.
const numCapKinds = int(limiter.NumWindows) + 6

// capFields are the fields of the line's caps, by capKind.index: an
// integer's, or a decimal's. (Indexed rather than reached through a
// function of each kind, which would move the line of a request's caps to
// the heap.)
func (l *LimitConfig) capFields() (integers [numCapKinds]*int64, decimals [numCapKinds]*json.Number) {
	for k, f := range l.windowCapFields() {
		integers[k] = f
	}
	w := int(limiter.NumWindows)
	decimals[w], integers[w+1], integers[w+2], integers[w+3] = &l.Rate, &l.Burst, &l.Cost, &l.Concurrent
	decimals[w+4], decimals[w+5] = &l.BudgetDay, &l.BudgetMonth
	return integers, decimals
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
	integers, decimals := l.capFields()
	if d := decimals[k.index]; d != nil {
		return *d != ""
	}
	return *integers[k.index] != 0
}

// set sets the cap of the line to the value v, as the config reads it, or
// says why v is not valid for it.
func (k capKind) set(l *LimitConfig, v string) error {
	integers, decimals := l.capFields()
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
		*integers[k.index] = int64(n)
		return nil
	}
	*decimals[k.index] = json.Number(v)
	return nil
}
