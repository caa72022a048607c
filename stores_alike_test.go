package ratelimit

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// randomCaps are the caps of a random limit: each window now and then, small
// enough for a few requests or tokens to fill it, and a token bucket in some;
// at least one of them. Tokens come in tens (randomReservation,
// randomUsage), and so do the token caps: counts often reach a cap exactly.
// The buckets refill slowly, from 10 s for a token: Redis expires a bucket's
// key on its own clock, not on a test's pinned one, twice the time the
// bucket takes to fill after its last write.
func randomCaps(t testing.TB, rng *rand.Rand) limitCaps {
	t.Helper()
	// How often a limit caps each window, in percent, and its cap's
	// range, in requests or tens of tokens.
	odds := [numWindows]struct{ percent, least, most int64 }{
		rpm: {70, 1, 6}, tpm: {50, 2, 19}, itpm: {25, 2, 13}, otpm: {25, 1, 8},
		rpd: {20, 2, 11}, tpd: {20, 5, 34}, itpd: {17, 4, 23}, otpd: {17, 2, 16},
	}
	var w windowCaps
	for k, o := range odds {
		if rng.Int64N(100) < o.percent {
			w[k] = o.least + rng.Int64N(o.most-o.least+1)
			if windowKind(k).kind() != requests {
				w[k] *= 10
			}
		}
	}
	caps := windowLimitCaps(w)
	if rng.IntN(10) < 4 {
		burst := 1 + rng.Int64N(4)
		b, err := LimitConfig{Rate: json.Number([]string{"0.01", "0.037", "0.1"}[rng.IntN(3)]), Burst: burst, Cost: 1 + rng.Int64N(burst)}.caps()
		if err != nil {
			t.Fatal(err)
		}
		caps.bucket = b.bucket
	}
	if caps == (limitCaps{}) {
		caps = windowLimitCaps(windowCaps{rpm: 3})
	}
	return caps
}

// randomChain is the positions of 1 to most of n limits, in a random order.
func randomChain(rng *rand.Rand, n, most int) []int {
	return rng.Perm(n)[:1+rng.IntN(min(most, n))]
}

// randomReservation is a request's reservation of input and output tokens,
// up to past the caps of randomCaps; either part may be none.
func randomReservation(rng *rand.Rand) tokenCounts {
	in, out := 10*rng.Int64N(6), 10*rng.Int64N(5)
	if in+out == 0 {
		out = 10
	}
	return tokenCounts{total: in + out, input: in, output: out}
}

// randomUsage is a response's usage: its total may be above its input and
// output (Anthropic's cache reads).
func randomUsage(rng *rand.Rand) tokenCounts {
	in, out := 10*rng.Int64N(10), 10*rng.Int64N(6)
	return tokenCounts{total: in + out + 10*rng.Int64N(2), input: in, output: out}
}
