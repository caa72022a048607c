package ratelimit

import (
	"context"
	"strings"
	"testing"
	"time"
)

// The day windows and the input and output windows, in the conformance
// suite that both stores pass.
func runWindowConformance(t *testing.T, kit storeKit) {
	t.Run("RPDAcrossADayBoundaryWaitsUntilThePreviousDayWeighsLessThanTheCap", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		dayStart := nextDay()
		chain := []limit{newWindowLimit("key", uniqueID(t), windowCaps{rpd: 10, rpm: 1000})}
		at := dayStart - time.Hour.Milliseconds() + 500 // 23:00:00.5
		fill(t, s, chain, at, 10)
		d := admitOrFail(t, s, chain, at)
		ref := refusalOf(chain, d)
		if d.admitted || ref.kind != requests || ref.windowName() != "day" || ref.capacity != 10 {
			t.Fatalf("admitted %v, refusal %+v: want the 11th request refused by the rpd", d.admitted, ref)
		}
		if msg := ref.message(chain); !strings.Contains(msg, "limit 10 RPD (requests per day)") {
			t.Fatalf("refusal message %q does not name the day window", msg)
		}
		if n := kit.count(t, s, chain[0].prefix, rpd, dayStart/86_400_000-1); n != 10 {
			t.Fatalf("the day period holds %d requests, want 10", n)
		}
		// At midnight the previous day counts in full; it weighs 9 of 10
		// once a tenth of the new day has passed: 02:24:00.
		if d := admitOrFail(t, s, chain, dayStart); d.admitted || d.counts[0].w[rpd] != (window{prev: 10}) {
			t.Fatalf("at midnight admitted %v reading %+v, want the previous day's 10 in full", d.admitted, d.counts[0].w[rpd])
		}
		assertReleaseAt(t, s, chain, at, dayStart+8_640_000)
	})
	t.Run("TPDCountsReservationsAndSettlesThemAfterTheirMinuteHasLeftTheWindow", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		at := pinnedBase() + 1000
		chain := []limit{newWindowLimit("org", uniqueID(t), windowCaps{tpd: 10_500})}
		if got := raceReservations(t, stores, chain, 40, 1000, at); got != 10 {
			t.Fatalf("admitted %d of 40 reservations of 1000 against tpd 10500, want exactly 10", got)
		}
		day := dayOf(at / minuteMillis)
		if n := kit.count(t, stores[0], chain[0].prefix, tpd, day); n != 10_000 {
			t.Fatalf("the day period holds %d tokens, want the 10 reservations' 10000", n)
		}
		a, err := pinned(stores[0], at).admit(context.Background(), chain, totalTokens(1000))
		if err != nil || a.admitted || a.refusal.kind != tokens || a.refusal.windowName() != "day" {
			t.Fatalf("admitted %v, refusal %+v, %v: want a tokens refusal by the day window", a.admitted, a.refusal, err)
		}
		// Five minutes later the reservation's minute is out of the minute
		// windows, not out of the day: the settlement still lands.
		settle(t, pinned(stores[0], at+5*minuteMillis), chain, charge{tokens: totalTokens(400 - 1000), minute: at / minuteMillis})
		if n := kit.count(t, stores[0], chain[0].prefix, tpd, day); n != 9_400 {
			t.Fatalf("the day period holds %d tokens after a settlement of 400, want 9400", n)
		}
		if !admitReserving(t, stores[0], chain, at+5*minuteMillis, 1000).admitted {
			t.Fatal("1000 more refused with 9400 of 10500 used")
		}
	})
	t.Run("InputAndOutputCapsEachHoldTheirPartOfAReservation", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []limit{newWindowLimit("org", uniqueID(t), windowCaps{itpm: 10_000, otpm: 2_500, tpm: 100_000})}
		reserve := func(in, out int64) admission {
			t.Helper()
			a, err := pinned(s, at).admit(context.Background(), chain, tokenCounts{total: in + out, input: in, output: out})
			if err != nil {
				t.Fatal(err)
			}
			return a
		}
		for i := range 2 {
			if !reserve(3000, 1000).admitted {
				t.Fatalf("reservation %d of 3000 in and 1000 out refused", i+1)
			}
		}
		if a := reserve(3000, 1000); a.admitted || a.refusal.kind != outputTokens {
			t.Fatalf("admitted %v, refusal %+v: want 3000 out of otpm 2500 refused on output tokens", a.admitted, a.refusal)
		}
		if !reserve(3000, 500).admitted {
			t.Fatal("9000 in and 2500 out refused under itpm 10000 and otpm 2500")
		}
		if a := reserve(1001, 0); a.admitted || a.refusal.kind != inputTokens || a.refusal.capacity != 10_000 {
			t.Fatalf("admitted %v, refusal %+v: want 10001 in refused on input tokens", a.admitted, a.refusal)
		}
		b := at / minuteMillis
		for _, want := range []struct {
			k windowKind
			n int64
		}{{itpm, 9000}, {otpm, 2500}, {tpm, 11_500}} {
			if n := kit.count(t, s, chain[0].prefix, want.k, b); n != want.n {
				t.Fatalf("%s holds %d, want %d", want.k, n, want.n)
			}
		}
	})
	t.Run("ASettlementChargesEachWindowTheUsageOfItsKind", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []limit{newWindowLimit("org", uniqueID(t), windowCaps{tpm: 100_000, itpm: 100_000, otpm: 100_000, itpd: 1_000_000})}
		reserved := tokenCounts{total: 1200, input: 200, output: 1000}
		a, err := pinned(s, at).admit(context.Background(), chain, reserved)
		if err != nil || !a.admitted {
			t.Fatalf("admitted %v, %v", a.admitted, err)
		}
		// Anthropic-like usage: cache reads count in the total, not in the input.
		used := tokenCounts{total: 2500, input: 1200, output: 300}
		settle(t, pinned(s, at+2000), chain, charge{tokens: used.minus(reserved), minute: a.now.minute})
		b := at / minuteMillis
		for _, want := range []struct {
			k      windowKind
			period int64
			n      int64
		}{{tpm, b, 2500}, {itpm, b, 1200}, {otpm, b, 300}, {itpd, dayOf(b), 1200}} {
			if n := kit.count(t, s, chain[0].prefix, want.k, want.period); n != want.n {
				t.Fatalf("%s holds %d after the settlement, want %d", want.k, n, want.n)
			}
		}
	})
	t.Run("AFullInputWindowRefusesWhileTheOutputWindowHasRoom", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []limit{newWindowLimit("key", uniqueID(t), windowCaps{itpm: 60, otpm: 1000})}
		if !admitOrFail(t, s, chain, at).admitted {
			t.Fatal("first request refused")
		}
		settle(t, pinned(s, at+1), chain, charge{tokens: tokenCounts{total: 100, input: 60, output: 40}})
		d := admitOrFail(t, s, chain, at+2)
		if ref := refusalOf(chain, d); d.admitted || ref.kind != inputTokens || ref.windowName() != "minute" {
			t.Fatalf("admitted %v, refusal %+v: want a refusal on input tokens with 60 of itpm 60 used", d.admitted, ref)
		}
		if n := kit.count(t, s, chain[0].prefix, otpm, at/minuteMillis); n != 40 {
			t.Fatalf("otpm holds %d, want the 40 output tokens", n)
		}
	})
}

// newWindowLimit is a limit of the given window caps without a hash tag.
func newWindowLimit(scope, id string, caps windowCaps) limit {
	return newTaggedLimit("", scope, id, windowLimitCaps(caps))
}

// nextDay is the next day boundary after now, in unix milliseconds, for
// pinned clocks whose keys Redis expires like real ones.
func nextDay() int64 { return (time.Now().UnixMilli()/86_400_000 + 1) * 86_400_000 }
