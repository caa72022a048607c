package ratelimit

import (
	"testing"
	"time"
)

// A reset is written as time.Duration's String writes it, without its
// allocation: every millisecond up to three minutes, and a sample of longer
// ones up to two days.
func TestResetTimesAreWrittenAsDurationsStringWritesThem(t *testing.T) {
	check := func(ms int64) {
		if got, want := string(appendMillis(nil, ms)), (time.Duration(ms) * time.Millisecond).String(); got != want {
			t.Fatalf("%d ms written %q, want %q", ms, got, want)
		}
	}
	for ms := int64(-1000); ms <= 180_000; ms++ {
		check(ms)
	}
	for ms := int64(180_000); ms <= 2*86_400_000; ms += 997 {
		check(ms)
	}
}
