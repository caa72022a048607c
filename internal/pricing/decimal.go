package pricing

import (
	"errors"
	"strconv"
	"strings"
)

// Errors of parseDecimal, wrapped with the entry and field they are about.
var (
	errSyntax    = errors.New("not a decimal number")
	errNegative  = errors.New("negative")
	errPrecision = errors.New("more precision than the unit holds")
	errRange     = errors.New("too large")
)

// parseDecimal returns the decimal text s times 10^scale, rounded up to a
// whole number, and whether it was one already: 2.5e-06 at scale 18 is
// 2500000000000, exact; 6.571428571428571e-06 (a float's shortest text) is
// 6571428571429, rounded up (trailing zeros are not precision:
// "0.10000000000000000000" is 1e17 at scale 18, exact). The text is a JSON
// number without its sign ("0.075", "2.50", "2.5e-06", "1E+3"), also with
// no digit before the point (".5"); anything else, NaN and Inf among it, is
// errSyntax, a leading '-' errNegative. A value beyond int64 or with an
// exponent beyond ±10000 is errRange (an exponent that large on a zero is
// 0).
func parseDecimal(s string, scale int) (v int64, exact bool, err error) {
	if strings.HasPrefix(s, "-") {
		return 0, false, errNegative
	}
	i := 0
	var digits []byte
	intDigits, fracDigits := 0, 0
	for i < len(s) && isDigit(s[i]) {
		digits = append(digits, s[i])
		intDigits++
		i++
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && isDigit(s[i]) {
			digits = append(digits, s[i])
			fracDigits++
			i++
		}
		if fracDigits == 0 {
			return 0, false, errSyntax
		}
	}
	if intDigits+fracDigits == 0 {
		return 0, false, errSyntax
	}
	exp := 0
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		start := i
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i == len(s) || !isDigit(s[i]) {
			return 0, false, errSyntax
		}
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		e, err := strconv.Atoi(s[start:i])
		if err != nil || e > 10000 || e < -10000 {
			e = 10001 // out of range; only a zero survives it
		}
		exp = e
	}
	if i != len(s) {
		return 0, false, errSyntax
	}
	// The value is digits × 10^(exp − fracDigits + scale).
	d := strings.TrimLeft(string(digits), "0")
	if d == "" {
		return 0, true, nil
	}
	if exp == 10001 {
		return 0, false, errRange
	}
	e := exp - fracDigits + scale
	for len(d) > 1 && d[len(d)-1] == '0' {
		d = d[:len(d)-1]
		e++
	}
	if e < 0 {
		// Digits below the unit, not all zeros: the whole part, plus one.
		whole := int64(0)
		if len(d)+e > 0 {
			if whole, err = strconv.ParseInt(d[:len(d)+e], 10, 64); err != nil {
				return 0, false, errRange
			}
		}
		if whole == 1<<63-1 {
			return 0, false, errRange
		}
		return whole + 1, false, nil
	}
	if len(d)+e > 19 {
		return 0, false, errRange
	}
	v, err = strconv.ParseInt(d+strings.Repeat("0", e), 10, 64)
	if err != nil {
		return 0, false, errRange
	}
	return v, true, nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
