package pricing

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestInlinePricesPerMillionAreExactAttoDollarsPerToken(t *testing.T) {
	e, err := Inline("gpt-4o*", "2.50", "10", "1.25", "")
	if err != nil {
		t.Fatal(err)
	}
	want := Entry{Name: "gpt-4o*", Price: Price{
		Input:     Rate{2_500_000_000_000, true},
		Output:    Rate{10_000_000_000_000, true},
		CacheRead: Rate{1_250_000_000_000, true},
	}}
	if e != want {
		t.Errorf("got %+v, want %+v", e, want)
	}
	e, err = Inline("*", "0.075", "0", "", "0")
	if err != nil {
		t.Fatal(err)
	}
	if e.Price.Input != (Rate{75_000_000_000, true}) || e.Price.Output != (Rate{0, true}) ||
		e.Price.CacheRead.Given || e.Price.CacheWrite != (Rate{0, true}) {
		t.Errorf("got %+v", e)
	}
}

func TestInlineErrorsNameTheEntryAndField(t *testing.T) {
	cases := []struct {
		name, input, output, cacheRead, cacheWrite string
		want                                       string
	}{
		{"m", "-1", "1", "", "", "price m: input \"-1\""},
		{"m", "1", "abc", "", "", "price m: output \"abc\""},
		{"m", "1", "1", "NaN", "", "price m: cache_read \"NaN\""},
		{"m", "1", "1", "", "1e400", "price m: cache_write \"1e400\""},
		{"m", "", "1", "", "", "price m: input \"\""},
		{"", "1", "1", "", "", "empty model name"},
		{"a*b", "1", "1", "", "", "'*' only ends a prefix"},
		{"**", "1", "1", "", "", "'*' only ends a prefix"},
	}
	for _, c := range cases {
		_, err := Inline(c.name, c.input, c.output, c.cacheRead, c.cacheWrite)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want an error containing %q", c, err, c.want)
		}
	}
}

func TestBudgetsAreExactNanoDollarsUpToMaxBudget(t *testing.T) {
	for s, want := range map[string]int64{"25": 25 * NanoPerUSD, "0.000000001": 1, "1000000": MaxBudget, "0": 0} {
		if got, err := ParseBudget(s); got != want || err != nil {
			t.Errorf("ParseBudget(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for s, want := range map[string]error{"1000000.000000001": errRange, "0.0000000001": errPrecision, "-5": errNegative, "5$": errSyntax} {
		if _, err := ParseBudget(s); !errors.Is(err, want) {
			t.Errorf("ParseBudget(%q): %v, want %v", s, err, want)
		}
	}
	if MaxBudget >= 1<<53 {
		t.Errorf("MaxBudget %d is not below 2^53", MaxBudget)
	}
}

func TestFormatUSDIsExactWithAtLeastTwoDecimals(t *testing.T) {
	for nano, want := range map[int64]string{
		0: "0.00", 1: "0.000000001", 500 * NanoPerUSD: "500.00", 2_500_000_000: "2.50", 1_234_567_891: "1.234567891",
		-1_500_000_000: "-1.50", MaxBudget: "1000000.00", math.MaxInt64: "9223372036.854775807", math.MinInt64: "-9223372036.854775808",
	} {
		if got := FormatUSD(nano); got != want {
			t.Errorf("FormatUSD(%d) = %q, want %q", nano, got, want)
		}
		if nano > 0 && nano <= MaxBudget {
			if back, err := ParseBudget(FormatUSD(nano)); err != nil || back != nano {
				t.Errorf("ParseBudget(FormatUSD(%d)) = %d, %v", nano, back, err)
			}
		}
	}
}
