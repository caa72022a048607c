package limiter

import (
	"testing"
)

func TestRateIsReadAsAnExactDecimal(t *testing.T) {
	for in, want := range map[string]int64{"1": 1000, "0.5": 500, "0.001": 1, "2.125": 2125, "10.50": 10500, "1000000": 1_000_000_000, "007": 7000} {
		if got, err := ParseRate(in); err != nil || got != want {
			t.Errorf("parseRate(%q) = %d, %v; want %d milli-tokens per second", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "0.0", "0.0001", "-1", "+1", ".5", "5.", "1e3", "1_000", "0x10", "1000000.001", " 1", "NaN"} {
		if got, err := ParseRate(in); err == nil {
			t.Errorf("parseRate(%q) = %d, want an error", in, got)
		}
	}
}

func TestBucketArithmeticIsExactAtTheMillisecond(t *testing.T) {
	b := TokenBucket{Rate: 1500, Burst: 4, Cost: 2} // 1.5 tokens per second
	full := int64(4 * MicroTokens)
	if !b.fits(2*MicroTokens) || b.fits(2*MicroTokens+1) {
		t.Fatal("cost 2 must fit exactly while 2 tokens are left")
	}
	if got := b.releaseIn(full); got != 1334 {
		t.Fatalf("an empty bucket gives 2 tokens back in %d ms, want 1334 (1333.3 rounded up)", got)
	}
	if d := b.refilled(full, 0, 1334); !b.fits(d) {
		t.Fatal("refused at the announced release")
	}
	if d := b.refilled(full, 0, 1333); b.fits(d) {
		t.Fatal("admitted 1 ms before the announced release")
	}
	if got := b.refilled(full, 1000, 900); got != full {
		t.Fatalf("a clock going back refilled to %d", got)
	}
	if got := b.refilled(full, 0, 1<<62); got != 0 {
		t.Fatalf("after an age the deficit is %d, want 0", got)
	}
	if got := b.Left(full + MicroTokens); got != 0 {
		t.Fatalf("an overdrawn bucket has %d left, want 0", got)
	}
}
