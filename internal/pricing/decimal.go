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

// parseDecimal returns the decimal text s times 10^scale, exactly: 2.5e-06
// at scale 18 is 2500000000000. The text is a JSON number without its sign
// ("0.075", "2.50", "2.5e-06", "1E+3"), also with no digit before the point
// (".5"); anything else, NaN and Inf among it, is errSyntax, a leading '-'
// errNegative. A value that is not a whole number once scaled is
// errPrecision (trailing zeros are not precision: "0.10000000000000000000"
// is 1e17 at scale 18), one beyond int64 or with an exponent beyond ±10000
// is errRange (an exponent that large on a zero is 0).
func parseDecimal(s string, scale int) (int64, error) {
	if strings.HasPrefix(s, "-") {
		return 0, errNegative
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
			return 0, errSyntax
		}
	}
	if intDigits+fracDigits == 0 {
		return 0, errSyntax
	}
	exp := 0
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		start := i
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i == len(s) || !isDigit(s[i]) {
			return 0, errSyntax
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
		return 0, errSyntax
	}
	// The value is digits × 10^(exp − fracDigits + scale).
	d := strings.TrimLeft(string(digits), "0")
	if d == "" {
		return 0, nil
	}
	if exp == 10001 {
		return 0, errRange
	}
	e := exp - fracDigits + scale
	for len(d) > 1 && d[len(d)-1] == '0' {
		d = d[:len(d)-1]
		e++
	}
	if e < 0 {
		return 0, errPrecision
	}
	if len(d)+e > 19 {
		return 0, errRange
	}
	v, err := strconv.ParseInt(d+strings.Repeat("0", e), 10, 64)
	if err != nil {
		return 0, errRange
	}
	return v, nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
