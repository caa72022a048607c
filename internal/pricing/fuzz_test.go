package pricing

import (
	"math/big"
	"testing"
)

// FuzzParseDecimal holds parseDecimal to math/big: what it accepts is the
// exact value of the text (as big.Rat reads it) times 10^scale, a whole
// number within int64; what it rejects as finer than the unit or too large
// is not a whole number or beyond int64 in big.Rat, and what it rejects as
// negative or not a number is not a plain decimal.
func FuzzParseDecimal(f *testing.F) {
	for _, s := range []string{"2.5e-06", "0.000000075", "1e-10", "-1", "1e400", "abc", "0.0000000000000000001",
		"9.223372036854775807", "9.223372036854775808", ".5", "0e999", "1E+3", "00012.3400e-2", "1.", "Inf"} {
		f.Add(s, uint8(18))
		f.Add(s, uint8(12))
	}
	maxInt64 := new(big.Rat).SetInt64(1<<63 - 1)
	f.Fuzz(func(t *testing.T, s string, scale uint8) {
		sc := int(scale % 25)
		v, exact, err := parseDecimal(s, sc)
		if !plainDecimal(s) {
			// Signs, junk, and exponents of more than 4 digits (which
			// big.Rat takes too slowly, or not at all): only a zero may
			// be accepted.
			if err == nil && v != 0 {
				t.Fatalf("parseDecimal(%q, %d) = %d, but it is no plain decimal", s, sc, v)
			}
			return
		}
		r, ok := new(big.Rat).SetString(s)
		if !ok {
			t.Fatalf("big.Rat rejects %q", s)
		}
		r.Mul(r, new(big.Rat).SetFrac(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(sc)), nil), big.NewInt(1)))
		switch {
		case err == nil && exact:
			if !r.IsInt() || !r.Num().IsInt64() || r.Num().Int64() != v {
				t.Fatalf("parseDecimal(%q, %d) = %d, big.Rat %v ", s, sc, v, r)
			}
		case err == nil:
			// Rounded up: the next whole number above the exact value.
			up := new(big.Int).Quo(r.Num(), r.Denom())
			up.Add(up, big.NewInt(1))
			if r.IsInt() || !up.IsInt64() || up.Int64() != v {
				t.Fatalf("parseDecimal(%q, %d) = %d rounded up, big.Rat %v ", s, sc, v, r)
			}
		case err == errRange:
			if ceil := new(big.Rat).SetInt(new(big.Int).Neg(new(big.Int).Div(new(big.Int).Neg(r.Num()), r.Denom()))); ceil.Cmp(maxInt64) <= 0 {
				t.Fatalf("parseDecimal(%q, %d): %v, but it rounds up to %v", s, sc, err, ceil)
			}
		default:
			t.Fatalf("parseDecimal(%q, %d): %v, but it is a plain decimal", s, sc, err)
		}
	})
}

// plainDecimal reports whether s is digits, an optional '.' and digits,
// and an optional exponent, as parseDecimal reads.
func plainDecimal(s string) bool {
	i, n := 0, 0
	for i < len(s) && isDigit(s[i]) {
		i, n = i+1, n+1
	}
	if i < len(s) && s[i] == '.' {
		i++
		f := 0
		for i < len(s) && isDigit(s[i]) {
			i, f = i+1, f+1
		}
		if f == 0 {
			return false
		}
		n += f
	}
	if n == 0 {
		return false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		e, significant := 0, 0
		for i < len(s) && isDigit(s[i]) {
			if significant > 0 || s[i] != '0' {
				significant++
			}
			i, e = i+1, e+1
		}
		if e == 0 || significant > 4 {
			return false // big.Rat takes exponents parseDecimal calls out of range
		}
	}
	return i == len(s)
}
