package limiter

import (
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// The classes of the floors of the cases below: prod's floor is the
// first, batch's the second; a request of neither is of class 0.
const (
	anyClass uint8 = iota
	prodClass
	batchClass
)

// newFloorLimit is a limit with caps whose floors keep percents for
// classes 1, 2, ….
func newFloorLimit(scope string, caps Caps, percents ...uint8) Limit {
	copy(caps.Floors[:], percents)
	return NewLimit("", scope, redistest.UniqueID(nil), caps)
}

// ofClass is the chain of l alone, for a request of class.
func ofClass(l Limit, class uint8) []Limit {
	l.Class = class
	return []Limit{l}
}

// admitFloors admits a request of class on l at at, and checks whether it
// was admitted and, refused, whether for the floor of refusedFor (0:
// refused for no floor).
func admitFloors(t *testing.T, s Store, l Limit, class uint8, at int64, reserve TokenCounts, admit bool, refusedFor uint8) Admission {
	t.Helper()
	a := admitted(t, s, ofClass(l, class), at, reserve)
	if a.Admitted != admit || !admit && a.Refusal.Floor != refusedFor {
		t.Fatalf("a request of class %d: admitted %v refused for the floor of class %d (%+v), want admitted %v refused for that of %d",
			class, a.Admitted, a.Refusal.Floor, a.Refusal, admit, refusedFor)
	}
	return a
}

// admitEach admits n requests of class on l at at, every one of which
// must fit.
func admitEach(t *testing.T, s Store, l Limit, class uint8, at int64, n int) {
	t.Helper()
	for range n {
		admitFloors(t, s, l, class, at, TokenCounts{}, true, 0)
	}
}

func runFloorsConformance(t *testing.T, kit storeKit) {
	t.Run("AClassAloneIsAdmittedUpToTheWholeCap", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		l := newFloorLimit("provider", CapsOfWindows(WindowCaps{RPM: 10}), 60, 10)
		admitEach(t, s, l, batchClass, at, 10)
		admitFloors(t, s, l, batchClass, at, TokenCounts{}, false, 0)
	})
	// prod asks once: what its floor still has (6 - 1 of 10) is held for
	// it, from batch and from requests of no class, not from prod.
	t.Run("AClassThatAsksKeepsWhatItsFloorStillHas", func(t *testing.T) {
		stores := kit.replicas(t, 2)
		at := pinnedBase() + 1000
		l := newFloorLimit("provider", CapsOfWindows(WindowCaps{RPM: 10}), 60, 10)
		admitFloors(t, stores[0], l, prodClass, at, TokenCounts{}, true, 0)
		admitEach(t, stores[1], l, batchClass, at+1, 3)
		admitFloors(t, stores[1], l, anyClass, at+1, TokenCounts{}, true, 0)
		a := admitFloors(t, stores[1], l, batchClass, at+2, TokenCounts{}, false, prodClass)
		if a.Refusal.Kind != Requests || a.Refusal.Window != RPM || a.Refusal.Capacity != 10 {
			t.Fatalf("batch refused %+v, want by the rpm of 10", a.Refusal)
		}
		admitFloors(t, stores[0], l, anyClass, at+2, TokenCounts{}, false, prodClass)
		admitEach(t, stores[0], l, prodClass, at+3, 5) // prod's 6, and the 10
		admitFloors(t, stores[0], l, prodClass, at+3, TokenCounts{}, false, 0)
	})
	t.Run("AClassThatStopsAskingLeavesItsFloorToTheOthers", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		l := newFloorLimit("provider", CapsOfWindows(WindowCaps{RPM: 10}), 60)
		admitFloors(t, s, l, prodClass, at, TokenCounts{}, true, 0)
		admitEach(t, s, l, anyClass, at+1, 4)
		a := admitFloors(t, s, l, anyClass, at+FloorAskingMillis-1, TokenCounts{}, false, prodClass)
		if a.Refusal.WaitMillis != 1 {
			t.Fatalf("others told to wait %d ms, want 1: prod stops asking then", a.Refusal.WaitMillis)
		}
		admitEach(t, s, l, anyClass, at+FloorAskingMillis, 5)
	})
	// The floor is exact across replicas racing: of rpm 30, prod's floor
	// of 50% holds 14 for it after its first request.
	t.Run("ReplicasRacingKeepEachFloorExactly", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		at := pinnedBase() + 1000
		l := newFloorLimit("provider", CapsOfWindows(WindowCaps{RPM: 30}), 50)
		admitFloors(t, stores[0], l, prodClass, at, TokenCounts{}, true, 0)
		if got := raceAdmissions(t, stores, ofClass(l, anyClass), 96, at+1); got != 15 {
			t.Fatalf("replicas admitted %d of others' 96, want 15 of 30 beside prod's 1 and the 14 its floor holds", got)
		}
		if got := raceAdmissions(t, stores, ofClass(l, prodClass), 96, at+2); got != 14 {
			t.Fatalf("replicas admitted %d of prod's 96, want the 14 its floor held", got)
		}
	})
	// A settlement moves what the class used as it moves the limit's:
	// prod reserved 400, used 100, and its floor of 500 holds 400 again.
	t.Run("ASettlementMovesWhatTheClassUsed", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		l := newFloorLimit("provider", CapsOfWindows(WindowCaps{TPM: 1000}), 50)
		a := admitFloors(t, s, l, prodClass, at, totalTokens(400), true, 0)
		settle(t, pinned(s, at+1), ofClass(l, prodClass), Charge{Tokens: totalTokens(100).Minus(a.Reserve)}.Settling(a.Decision))
		admitFloors(t, s, l, anyClass, at+2, totalTokens(500), true, 0)
		admitFloors(t, s, l, anyClass, at+2, totalTokens(10), false, prodClass)
		admitFloors(t, s, l, prodClass, at+3, totalTokens(400), true, 0)
	})
	// A bucket's floor: prod's 50% of a burst of 10, while the deficit
	// that prod's requests made refills in proportion.
	t.Run("ABucketsFloorIsHeldForItsClass", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		l := newFloorLimit("provider", Caps{Bucket: newTokenBucket(t, "1", 10, 1)}, 50)
		admitEach(t, s, l, prodClass, at, 2)
		admitEach(t, s, l, anyClass, at, 5) // 10 - 2 - the 3 held
		a := admitFloors(t, s, l, anyClass, at, TokenCounts{}, false, prodClass)
		if a.Refusal.Kind != Burst || a.Refusal.WaitMillis != 1000 {
			t.Fatalf("others refused %+v, want by the bucket, for the 1 s it takes to refill a token beside what prod's floor holds", a.Refusal)
		}
		admitEach(t, s, l, prodClass, at, 3)
		// 4 s later 4 tokens are back; prod's 5 of the 10 taken weigh 3
		// (5 × 6/10), so its floor holds 2 of them.
		admitEach(t, s, l, anyClass, at+4000, 2)
		admitFloors(t, s, l, anyClass, at+4000, TokenCounts{}, false, prodClass)
	})
	// A learned quota's floor: the provider reported 9 of 10 requests left.
	t.Run("ALearnedQuotasFloorIsHeldForItsClass", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		l := newFloorLimit("provider", Caps{Learn: true}, 50)
		learnOrFail(t, s, ofClass(l, anyClass), requestsReport(at, 10, 9, 60_000))
		admitFloors(t, s, l, prodClass, at, TokenCounts{}, true, 0)
		admitEach(t, s, l, anyClass, at, 4) // 10 - 2 - the 4 held
		a := admitFloors(t, s, l, anyClass, at, TokenCounts{}, false, prodClass)
		if a.Refusal.Kind != Provider || a.Refusal.Capacity != 10 {
			t.Fatalf("others refused %+v, want by the provider's quota of 10", a.Refusal)
		}
		admitEach(t, s, l, prodClass, at, 4)
		admitFloors(t, s, l, prodClass, at, TokenCounts{}, false, 0)
	})
}
