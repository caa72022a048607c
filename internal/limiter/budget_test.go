package limiter

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/pricing"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// newBudgetLimit is a limit without a hash tag with a day and a month
// budget in nano-dollars (0: none) in the calendar of zone, and requests
// per minute at perMinute (0: no cap).
func newBudgetLimit(t testing.TB, scope, id string, day, month, perMinute int64, zone string) Limit {
	t.Helper()
	c, err := CalendarOf(zone)
	if err != nil {
		t.Fatal(err)
	}
	caps := CapsOfWindows(WindowCaps{RPM: perMinute})
	caps.Budgets = BudgetCaps{Max: [NumBudgetPeriods]int64{BudgetDay: day, BudgetMonth: month}, Calendar: c}
	return NewLimit("", scope, id, caps)
}

// localMillis is the unix milliseconds of a wall-clock time in zone.
func localMillis(t testing.TB, zone string, year int, month time.Month, day, hour, minute, sec, ms int) int64 {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	return time.Date(year, month, day, hour, minute, sec, ms*1e6, loc).UnixMilli()
}

// admitCost admits chain on s at the pinned time, reserving cost
// nano-dollars (and a token, so that the admission reserves).
func admitCost(t *testing.T, s Store, chain []Limit, at, cost int64) Admission {
	t.Helper()
	a, err := pinned(s, at).Admit(context.Background(), chain, TokenCounts{Total: 1, Cost: cost})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// budgetState is what budget p of the chain's i-th limit holds at the
// pinned time, as an admission reads it.
func budgetState(t *testing.T, s Store, chain []Limit, i int, p BudgetPeriod, at int64) (spent, reserved int64) {
	t.Helper()
	d, err := pinned(s, at).Peek(context.Background(), chain)
	if err != nil {
		t.Fatal(err)
	}
	return d.Counts[i].Spent[p], d.Counts[i].Reserved[p]
}

// settlement is the charge that settles an admission d that reserved
// reserved at a real cost of cost.
func settlement(d Decision, cost int64) Charge {
	return Charge{Tokens: TokenCounts{Total: 1 - d.Reserve.Total, Cost: cost}, Unreserve: d.Reserve.Cost, Minute: d.Now.Minute}
}

const usd = pricing.NanoPerUSD

func runBudgetConformance(t *testing.T, kit storeKit) {
	t.Run("ABudgetAdmitsWhatFitsBesideWhatIsSpentAndReservedAndRefusesUntilItRenews", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		const zone = "Europe/Paris"
		at := localMillis(t, zone, 2026, time.March, 10, 15, 0, 0, 0)
		chain := []Limit{newBudgetLimit(t, "team", redistest.UniqueID(t), 10*usd, 0, 0, zone)}
		for i := range 10 {
			if a := admitCost(t, s, chain, at, usd); !a.Admitted {
				t.Fatalf("admission %d of 10 of $1 under $10 refused", i+1)
			}
		}
		a := admitCost(t, s, chain, at, 1)
		if a.Admitted {
			t.Fatal("a request was admitted beyond a budget full of reservations")
		}
		renews := localMillis(t, zone, 2026, time.March, 11, 0, 0, 0, 0)
		if a.Refusal.Kind != Budget || a.Refusal.Period != BudgetDay || a.Refusal.WaitMillis != renews-at || a.Refusal.Used != 10*usd {
			t.Fatalf("refusal %+v, want a day budget's, of $10 used, renewing in %d ms", a.Refusal, renews-at)
		}
		if a := admitCost(t, s, chain, renews-1, 1); a.Admitted {
			t.Fatal("admitted 1 ms before the day renews")
		}
		if a := admitCost(t, s, chain, renews, 10*usd); !a.Admitted {
			t.Fatal("the next day's first request, of the whole budget, was refused")
		}
	})

	t.Run("ConcurrentAdmissionsAcrossReplicasAdmitExactlyWhatTheBudgetHolds", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		at := pinnedBase()
		chain := []Limit{newBudgetLimit(t, "key", redistest.UniqueID(t), 0, 10*(usd/4), 0, "UTC")}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for i := range 40 {
			s := pinned(stores[i%len(stores)], at)
			wg.Go(func() {
				a, err := s.Admit(context.Background(), chain, TokenCounts{Total: 1, Cost: usd / 4})
				if err != nil {
					t.Error(err)
				}
				if a.Admitted {
					admitted.Add(1)
				}
			})
		}
		wg.Wait()
		if n := admitted.Load(); n != 10 {
			t.Fatalf("%d of 40 concurrent requests admitted against a budget that holds exactly 10", n)
		}
		if spent, reserved := budgetState(t, stores[0], chain, 0, BudgetMonth, at); spent != 0 || reserved != 10*(usd/4) {
			t.Fatalf("spent %d, reserved %d; want 0 and the 10 reservations", spent, reserved)
		}
	})

	t.Run("ASettlementReplacesTheReservationByTheRealCostAndNeverGoesBelowZero", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase()
		chain := []Limit{newBudgetLimit(t, "key", redistest.UniqueID(t), 5*usd, 50*usd, 0, "UTC")}
		var ds []Decision
		for range 3 {
			ds = append(ds, admitCost(t, s, chain, at, usd).Decision)
		}
		pinned(s, at+1000)
		settle(t, s, chain, settlement(ds[0], 300_000_001))
		settle(t, s, chain, settlement(ds[1], 0))
		for _, p := range []BudgetPeriod{BudgetDay, BudgetMonth} {
			if spent, reserved := budgetState(t, s, chain, 0, p, at+2000); spent != 300_000_001 || reserved != usd {
				t.Fatalf("%s: spent %d, reserved %d; want 300000001 and one reservation of $1 left", p, spent, reserved)
			}
		}
		// A settlement taking back more than is reserved (a reservation
		// its period lost) leaves it at zero.
		settle(t, s, chain, Charge{Tokens: TokenCounts{Cost: 7}, Unreserve: 100 * usd, Minute: ds[2].Now.Minute})
		if spent, reserved := budgetState(t, s, chain, 0, BudgetDay, at+3000); spent != 300_000_008 || reserved != 0 {
			t.Fatalf("spent %d, reserved %d; want 300000008 and 0", spent, reserved)
		}
	})

	t.Run("ARefusedRequestReservesAndChargesNothingAnywhere", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase()
		id := redistest.UniqueID(t)
		chain := []Limit{newLimit("key", id, 5, 0), newBudgetLimit(t, "team", id, usd, usd, 0, "UTC")}
		if a := admitCost(t, s, chain, at, usd+1); a.Admitted || a.Refusal.Kind != Budget || a.Refusal.First != 1 {
			t.Fatalf("admitted %v, refusal %+v; want the team's budget to refuse", a.Admitted, a.Refusal)
		}
		d, err := pinned(s, at).Peek(context.Background(), chain)
		if err != nil {
			t.Fatal(err)
		}
		if d.Counts[0].Window[RPM].Cur != 0 || d.Counts[1].Reserved != [NumBudgetPeriods]int64{} {
			t.Fatalf("a refused request was charged: %+v", d.Counts)
		}
	})

	t.Run("ARequestWithoutAReservationIsAdmittedWhileTheBudgetIsNotSpentAndChargedAfter", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase()
		chain := []Limit{newBudgetLimit(t, "key", redistest.UniqueID(t), usd, 0, 0, "UTC")}
		for range 2 {
			if !admitOrFail(t, s, chain, at).Admitted {
				t.Fatal("a request reserving nothing was refused by a budget not yet spent")
			}
			pinned(s, at)
			settle(t, s, chain, Charge{Tokens: TokenCounts{Total: 10, Cost: usd / 2}})
		}
		a, err := pinned(s, at).Admit(context.Background(), chain, TokenCounts{})
		if err != nil {
			t.Fatal(err)
		}
		if a.Admitted || a.Refusal.Kind != Budget {
			t.Fatalf("admitted %v with the budget spent", a.Admitted)
		}
	})

	t.Run("AReservationSettledAfterMidnightLandsInItsOwnDayAndMonth", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		const zone = "America/New_York"
		chain := []Limit{newBudgetLimit(t, "key", redistest.UniqueID(t), 10*usd, 100*usd, 0, zone)}
		// holds checks what budget p holds at the moment at.
		holds := func(what string, p BudgetPeriod, at, spent, reserved int64) {
			t.Helper()
			if gotSpent, gotReserved := budgetState(t, s, chain, 0, p, at); gotSpent != spent || gotReserved != reserved {
				t.Fatalf("%s: spent %d, reserved %d; want %d and %d", what, gotSpent, gotReserved, spent, reserved)
			}
		}
		reserved := localMillis(t, zone, 2026, time.March, 9, 23, 59, 58, 0)
		settled := localMillis(t, zone, 2026, time.March, 10, 0, 0, 2, 0)
		d := admitCost(t, s, chain, reserved, 4*usd).Decision
		if !admitCost(t, s, chain, settled, usd).Admitted {
			t.Fatal("the new day's first request was refused")
		}
		pinned(s, settled)
		settle(t, s, chain, settlement(d, 3*usd))
		holds("the day of the reservation", BudgetDay, reserved, 3*usd, 0)
		holds("the new day", BudgetDay, settled, 0, usd)
		holds("the month", BudgetMonth, settled, 3*usd, usd)
		// Across a month's end, the old month takes it, the new one not.
		monthEnd := localMillis(t, zone, 2026, time.March, 31, 23, 59, 58, 0)
		nextMonth := localMillis(t, zone, 2026, time.April, 1, 0, 0, 2, 0)
		d = admitCost(t, s, chain, monthEnd, 4*usd).Decision
		pinned(s, nextMonth)
		settle(t, s, chain, settlement(d, 3*usd))
		holds("the old month", BudgetMonth, monthEnd, 6*usd, usd)
		holds("the new month", BudgetMonth, nextMonth, 0, 0)
		holds("the new month's first day", BudgetDay, nextMonth, 0, 0)
	})

	t.Run("AMonthRenewsAtTheFirstMomentOfTheNextMonthInItsTimeZone", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		const zone = "Asia/Kolkata" // UTC+05:30: the month starts at 18:30 UTC
		chain := []Limit{newBudgetLimit(t, "org", redistest.UniqueID(t), 0, 2*usd, 0, zone)}
		last := localMillis(t, zone, 2026, time.January, 31, 23, 59, 59, 999)
		if !admitCost(t, s, chain, last-10_000, 2*usd).Admitted {
			t.Fatal("the month's whole budget was refused")
		}
		a := admitCost(t, s, chain, last, 1)
		if a.Admitted || a.Refusal.WaitMillis != 1 {
			t.Fatalf("at the month's last millisecond: admitted %v, wait %d ms; want refused, renewing in 1 ms", a.Admitted, a.Refusal.WaitMillis)
		}
		if time.UnixMilli(last+1).UTC().Format(time.RFC3339) != "2026-01-31T18:30:00Z" {
			t.Fatal("the test's zone does not start its months at 18:30 UTC")
		}
		if !admitCost(t, s, chain, last+1, 2*usd).Admitted {
			t.Fatal("the next month's first millisecond refused its whole budget")
		}
	})
}

