package pricing

import (
	"fmt"
	"strings"
)

// Scales of the decimal texts read: a price per token in USD to
// atto-dollars, a price per million tokens in USD to atto-dollars per token,
// and dollars to nano-dollars.
const (
	attoScale    = 18
	millionScale = 12
	usdToNano    = 9
)

// NanoPerUSD is the number of nano-dollars, the unit of every cost and
// budget, in a dollar.
const NanoPerUSD = 1_000_000_000

// MaxBudget is the largest budget allowed, in nano-dollars: $1,000,000. A
// spend counter holds at most a budget plus the reservations admitted under
// it, each at most a budget, so it stays far below 2^53 (about $9,007,199)
// where Lua's doubles still count every nano-dollar exactly.
const MaxBudget int64 = 1_000_000 * NanoPerUSD

// Rate is a price per token, in atto-dollars (1e-18 USD): $2.50 per million
// tokens is 2.5e-6 USD per token, 2_500_000_000_000 atto-dollars. Given
// tells a price of 0 from one the table does not give. The parsers never
// give a negative Atto; Cost and MaxCost count one as 0.
type Rate struct {
	Atto  int64
	Given bool
}

// Or is r if given, else fallback.
func (r Rate) Or(fallback Rate) Rate {
	if r.Given {
		return r
	}
	return fallback
}

// Price is what a model's tokens cost, per kind of token. See Cost for what
// each prices and what a price not given falls back to.
type Price struct {
	// Input is the price of input tokens served from no cache.
	Input Rate
	// Output is the price of output tokens, reasoning included.
	Output Rate
	// CacheRead is the price of input tokens served from a cache.
	CacheRead Rate
	// CacheWrite is the price of input tokens written to a cache.
	CacheWrite Rate
	// Reasoning is the price of the reasoning tokens of the output.
	Reasoning Rate
	// AudioInput and AudioOutput are the prices of the audio tokens of
	// the input and of the output.
	AudioInput  Rate
	AudioOutput Rate
}

// Priced reports whether p prices tokens at all: whether it gives an input
// or an output price. A LiteLLM entry priced only per character, second,
// image or query is not.
func (p Price) Priced() bool { return p.Input.Given || p.Output.Given }

// Entry is a price under the name it is configured by: a model name, a
// prefix ending in '*', or "*" alone (see Table.Lookup).
type Entry struct {
	Name  string
	Price Price
}

// Inline is an inline entry, `price <name> input <i> output <o>
// [cache_read <r>] [cache_write <w>]`, from the values of its tokens:
// prices in USD per million tokens as decimal text ("2.50", "0.075"; see
// parseDecimal for the syntax), exact to 1e-12 USD per million, each at most
// about $9.2 million per million tokens. An empty cacheRead or cacheWrite is
// not given. The name is a model name, a prefix ending in '*', or "*": a
// '*' anywhere but at its end, or an empty name, is an error.
func Inline(name, input, output, cacheRead, cacheWrite string) (Entry, error) {
	if name == "" {
		return Entry{}, fmt.Errorf("price: empty model name")
	}
	if i := strings.IndexByte(name, '*'); i >= 0 && i != len(name)-1 {
		return Entry{}, fmt.Errorf("price %s: '*' only ends a prefix", name)
	}
	e := Entry{Name: name}
	fields := []struct {
		field, text string
		rate        *Rate
		optional    bool
	}{
		{"input", input, &e.Price.Input, false},
		{"output", output, &e.Price.Output, false},
		{"cache_read", cacheRead, &e.Price.CacheRead, true},
		{"cache_write", cacheWrite, &e.Price.CacheWrite, true},
	}
	for _, f := range fields {
		if f.optional && f.text == "" {
			continue
		}
		v, _, err := parseDecimal(f.text, millionScale)
		if err != nil {
			return Entry{}, fmt.Errorf("price %s: %s %q (USD per million tokens): %w", name, f.field, f.text, err)
		}
		*f.rate = Rate{Atto: v, Given: true}
	}
	return e, nil
}

// ParseBudget is a budget in dollars as decimal text ("25", "0.50"), in
// nano-dollars, exact: finer than a nano-dollar, negative, or above
// MaxBudget is an error.
func ParseBudget(usd string) (int64, error) {
	v, exact, err := parseDecimal(usd, usdToNano)
	switch {
	case err != nil:
	case !exact:
		err = errPrecision
	case v > MaxBudget:
		err = errRange
	}
	if err != nil {
		return 0, fmt.Errorf("budget %q (USD): %w (at most %d, to the nano-dollar)", usd, err, MaxBudget/NanoPerUSD)
	}
	return v, nil
}

// FormatUSD is nano-dollars as a decimal number of dollars, exact, with at
// least two decimals and no trailing zeros past them: 500000000000 is
// "500.00", 1 is "0.000000001", -1500000000 is "-1.50".
func FormatUSD(nano int64) string {
	sign, u := "", uint64(nano)
	if nano < 0 {
		sign, u = "-", -u
	}
	frac := fmt.Sprintf("%09d", u%NanoPerUSD)
	frac = strings.TrimRight(frac, "0")
	frac += "00"[min(len(frac), 2):]
	return fmt.Sprintf("%s%d.%s", sign, u/NanoPerUSD, frac)
}
