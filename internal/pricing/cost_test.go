package pricing

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// perMillion is a price given in USD per million tokens, for tests.
func perMillion(t *testing.T, usd string) Rate {
	t.Helper()
	v, _, err := parseDecimal(usd, millionScale)
	if err != nil {
		t.Fatal(err)
	}
	return Rate{v, true}
}

func TestCostRoundsUpToAWholeNanoDollarOncePerRequest(t *testing.T) {
	cases := []struct {
		name  string
		price Price
		t     Tokens
		want  int64
	}{
		{"1 token at $0.01/M is 1e-8 USD exactly", Price{Input: perMillion(t, "0.01")}, Tokens{Input: 1}, 10},
		{"3 tokens at $0.0375/M: 112.5 rounds up", Price{Input: perMillion(t, "0.0375")}, Tokens{Input: 3}, 113},
		{"1 token at 1 atto-dollar rounds up to 1", Price{Input: Rate{1, true}}, Tokens{Input: 1}, 1},
		{"no tokens cost nothing", Price{Input: perMillion(t, "5")}, Tokens{}, 0},
		// Rounded once: 1 input + 1 output at 0.5 n$ each is 1, not 2.
		{"halves of two parts round once", Price{Input: Rate{500_000_000, true}, Output: Rate{500_000_000, true}}, Tokens{Input: 1, Output: 1}, 1},
		{"gpt-4o-like request", Price{Input: perMillion(t, "2.50"), Output: perMillion(t, "10"), CacheRead: perMillion(t, "1.25")},
			Tokens{Input: 1000, CacheRead: 2000, Output: 300}, 2_500_000 + 2_500_000 + 3_000_000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := Cost(c.price, c.t); got != c.want {
				t.Errorf("got %d, want %d", got, c.want)
			}
		})
	}
}

func TestCostPricesEachPartAtItsPriceOrItsFallback(t *testing.T) {
	full := Price{
		Input: Rate{1e9, true}, Output: Rate{10e9, true}, CacheRead: Rate{100e9, true}, CacheWrite: Rate{1000e9, true},
		Reasoning: Rate{10000e9, true}, AudioInput: Rate{100000e9, true}, AudioOutput: Rate{1000000e9, true},
	}
	bare := Price{Input: Rate{1e9, true}, Output: Rate{10e9, true}}
	cases := []struct {
		name  string
		price Price
		t     Tokens
		want  int64
	}{
		{"each part at its own price", full, Tokens{Input: 3, AudioInput: 1, CacheRead: 1, CacheWrite: 1, Output: 7, Reasoning: 2, AudioOutput: 1},
			2*1 + 100000 + 100 + 1000 + 4*10 + 2*10000 + 1000000},
		{"cache and audio input fall back to input", bare, Tokens{Input: 3, AudioInput: 1, CacheRead: 1, CacheWrite: 1}, 5},
		{"reasoning and audio output fall back to output", bare, Tokens{Output: 7, Reasoning: 2, AudioOutput: 1}, 70},
		{"reasoning beyond output counts up to output", full, Tokens{Output: 2, Reasoning: 5}, 2 * 10000},
		{"audio output beyond what reasoning leaves counts up to it", full, Tokens{Output: 3, Reasoning: 2, AudioOutput: 5}, 2*10000 + 1000000},
		{"audio input beyond input counts up to input", full, Tokens{Input: 1, AudioInput: 5}, 100000},
		{"negative counts are 0", full, Tokens{Input: -1, CacheRead: -1, CacheWrite: -1, Output: -1, Reasoning: -1, AudioInput: -1, AudioOutput: -1}, 0},
		{"input and output not given are 0", Price{CacheRead: Rate{1e9, true}}, Tokens{Input: 5, Output: 5, CacheRead: 1}, 1},
		{"a price of 0 is given: no fallback", Price{Input: Rate{1e9, true}, CacheRead: Rate{0, true}}, Tokens{CacheRead: 9}, 0},
	}
	for _, c := range cases {
		if got := Cost(c.price, c.t); got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, got, c.want)
		}
	}
}

func TestCostDoesNotOverflowAtTenMillionTokensAtAThousandDollarsPerMillion(t *testing.T) {
	r := perMillion(t, "1000")
	p := Price{Input: r, Output: r, CacheRead: r, CacheWrite: r, Reasoning: r, AudioInput: r, AudioOutput: r}
	// 1e7 × 1e15 atto = 1e22 atto, 1e13 n$ ($10,000) per part.
	if got := Cost(p, Tokens{Input: 1e7}); got != 1e13 {
		t.Errorf("input: got %d, want 1e13", got)
	}
	all := Tokens{Input: 1e7, CacheRead: 1e7, CacheWrite: 1e7, Output: 1e7}
	if got := Cost(p, all); got != 4e13 {
		t.Errorf("all parts: got %d, want 4e13", got)
	}
	if got := MaxCost(p, 1e7, 1e7); got != 2e13 {
		t.Errorf("MaxCost: got %d, want 2e13", got)
	}
}

