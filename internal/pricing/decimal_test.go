package pricing

import (
	"errors"
	"testing"
)

func TestDecimalsAreScaledExactlyWithoutFloats(t *testing.T) {
	cases := []struct {
		s     string
		scale int
		want  int64
	}{
		{"2.5e-06", attoScale, 2_500_000_000_000},
		{"0.000000075", attoScale, 75_000_000_000},
		{"1e-10", attoScale, 100_000_000},
		{"1E-10", attoScale, 100_000_000},
		{"1.25e-05", attoScale, 12_500_000_000_000},
		{"5.46875e-07", attoScale, 546_875_000_000},
		{"1.9e-08", attoScale, 19_000_000_000},
		{"0.000000000000000001", attoScale, 1},
		{"0.10000000000000000000", attoScale, 100_000_000_000_000_000},
		{"0", attoScale, 0},
		{"0.0", attoScale, 0},
		{"0e400", attoScale, 0},
		{"0e99999999999999999999", attoScale, 0},
		{"9.223372036854775807", attoScale, 9_223_372_036_854_775_807},
		{"1e+0", attoScale, 1_000_000_000_000_000_000},
		{".5", attoScale, 500_000_000_000_000_000},
		{"2.50", millionScale, 2_500_000_000_000},
		{"0.075", millionScale, 75_000_000_000},
		{"0.01", millionScale, 10_000_000_000},
		{"1000", millionScale, 1_000_000_000_000_000},
		{"1000000", usdToNano, 1_000_000_000_000_000},
	}
	for _, c := range cases {
		got, exact, err := parseDecimal(c.s, c.scale)
		if err != nil || !exact || got != c.want {
			t.Errorf("parseDecimal(%q, %d) = %d, %v, %v; want %d exactly", c.s, c.scale, got, exact, err, c.want)
		}
	}
}

// A price finer than the unit is rounded up to the next whole unit, never
// down: less than one unit more.
func TestDecimalsFinerThanTheUnitAreRoundedUp(t *testing.T) {
	for s, want := range map[string]int64{
		"0.0000000000000000001": 1,
		"1.0000000000000000001": 1_000_000_000_000_000_001,
		"1e-19":                 1,
		"6.571428571428571e-06": 6_571_428_571_429, // a float's shortest text, 21 decimals
		"2.0000000000000000009": 2_000_000_000_000_000_001,
	} {
		got, exact, err := parseDecimal(s, attoScale)
		if err != nil || exact || got != want {
			t.Errorf("parseDecimal(%q) = %d, %v, %v; want %d, rounded up", s, got, exact, err, want)
		}
	}
	if _, _, err := parseDecimal("9.2233720368547758079", attoScale); !errors.Is(err, errRange) {
		t.Errorf("rounding the largest int64 up: %v, want errRange", err)
	}
}

func TestDecimalsThatAreNotNonNegativeNumbersInRangeAreErrors(t *testing.T) {
	cases := []struct {
		s    string
		want error
	}{
		{"-1", errNegative},
		{"-0", errNegative},
		{"1e400", errRange},
		{"1e99999999999999999999", errRange},
		{"9.223372036854775808", errRange},
		{"10", errRange},
		{"abc", errSyntax},
		{"NaN", errSyntax},
		{"Inf", errSyntax},
		{"+Inf", errSyntax},
		{"+1", errSyntax},
		{"", errSyntax},
		{".", errSyntax},
		{"1.", errSyntax},
		{"1e", errSyntax},
		{"1e+", errSyntax},
		{"1.5.2", errSyntax},
		{"0x10", errSyntax},
		{" 1", errSyntax},
		{"1 ", errSyntax},
		{"1_000", errSyntax},
	}
	for _, c := range cases {
		got, _, err := parseDecimal(c.s, attoScale)
		if !errors.Is(err, c.want) {
			t.Errorf("parseDecimal(%q) = %d, %v; want %v", c.s, got, err, c.want)
		}
	}
}
