package limiter

import (
	"fmt"
	"strconv"
	"strings"
)

const (
	// microTokens is one token in the unit of a bucket's deficit.
	MicroTokens = 1_000_000
	// maxRateMilli and maxBurst bound a bucket so that its arithmetic stays
	// exact in Lua: a million tokens per second, a billion tokens.
	maxRateMilli = 1_000_000_000
	MaxBurst     = 1_000_000_000
)

// tokenBucket is one limit's bucket; rate 0 is none. Beside the minute and
// day windows (window.go), a bucket holds up to burst tokens, refills at rate
// tokens per second from elapsed time (no background job), and an admitted
// request takes cost tokens. This is the contract of Spring Cloud Gateway's
// RedisRateLimiter, in exact integer arithmetic.
//
// A bucket's state is its deficit, how far it is below full, in micro-tokens,
// as of a moment in unix milliseconds. A rate is a decimal with at most three
// places, so it is a whole number of milli-tokens per second, which is the
// same number of micro-tokens per millisecond: the refill over d milliseconds
// is d × rate micro-tokens, an integer. A missing bucket is full. The deficit
// does not depend on the capacity, so a bucket read under another burst still
// means the same thing. admit.lua does the same arithmetic with Lua's doubles,
// exact below 2^53: with burst ≤ 10^9 every deficit is below 10^15.
type TokenBucket struct {
	Rate     int64  // milli-tokens per second, i.e. micro-tokens per millisecond
	Burst    int64  // capacity, in tokens
	Cost     int64  // tokens an admitted request takes
	RateText string // the rate as configured, for X-RateLimit-Replenish-Rate
}

// parseRate reads a rate of tokens per second: a positive decimal with at
// most three places, such as 10, 0.5 or 2.125.
func ParseRate(s string) (milli int64, err error) {
	whole, frac, dotted := strings.Cut(s, ".")
	if whole == "" || dotted && frac == "" || !allDigits(whole) || !allDigits(frac) {
		return 0, fmt.Errorf("rate %q: want tokens per second as a decimal such as 10 or 0.5", s)
	}
	if len(frac) > 3 {
		return 0, fmt.Errorf("rate %q: at most three decimal places", s)
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w > maxRateMilli/1000 {
		return 0, fmt.Errorf("rate %q: at most %d per second", s, maxRateMilli/1000)
	}
	f, _ := strconv.ParseInt(frac+strings.Repeat("0", 3-len(frac)), 10, 64)
	milli = w*1000 + f
	if milli == 0 || milli > maxRateMilli {
		return 0, fmt.Errorf("rate %q: must be above 0 and at most %d per second", s, maxRateMilli/1000)
	}
	return milli, nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// refilled is the deficit at now of a bucket that had deficit at the moment
// at. A clock that went back refills nothing.
func (b TokenBucket) refilled(deficit, at, now int64) int64 {
	elapsed := now - at
	if elapsed <= 0 {
		return deficit
	}
	if elapsed >= CeilDiv(deficit, b.Rate) { // also keeps elapsed × rate small
		return 0
	}
	return deficit - elapsed*b.Rate
}

// fits reports whether cost tokens are in a bucket with this deficit.
func (b TokenBucket) fits(deficit int64) bool {
	return deficit <= (b.Burst-b.Cost)*MicroTokens
}

// releaseIn is how many milliseconds until cost tokens are back: the
// earliest whole millisecond at which fits holds, absent traffic.
func (b TokenBucket) releaseIn(deficit int64) int64 {
	return CeilDiv(max(deficit-(b.Burst-b.Cost)*MicroTokens, 0), b.Rate)
}

// left is the whole tokens in a bucket with this deficit, never negative.
func (b TokenBucket) Left(deficit int64) int64 {
	return max(b.Burst*MicroTokens-deficit, 0) / MicroTokens
}

func CeilDiv(a, b int64) int64 { return (a + b - 1) / b }
