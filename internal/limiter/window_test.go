package limiter

import (
	"math/rand/v2"
	"testing"
)

// releaseIn must be the earliest whole millisecond at which the counter fits
// an admission of its size (a request, a reservation of any size up to the
// cap, or unreserved tokens) again, absent traffic: checked against a brute-force walk of the clock over
// the current and the next period.
func TestReleaseInIsTheEarliestMillisecondAtWhichTheCounterFits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 400; i++ {
		capacity := 1 + rng.Int64N(20)
		size := rng.Int64N(capacity + 1) // a request is 1, a reservation up to the cap, unreserved tokens 0
		w := Window{Cur: rng.Int64N(3 * capacity), Prev: rng.Int64N(3 * capacity)}
		into := rng.Int64N(MinuteMillis)
		if fits(w, capacity, size, minuteAt(into)) {
			continue
		}
		got := releaseIn(w, capacity, size, minuteAt(into))
		want := int64(-1)
		for t := into; t < 3*MinuteMillis; t++ {
			if fits(windowAt(w, t), capacity, size, minuteAt(t%MinuteMillis)) {
				want = t - into
				break
			}
		}
		if got != want {
			t.Fatalf("size %d cap %d %+v at %d ms: releaseIn %d, brute force %d", size, capacity, w, into, got, want)
		}
	}
}

// A day window counts in seconds: releaseIn is the wait until the earliest
// whole second at which it fits, from a moment within a second.
func TestReleaseInOfADayWindowIsTheEarliestSecondAtWhichTheCounterFits(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 60; i++ {
		capacity := 1 + rng.Int64N(20)
		size := rng.Int64N(capacity + 1)
		w := Window{Cur: rng.Int64N(3 * capacity), Prev: rng.Int64N(3 * capacity)}
		at := rng.Int64N(86_400_000) // milliseconds into the day
		p := MomentAt(at).In(Day)
		if fits(w, capacity, size, p) {
			continue
		}
		got := releaseIn(w, capacity, size, p)
		want := int64(-1)
		for s := at / 1000; s < 3*86_400; s++ {
			if fits(windowAtSpan(w, s, 86_400), capacity, size, MomentAt(s%86_400*1000).In(Day)) {
				want = s*1000 - at
				break
			}
		}
		if got != want {
			t.Fatalf("size %d cap %d %+v at %d ms: releaseIn %d, brute force %d", size, capacity, w, at, got, want)
		}
	}
}

// windowAt is w as read t milliseconds after the start of its current
// minute period, with no traffic since.
func windowAt(w Window, t int64) Window { return windowAtSpan(w, t, MinuteMillis) }

// windowAtSpan is w as read t units after the start of its current period
// of length units.
func windowAtSpan(w Window, t, length int64) Window {
	switch t / length {
	case 0:
		return w
	case 1:
		return Window{Prev: w.Cur}
	}
	return Window{}
}

func TestRemainingAndResetFollowTheEstimate(t *testing.T) {
	// 3 this minute and 12 last minute, 30 s in: estimate 3 + 6 = 9.
	w := Window{Cur: 3, Prev: 12}
	if got := Remaining(w, 10, minuteAt(30_000)); got != 1 {
		t.Fatalf("remaining %d, want 1", got)
	}
	if got := Remaining(w, 5, minuteAt(30_000)); got != 0 {
		t.Fatalf("remaining %d over the cap, want 0", got)
	}
	if got := ResetIn(w, minuteAt(30_000)); got != 90_000 {
		t.Fatalf("reset in %d ms, want the end of the next minute (90000)", got)
	}
	if got := ResetIn(Window{Prev: 4}, minuteAt(30_000)); got != 30_000 {
		t.Fatalf("reset in %d ms, want the end of this minute (30000)", got)
	}
	if got := ResetIn(Window{}, minuteAt(30_000)); got != 0 {
		t.Fatalf("reset in %d ms for an empty window", got)
	}
}

// minuteAt is the position into milliseconds into a minute period.
func minuteAt(into int64) Position { return MomentAt(into).In(Minute) }