func TestCostSaturatesBeyondInt64(t *testing.T) {
	r := Rate{math.MaxInt64, true}
	p := Price{Input: r, Output: r, CacheRead: r, CacheWrite: r}
	for _, tk := range []Tokens{
		{Input: math.MaxInt64},
		{Input: math.MaxInt64, CacheRead: math.MaxInt64, CacheWrite: math.MaxInt64, Output: math.MaxInt64}, // past 2^128
		{Input: 1e9 + 1}, // just past MaxInt64 n$ ≈ 9.22e18: 9.22e27 atto
	} {
		if got := Cost(p, tk); got != math.MaxInt64 {
			t.Errorf("%+v: got %d, want MaxInt64", tk, got)
		}
	}
	// 1e9 tokens at MaxInt64 − 1 atto are exactly MaxInt64 − 1 n$.
	if got := Cost(Price{Input: Rate{math.MaxInt64 - 1, true}}, Tokens{Input: 1e9}); got != math.MaxInt64-1 {
		t.Errorf("1e9 tokens at MaxInt64 − 1 atto: got %d, want MaxInt64 − 1", got)
	}
	if got := MaxCost(p, math.MaxInt64, math.MaxInt64); got != math.MaxInt64 {
		t.Errorf("MaxCost: got %d, want MaxInt64", got)
	}
}

func TestMaxCostPricesEachTokenAtTheHighestPriceItMayHave(t *testing.T) {
	in, out, reasoning := perMillion(t, "1.10"), perMillion(t, "4.40"), perMillion(t, "8")
	cases := []struct {
		name    string
		price   Price
		in, out int64
		want    int64
	}{
		{"no reasoning price", Price{Input: in, Output: out}, 1000, 100, 1_100_000 + 440_000},
		{"reasoning above output", Price{Input: in, Output: out, Reasoning: reasoning}, 1000, 100, 1_100_000 + 800_000},
		{"reasoning below output", Price{Input: in, Output: reasoning, Reasoning: out}, 1000, 100, 1_100_000 + 800_000},
		{"rounded up once", Price{Input: perMillion(t, "0.0375"), Output: perMillion(t, "0.0375")}, 1, 2, 113},
		{"a cache write above input", Price{Input: in, Output: out, CacheWrite: reasoning}, 1000, 0, 8_000_000},
		{"a cache read below input", Price{Input: in, Output: out, CacheRead: perMillion(t, "0.11")}, 1000, 0, 1_100_000},
		{"audio above both", Price{Input: in, Output: out, AudioInput: perMillion(t, "40"), AudioOutput: perMillion(t, "80")}, 1000, 100, 40_000_000 + 8_000_000},
		{"negative counts are 0", Price{Input: in, Output: out}, -5, -5, 0},
	}
	for _, c := range cases {
		if got := MaxCost(c.price, c.in, c.out); got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, got, c.want)
		}
	}
}

// TestCostAgreesWithBigArithmeticAndStaysWithinMaxCost holds Cost to the
// same sum in math/big on random prices and counts, and to MaxCost of the
// same tokens whatever the cache and audio prices.
func TestCostAgreesWithBigArithmeticAndStaysWithinMaxCost(t *testing.T) {
	rnd := rand.New(rand.NewPCG(5, 6))
	rate := func(limit int64) Rate {
		if rnd.IntN(5) == 0 {
			return Rate{}
		}
		return Rate{rnd.Int64N(limit + 1), true}
	}
	count := func() int64 { return rnd.Int64N(2e7) - 1e6 }
	for range 20000 {
		p := Price{Input: rate(1e15), Output: rate(1e15)}
		p.CacheRead, p.CacheWrite, p.AudioInput = rate(1e15), rate(1e15), rate(1e15)
		p.Reasoning, p.AudioOutput = rate(1e15), rate(1e15)
		tk := Tokens{count(), count(), count(), count(), count(), count(), count()}
		got := Cost(p, tk)
		if want := bigCost(p, tk); got != want {
			t.Fatalf("%+v %+v: got %d, big %d", p, tk, got, want)
		}
		in := max(tk.Input, 0) + max(tk.CacheRead, 0) + max(tk.CacheWrite, 0)
		if m := MaxCost(p, in, tk.Output); got > m {
			t.Fatalf("%+v %+v: cost %d above MaxCost %d", p, tk, got, m)
		}
	}
}

// bigCost is Cost by its documented table, in math/big.
func bigCost(p Price, t Tokens) int64 {
	c := func(n int64) int64 { return max(n, 0) }
	atto := func(r Rate) int64 {
		if r.Given {
			return r.Atto
		}
		return 0
	}
	in, out := c(t.Input), c(t.Output)
	audioIn := min(c(t.AudioInput), in)
	reasoning := min(c(t.Reasoning), out)
	audioOut := min(c(t.AudioOutput), out-reasoning)
	parts := [][2]int64{
		{in - audioIn, atto(p.Input)},
		{audioIn, atto(p.AudioInput.Or(p.Input))},
		{c(t.CacheRead), atto(p.CacheRead.Or(p.Input))},
		{c(t.CacheWrite), atto(p.CacheWrite.Or(p.Input))},
		{out - reasoning - audioOut, atto(p.Output)},
		{reasoning, atto(p.Reasoning.Or(p.Output))},
		{audioOut, atto(p.AudioOutput.Or(p.Output))},
	}
	total := new(big.Int)
	for _, part := range parts {
		total.Add(total, new(big.Int).Mul(big.NewInt(part[0]), big.NewInt(part[1])))
	}
	nano, rem := new(big.Int).QuoRem(total, big.NewInt(1e9), new(big.Int))
	if rem.Sign() > 0 {
		nano.Add(nano, big.NewInt(1))
	}
	return nano.Int64()
}