func TestCalendarPeriodsTileTimeInEveryZoneAcrossChangesOfClocks(t *testing.T) {
	// Santiago and Havana skip midnight when their clocks go forward;
	// Lord Howe moves by half an hour; Kolkata and Kathmandu are off UTC
	// by half and three quarters of an hour.
	for _, zone := range []string{"UTC", "America/Santiago", "America/Havana", "Australia/Lord_Howe", "Asia/Kolkata", "Asia/Kathmandu", "Europe/Paris"} {
		c, err := CalendarOf(zone)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []BudgetPeriod{BudgetDay, BudgetMonth} {
			at := localMillis(t, zone, 2025, time.January, 1, 12, 0, 0, 0)
			prev := c.Span(p, FloorDiv(at, MinuteMillis))
			for range 400 {
				next := c.Span(p, FloorDiv(prev.End, MinuteMillis))
				if next.Start != prev.End || next.End <= next.Start {
					t.Fatalf("%s %s: %v does not follow %v", zone, p, next, prev)
				}
				local := time.UnixMilli(next.Start).In(c.Location)
				if p == BudgetMonth && local.Day() != 1 || local.Add(-time.Millisecond).Day() == local.Day() {
					t.Fatalf("%s %s: a period starts at %s, not on the first moment of a date", zone, p, local)
				}
				if next.Start%MinuteMillis != 0 {
					t.Fatalf("%s %s: a period starts at %s, not on a whole minute", zone, p, local)
				}
				prev = next
			}
		}
	}
}

func TestABudgetTimezoneMustBeAnIANAZone(t *testing.T) {
	for _, zone := range []string{"Local", "Mars/Olympus_Mons", "+05:00"} {
		if _, err := CalendarOf(zone); err == nil {
			t.Errorf("budget_timezone %q accepted", zone)
		}
	}
	a, _ := CalendarOf("Europe/Paris")
	b, _ := CalendarOf("Europe/Paris")
	if a != b {
		t.Error("two calendars of one zone: the caps of handlers with the same zone would differ")
	}
}

// budgetKey is the key of the budget period s, spent or reserved, of the
// limit with prefix, as admit.lua's calls name it.
func budgetKey(s periodSpan, prefix string, p BudgetPeriod, reserved bool) string {
	var key strings.Builder
	s.writeKey(&key, prefix, p, reserved)
	return key.String()
}
