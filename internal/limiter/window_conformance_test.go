package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// The day windows and the input and output windows, in the conformance
// suite that both stores pass.
func runWindowConformance(t *testing.T, kit storeKit) {
	t.Run("RPDAcrossADayBoundaryWaitsUntilThePreviousDayWeighsLessThanTheCap", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		dayStart := nextDay()
		chain := []Limit{newWindowLimit("key", redistest.UniqueID(t), WindowCaps{RPD: 10, RPM: 1000})}
		at := dayStart - time.Hour.Milliseconds() + 500 // 23:00:00.5
		fill(t, s, chain, at, 10)
		d := admitOrFail(t, s, chain, at)
		ref := RefusalOf(chain, d)
		if d.Admitted || ref.Kind != Requests || ref.WindowName() != "day" || ref.Capacity != 10 {
			t.Fatalf("admitted %v, refusal %+v: want the 11th request refused by the rpd", d.Admitted, ref)
		}
		if ref.Window != RPD {
			t.Fatalf("refused by the %v window, want the RPD one, which the message names", ref.Window)
		}
		if n := kit.count(t, s, chain[0].Prefix, RPD, dayStart/86_400_000-1); n != 10 {
			t.Fatalf("the day period holds %d requests, want 10", n)
		}
		// At midnight the previous day counts in full; it weighs 9 of 10
		// once a tenth of the new day has passed: 02:24:00.
		if d := admitOrFail(t, s, chain, dayStart); d.Admitted || d.Counts[0].Window[RPD] != (Window{Prev: 10}) {
			t.Fatalf("at midnight admitted %v reading %+v, want the previous day's 10 in full", d.Admitted, d.Counts[0].Window[RPD])
		}
		assertReleaseAt(t, s, chain, at, dayStart+8_640_000)
	})
	t.Run("TPDCountsReservationsAndSettlesThemAfterTheirMinuteHasLeftTheWindow", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		at := pinnedBase() + 1000
		chain := []Limit{newWindowLimit("org", redistest.UniqueID(t), WindowCaps{TPD: 10_500})}
		if got := raceReservations(t, stores, chain, 40, 1000, at); got != 10 {
			t.Fatalf("admitted %d of 40 reservations of 1000 against tpd 10500, want exactly 10", got)
		}
		day := DayOf(at / MinuteMillis)
		if n := kit.count(t, stores[0], chain[0].Prefix, TPD, day); n != 10_000 {
			t.Fatalf("the day period holds %d tokens, want the 10 reservations' 10000", n)
		}
		a, err := pinned(stores[0], at).Admit(context.Background(), chain, totalTokens(1000))
		if err != nil || a.Admitted || a.Refusal.Kind != Tokens || a.Refusal.WindowName() != "day" {
			t.Fatalf("admitted %v, refusal %+v, %v: want a tokens refusal by the day window", a.Admitted, a.Refusal, err)
		}
		// Five minutes later the reservation's minute is out of the minute
		// windows, not out of the day: the settlement still lands.
		settle(t, pinned(stores[0], at+5*MinuteMillis), chain, Charge{Tokens: totalTokens(400 - 1000), Minute: at / MinuteMillis})
		if n := kit.count(t, stores[0], chain[0].Prefix, TPD, day); n != 9_400 {
			t.Fatalf("the day period holds %d tokens after a settlement of 400, want 9400", n)
		}
		if !admitReserving(t, stores[0], chain, at+5*MinuteMillis, 1000).Admitted {
			t.Fatal("1000 more refused with 9400 of 10500 used")
		}
	})
	t.Run("InputAndOutputCapsEachHoldTheirPartOfAReservation", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []Limit{newWindowLimit("org", redistest.UniqueID(t), WindowCaps{ITPM: 10_000, OTPM: 2_500, TPM: 100_000})}
		reserve := func(in, out int64) Admission {
			t.Helper()
			a, err := pinned(s, at).Admit(context.Background(), chain, TokenCounts{Total: in + out, Input: in, Output: out})
			if err != nil {
				t.Fatal(err)
			}
			return a
		}
		for i := range 2 {
			if !reserve(3000, 1000).Admitted {
				t.Fatalf("reservation %d of 3000 in and 1000 out refused", i+1)
			}
		}
		if a := reserve(3000, 1000); a.Admitted || a.Refusal.Kind != OutputTokens {
			t.Fatalf("admitted %v, refusal %+v: want 3000 out of otpm 2500 refused on output tokens", a.Admitted, a.Refusal)
		}
		if !reserve(3000, 500).Admitted {
			t.Fatal("9000 in and 2500 out refused under itpm 10000 and otpm 2500")
		}
		if a := reserve(1001, 0); a.Admitted || a.Refusal.Kind != InputTokens || a.Refusal.Capacity != 10_000 {
			t.Fatalf("admitted %v, refusal %+v: want 10001 in refused on input tokens", a.Admitted, a.Refusal)
		}
		b := at / MinuteMillis
		for _, want := range []struct {
			k WindowKind
			n int64
		}{{ITPM, 9000}, {OTPM, 2500}, {TPM, 11_500}} {
			if n := kit.count(t, s, chain[0].Prefix, want.k, b); n != want.n {
				t.Fatalf("%s holds %d, want %d", want.k, n, want.n)
			}
		}
	})
	t.Run("ASettlementChargesEachWindowTheUsageOfItsKind", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []Limit{newWindowLimit("org", redistest.UniqueID(t), WindowCaps{TPM: 100_000, ITPM: 100_000, OTPM: 100_000, ITPD: 1_000_000})}
		reserved := TokenCounts{Total: 1200, Input: 200, Output: 1000}
		a, err := pinned(s, at).Admit(context.Background(), chain, reserved)
		if err != nil || !a.Admitted {
			t.Fatalf("admitted %v, %v", a.Admitted, err)
		}
		// Anthropic-like usage: cache reads count in the total, not in the input.
		used := TokenCounts{Total: 2500, Input: 1200, Output: 300}
		settle(t, pinned(s, at+2000), chain, Charge{Tokens: used.Minus(reserved), Minute: a.Now.Minute})
		b := at / MinuteMillis
		for _, want := range []struct {
			k      WindowKind
			period int64
			n      int64
		}{{TPM, b, 2500}, {ITPM, b, 1200}, {OTPM, b, 300}, {ITPD, DayOf(b), 1200}} {
			if n := kit.count(t, s, chain[0].Prefix, want.k, want.period); n != want.n {
				t.Fatalf("%s holds %d after the settlement, want %d", want.k, n, want.n)
			}
		}
	})
	t.Run("AFullInputWindowRefusesWhileTheOutputWindowHasRoom", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []Limit{newWindowLimit("key", redistest.UniqueID(t), WindowCaps{ITPM: 60, OTPM: 1000})}
		if !admitOrFail(t, s, chain, at).Admitted {
			t.Fatal("first request refused")
		}
		settle(t, pinned(s, at+1), chain, Charge{Tokens: TokenCounts{Total: 100, Input: 60, Output: 40}})
		d := admitOrFail(t, s, chain, at+2)
		if ref := RefusalOf(chain, d); d.Admitted || ref.Kind != InputTokens || ref.WindowName() != "minute" {
			t.Fatalf("admitted %v, refusal %+v: want a refusal on input tokens with 60 of itpm 60 used", d.Admitted, ref)
		}
		if n := kit.count(t, s, chain[0].Prefix, OTPM, at/MinuteMillis); n != 40 {
			t.Fatalf("otpm holds %d, want the 40 output tokens", n)
		}
	})
}

// newWindowLimit is a limit of the given window caps without a hash tag.
func newWindowLimit(scope, id string, caps WindowCaps) Limit {
	return NewLimit("", scope, id, CapsOfWindows(caps))
}

// nextDay is the next day boundary after now, in unix milliseconds, for
// pinned clocks whose keys Redis expires like real ones.
func nextDay() int64 { return (time.Now().UnixMilli()/86_400_000 + 1) * 86_400_000 }
