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
		got, err := parseDecimal(c.s, c.scale)
		if err != nil || got != c.want {
			t.Errorf("parseDecimal(%q, %d) = %d, %v; want %d", c.s, c.scale, got, err, c.want)
		}
	}
}

func TestDecimalsThatAreNotExactNonNegativeAndInRangeAreErrors(t *testing.T) {
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
		{"0.0000000000000000001", errPrecision},
		{"1.0000000000000000001", errPrecision},
		{"1e-19", errPrecision},
		{"6.571428571428571e-06", errPrecision}, // a float's shortest text, 21 decimals
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
		got, err := parseDecimal(c.s, attoScale)
		if !errors.Is(err, c.want) {
			t.Errorf("parseDecimal(%q) = %d, %v; want %v", c.s, got, err, c.want)
		}
	}
}
