package limiter

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// notifying is l notifying at percents.
func notifying(l Limit, percents ...uint8) Limit {
	caps := *l.Caps
	copy(caps.Notify[:], percents)
	l.Caps = &caps
	return l
}

// crossingRecord gathers the crossings that admissions report, from any
// number of goroutines.
type crossingRecord struct {
	mu  sync.Mutex
	all []Crossing
}

func (r *crossingRecord) admit(t *testing.T, s Store, chain []Limit, at int64, reserve TokenCounts) Admission {
	t.Helper()
	a, err := pinned(s, at).Admit(context.Background(), chain, reserve)
	if err != nil {
		t.Error(err)
		return a
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, Crossings(chain, a.Decision)...)
	return a
}

// percents are the percents of the crossings of part p recorded, sorted,
// and forgets every crossing recorded.
func (r *crossingRecord) take(p Part) []uint8 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []uint8
	for _, c := range r.all {
		if c.Part == p {
			out = append(out, c.Percent)
		}
	}
	r.all = nil
	slices.Sort(out)
	return out
}

// race admits chain n times at once on the stores, in turn.
func (r *crossingRecord) race(t *testing.T, stores []Store, chain []Limit, n int, at int64, reserve TokenCounts) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { r.admit(t, stores[i%len(stores)], chain, at, reserve) })
	}
	wg.Wait()
}

func runNotifyConformance(t *testing.T, kit storeKit) {
	t.Run("ReplicasRacingThroughAMinuteReportEachFractionOnceAndAgainTheNextMinute", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		at := pinnedBase() + 1000
		chain := []Limit{notifying(newLimit("team", redistest.UniqueID(t), 20, 0), 50, 80, 100)}
		var r crossingRecord
		r.race(t, stores, chain, 60, at, TokenCounts{})
		if got := r.take(WindowPart(RPM)); !slices.Equal(got, []uint8{50, 80, 100}) {
			t.Fatalf("crossings %v of 60 racing admissions against rpm 20, want each of 50, 80 and 100 once", got)
		}
		// The next minute reads the last one whole at first: its first
		// admission, refused, reaches every fraction in its own minute.
		r.race(t, stores, chain, 30, at+MinuteMillis-1000, TokenCounts{})
		if got := r.take(WindowPart(RPM)); !slices.Equal(got, []uint8{50, 80, 100}) {
			t.Fatalf("crossings %v in the next minute, want each of 50, 80 and 100 once", got)
		}
	})

	t.Run("ABudgetPushedThroughItsFractionsReportsEachOncePerPeriodWithItsLevel", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		const zone = "Europe/Paris"
		at := localMillis(t, zone, 2026, time.March, 10, 15, 0, 0, 0)
		chain := []Limit{notifying(newBudgetLimit(t, "team", redistest.UniqueID(t), 0, 100*usd, 0, zone), 80, 95, 100)}
		var r crossingRecord
		// 20 reservations of $5 fill $100 exactly; 10 more are refused.
		r.race(t, stores, chain, 30, at, TokenCounts{Total: 1, Cost: 5 * usd})
		r.mu.Lock()
		all := slices.Clone(r.all)
		r.mu.Unlock()
		for _, c := range all {
			if c.Whole != 100*usd || c.Level < int64(c.Percent)*usd || c.Period != localMillis(t, zone, 2026, time.March, 1, 0, 0, 0, 0) {
				t.Errorf("crossing %+v: want a level at or past its percent of $100, in March's period", c)
			}
		}
		if got := r.take(MonthBudgetPart); !slices.Equal(got, []uint8{80, 95, 100}) {
			t.Fatalf("crossings %v, want each of 80, 95 and 100 once", got)
		}
		r.race(t, stores, chain, 10, at+time.Hour.Milliseconds(), TokenCounts{Total: 1, Cost: usd})
		if got := r.take(MonthBudgetPart); len(got) > 0 {
			t.Fatalf("crossings %v again in the same month", got)
		}
		april := localMillis(t, zone, 2026, time.April, 1, 0, 0, 0, 0)
		r.race(t, stores, chain, 30, april, TokenCounts{Total: 1, Cost: 5 * usd})
		if got := r.take(MonthBudgetPart); !slices.Equal(got, []uint8{80, 95, 100}) {
			t.Fatalf("crossings %v in April, want each of 80, 95 and 100 once", got)
		}
	})

	t.Run("ASettlementPastAFractionIsReportedByTheNextAdmissionEvenARefusedOne", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase()
		chain := []Limit{notifying(newBudgetLimit(t, "key", redistest.UniqueID(t), 10*usd, 0, 0, "UTC"), 50, 100)}
		var r crossingRecord
		a := r.admit(t, s, chain, at, TokenCounts{Total: 1, Cost: usd})
		settle(t, s, chain, settlement(a.Decision, 12*usd)) // a response dearer than its reservation
		if a := r.admit(t, s, chain, at+1, TokenCounts{Total: 1, Cost: usd}); a.Admitted {
			t.Fatal("admitted past a spent budget")
		}
		if got := r.take(DayBudgetPart); !slices.Equal(got, []uint8{50, 100}) {
			t.Fatalf("crossings %v, want 50 and 100 reported by the refusal after the settlement", got)
		}
	})

	t.Run("RequestsInFlightReportAFractionAgainOnlyOnceTheyFellBelowIt", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase()
		chain := []Limit{notifying(newSlotLimit("key", redistest.UniqueID(t), 2, 0, time.Minute), 50, 100)}
		var r crossingRecord
		for range 3 {
			r.admit(t, s, chain, at, TokenCounts{})
		}
		if got := r.take(SlotsPart); !slices.Equal(got, []uint8{50, 100}) {
			t.Fatalf("crossings %v filling 2 slots, want 50 and 100", got)
		}
		freeAndWait(t, s, chain)
		r.admit(t, s, chain, at+1, TokenCounts{})
		if got := r.take(SlotsPart); !slices.Equal(got, []uint8{100}) {
			t.Fatalf("crossings %v taking the slot freed, want 100 again", got)
		}
		r.admit(t, s, chain, at+2, TokenCounts{}) // refused: still full
		if got := r.take(SlotsPart); len(got) > 0 {
			t.Fatalf("crossings %v while it stayed full", got)
		}
		freeAndWait(t, s, chain)
		freeAndWait(t, s, chain)
	})

	t.Run("ABucketReportsAFractionAgainOnlyOnceItRefilledBelowIt", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase()
		chain := []Limit{notifying(newBucketLimit(t, "key", redistest.UniqueID(t), "1", 4, 1), 75)}
		var r crossingRecord
		for range 4 {
			r.admit(t, s, chain, at, TokenCounts{})
		}
		if got := r.take(BucketPart); !slices.Equal(got, []uint8{75}) {
			t.Fatalf("crossings %v emptying the bucket, want 75 once", got)
		}
		r.admit(t, s, chain, at+1000, TokenCounts{}) // 1 s refilled a token: read at 3 of 4, 75%, then 4
		if got := r.take(BucketPart); len(got) > 0 {
			t.Fatalf("crossings %v from a level that never fell below 75%%", got)
		}
		r.admit(t, s, chain, at+3000, TokenCounts{}) // 2 s more: 2 of 4 used, then 3
		if got := r.take(BucketPart); !slices.Equal(got, []uint8{75}) {
			t.Fatalf("crossings %v once it refilled below 75%%, want 75 again", got)
		}
	})

	t.Run("ALevelThatReachesSeveralFractionsAtOnceReportsEach", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase()
		l := NewLimit("", "key", redistest.UniqueID(t), CapsOfWindows(WindowCaps{TPM: 1000}))
		chain := []Limit{notifying(l, 10, 50, 90)}
		var r crossingRecord
		r.admit(t, s, chain, at, TokenCounts{Total: 600})
		if got := r.take(WindowPart(TPM)); !slices.Equal(got, []uint8{10, 50}) {
			t.Fatalf("crossings %v reserving 600 of 1000, want 10 and 50", got)
		}
	})
}
