package limiter

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// Each store's reset clears every window its limit caps and its bucket,
// keeps its slots and budgets, and answers what it cleared; a refusal the
// Redis store cached before the reset is forgotten.
func TestStoreResetClearsTheWindowsAndTheBucketAndKeepsSlotsAndBudgets(t *testing.T) {
	t.Run("memory", func(t *testing.T) { checkStoreReset(t, memoryKit()) })
	t.Run("redis", func(t *testing.T) { checkStoreReset(t, redisKit(redistest.EnvURL(t))) })
}

func checkStoreReset(t *testing.T, kit storeKit) {
	s := kit.replicas(t, 1)[0]
	ctx := context.Background()
	at := pinnedBase() + 10_000
	chain := []Limit{
		NewLimit("", "key", redistest.UniqueID(t), CapsOfWindows(WindowCaps{RPM: 2, TPM: 100, RPD: 5})),
		newBucketLimit(t, "user", redistest.UniqueID(t), "0.001", 2, 1),
		newSlotLimit("team", redistest.UniqueID(t), 10, 0, time.Minute),
		newBudgetLimit(t, "org", redistest.UniqueID(t), 1_000_000, 0, 0, "UTC"),
	}
	reserve := TokenCounts{Cost: 1000}
	for range 2 {
		if a, err := pinned(s, at).Admit(ctx, chain, reserve); err != nil || !a.Admitted {
			t.Fatalf("admission: %+v %v", a, err)
		}
	}
	settle(t, pinned(s, at), chain, Charge{Tokens: TokenCounts{Total: 50, Cost: 600}, Unreserve: 1000})
	if a, err := pinned(s, at).Admit(ctx, chain, reserve); err != nil || a.Admitted {
		t.Fatalf("the third admission: %+v %v, want refused by the rpm and the bucket", a, err)
	}
	before, err := pinned(s, at).Peek(ctx, chain)
	if err != nil {
		t.Fatal(err)
	}
	if c := before.Counts; c[0].Window[RPM].Cur != 2 || c[0].Window[TPM].Cur != 50 || c[0].Window[RPD].Cur != 2 || c[1].Deficit == 0 ||
		c[2].Slots != 2 || c[3].Spent[BudgetDay] != 600 || c[3].Reserved[BudgetDay] != 1000 {
		t.Fatalf("before the reset: %+v", c)
	}

	var cleared []string
	for _, l := range chain {
		names, err := pinned(s, at).Reset(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		cleared = append(cleared, fmt.Sprint(names))
	}
	if got := strings.Join(cleared, " "); got != "[rpm tpm rpd] [bucket] [] []" {
		t.Fatalf("cleared %s", got)
	}
	after, err := pinned(s, at).Peek(ctx, chain)
	if err != nil {
		t.Fatal(err)
	}
	want := before.Counts[2:]
	if c := after.Counts; c[0] != (Counts{}) || c[1] != (Counts{}) || !slices.Equal(c[2:], want) {
		t.Fatalf("after the reset: %+v, want the windows and the bucket empty and the rest %+v", c, want)
	}
	for i := range 3 {
		a, err := pinned(s, at).Admit(ctx, chain, reserve)
		if err != nil || a.Admitted != (i < 2) {
			t.Fatalf("admission %d after the reset: %+v %v, want 2 admitted, then refused", i+1, a, err)
		}
	}
}

// A reset on Redis clears what Redis's clock reads even a minute away from
// the gateway's, behind (its previous period is the one before the
// gateway's previous) or ahead (its current period is the gateway's next).
func TestRedisResetClearsWhatARedisClockAMinuteFromTheGatewaysReads(t *testing.T) {
	redisURL := redistest.EnvURL(t)
	for _, skew := range []int64{-MinuteMillis, MinuteMillis} {
		t.Run(fmt.Sprintf("skew%+ds", skew/1000), func(t *testing.T) {
			var gatewayAt atomic.Int64
			s, err := NewRedisStore(&RedisDeployment{URL: redisURL}, time.Second, RedisClock{
				Gateway: func() time.Time { return time.UnixMilli(gatewayAt.Load()) },
				Script:  func(g time.Time) string { return HexArg(g.UnixMilli() + skew) },
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Destruct() })
			ctx := context.Background()
			admit := func(chain []Limit) Admission {
				t.Helper()
				a, err := s.Admit(ctx, chain, TokenCounts{})
				if err != nil {
					t.Fatal(err)
				}
				return a
			}
			at := pinnedBase() + 30_000 // half a minute into Redis's minute too
			id := redistest.UniqueID(t)
			capped := []Limit{newLimit("key", id, 2, 0)}
			// 4 requests in Redis's previous minute weigh 2 at half a minute
			// into its current one: rpm 2 refuses.
			gatewayAt.Store(at - MinuteMillis)
			for range 4 {
				if !admit([]Limit{newLimit("key", id, 1000, 0)}).Admitted {
					t.Fatal("a request under rpm 1000 refused")
				}
			}
			gatewayAt.Store(at)
			a := admit(capped)
			if a.Admitted {
				t.Fatal("admitted, want refused by the previous minute's weight")
			}
			if got, want := a.Now.Minute, MomentAt(at+skew).Minute; got != want {
				t.Fatalf("Redis decided in minute %d, want %d: its clock is not the test's", got, want)
			}
			if _, err := s.Reset(ctx, capped[0]); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if got := admit(capped).Admitted; got != (i < 2) {
					t.Fatalf("admission %d after the reset: admitted %v, want 2 admitted, then refused", i+1, got)
				}
			}
		})
	}
}

func TestRefusalCacheResetForgetsOneLimitsRefusalsAndRecordsNoneSentBeforeIt(t *testing.T) {
	cache := newRefusalCache()
	sent := time.Now()
	refused := Decision{Now: MomentAt(pinnedBase()), Counts: []Counts{{Window: [NumWindows]Window{RPM: {Cur: 1}}}}}
	key := newLimit("key", redistest.UniqueID(t), 1, 0)
	sameCountersOtherCaps := NewLimit("", "key", key.ID, CapsOfWindows(WindowCaps{RPM: 1, RPD: 5}))
	other := newLimit("key", redistest.UniqueID(t), 1, 0)
	for _, l := range []Limit{key, sameCountersOtherCaps, other} {
		cache.record([]Limit{l}, refused, sent, cache.resetsSoFar())
		if !refusesLocally(cache, []Limit{l}, sent) {
			t.Fatalf("%s is not cached", l.Prefix)
		}
	}
	inFlight := cache.resetsSoFar() // an admission sent before the reset
	cache.forgetLimit(key.Prefix)
	for l, want := range map[Limit]bool{key: false, sameCountersOtherCaps: false, other: true} {
		if got := refusesLocally(cache, []Limit{l}, sent); got != want {
			t.Errorf("%s under caps %+v refused locally: %v, want %v", l.Prefix, l.Caps, got, want)
		}
	}
	// Redis may have decided that admission on the counters the reset
	// cleared: its refusal is not recorded. One sent after is.
	cache.record([]Limit{key}, refused, sent, inFlight)
	if refusesLocally(cache, []Limit{key}, sent) {
		t.Fatal("a refusal of an admission sent before the reset was recorded")
	}
	cache.record([]Limit{key}, refused, sent, cache.resetsSoFar())
	if !refusesLocally(cache, []Limit{key}, sent) {
		t.Fatal("a refusal of an admission sent after the reset was not recorded")
	}
}

// A reset keeps the usage of a request in flight: the reset took its
// reservation from the windows, and its settlement, from another replica
// on Redis, charges what it used, in its reservation's minute and day,
// whether that minute is still the current one or the previous one; a
// request admitted after the reset settles as usual. Nothing is charged
// twice.
func TestStoreResetKeepsTheUsageOfARequestInFlight(t *testing.T) {
	t.Run("memory", func(t *testing.T) { checkResetKeepsUsageInFlight(t, memoryKit()) })
	t.Run("redis", func(t *testing.T) { checkResetKeepsUsageInFlight(t, redisKit(redistest.EnvURL(t))) })
}

func checkResetKeepsUsageInFlight(t *testing.T, kit storeKit) {
	stores := kit.replicas(t, 2)
	admitting, resetting := stores[0], stores[1]
	ctx := context.Background()
	for _, settledIn := range []int64{0, MinuteMillis} {
		at := pinnedBase() + 10_000
		chain := []Limit{NewLimit("", "key", redistest.UniqueID(t), CapsOfWindows(WindowCaps{TPM: 10_000, ITPM: 10_000, TPD: 100_000}))}
		reserve := TokenCounts{Total: 1000, Input: 400, Output: 600}
		admit := func(at int64) Decision {
			t.Helper()
			a, err := pinned(admitting, at).Admit(ctx, chain, reserve)
			if err != nil || !a.Admitted {
				t.Fatalf("admission: %+v %v", a, err)
			}
			return a.Decision
		}
		inFlight := admit(at)
		if _, err := pinned(resetting, at+1).Reset(ctx, chain[0]); err != nil {
			t.Fatal(err)
		}
		admittedAfter := admit(at + 2)
		end := at + 3 + settledIn
		settle(t, pinned(admitting, end), chain, Charge{Tokens: TokenCounts{Total: 300, Input: 250}.Minus(reserve)}.Settling(inFlight))
		settle(t, pinned(admitting, end), chain, Charge{Tokens: TokenCounts{Total: 200, Input: 100}.Minus(reserve)}.Settling(admittedAfter))
		d, err := pinned(admitting, end).Peek(ctx, chain)
		if err != nil {
			t.Fatal(err)
		}
		w, minute := d.Counts[0].Window, Window{Cur: 500}
		if settledIn > 0 {
			minute = Window{Prev: 500}
		}
		if w[TPM] != minute || w[ITPM] != (Window{Cur: minute.Cur * 350 / 500, Prev: minute.Prev * 350 / 500}) || w[TPD].Cur != 500 {
			t.Fatalf("settled %d ms into the reservations' minute: tpm %+v itpm %+v tpd %+v, want 500 tokens (300 used by the request in flight across the reset, 200 by the one after), 350 of them input, in the reservations' minute and day",
				end-FloorDiv(at, MinuteMillis)*MinuteMillis, w[TPM], w[ITPM], w[TPD])
		}
	}
}

// One call of settlements restores to each window exactly what a reset
// since each one's admission took from it: the settlements of a moment
// restore together, and those admitted after the reset restore nothing.
// Here two requests of one team are admitted at one moment, the team is
// reset, a third request is admitted, and one call settles all three.
func TestACallOfSettlementsRestoresWhatAResetTookFromEachAdmission(t *testing.T) {
	s := newTestRedisStore(t, redistest.EnvURL(t))
	ctx := context.Background()
	at := pinnedBase() + 10_000
	team := NewLimit("", "team", redistest.UniqueID(t), CapsOfWindows(WindowCaps{TPM: 100_000}))
	chains := make([][]Limit, 3)
	for i := range chains {
		chains[i] = []Limit{NewLimit("", "key", fmt.Sprintf("%s-%d", redistest.UniqueID(t), i), CapsOfWindows(WindowCaps{TPM: 100_000})), team}
	}
	reserve := totalTokens(1000)
	admitted := make([]Decision, 3)
	for i, when := range []int64{at, at, at + 2} {
		if i == 2 {
			if _, err := pinned(s, at+1).Reset(ctx, team); err != nil {
				t.Fatal(err)
			}
		}
		a, err := pinned(s, when).Admit(ctx, chains[i], reserve)
		if err != nil || !a.Admitted {
			t.Fatalf("admission %d: %+v %v", i, a, err)
		}
		admitted[i] = a.Decision
	}
	used := []int64{300, 200, 100}
	var call scriptCall
	for i, chain := range chains {
		call.charges.add(chain, Charge{Tokens: totalTokens(used[i]).Minus(reserve)}.Settling(admitted[i]), MomentAt(at+3))
	}
	if _, charged, err := pinned(s, at+3).call(ctx, &call, false); err != nil || charged != nil {
		t.Fatalf("settlements: %v %v", charged, err)
	}
	for i, chain := range chains {
		d, err := pinned(s, at+3).Peek(ctx, chain)
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Counts[0].Window[TPM].Cur; got != used[i] {
			t.Errorf("key %d's tpm holds %d tokens, want the %d it used", i, got, used[i])
		}
		if got := d.Counts[1].Window[TPM].Cur; got != 600 {
			t.Errorf("the team's tpm holds %d tokens, want 600: the three requests' use (the reset took the first two's reservations, and the third's came after it)", got)
		}
	}
}

// The restores of settlements admitted at one moment, of different sizes,
// some summed on a shared window, stay in step with those of the next
// moment: here a key's request and two of its team's, reserving 1000, 500
// and 500, admitted at one moment, the team reset, and a request of
// another key of the team admitted after, all settled in one call.
func TestRestoresOfSettlementsOfDifferentSizesAtOneMomentLeaveTheNextMomentsAlone(t *testing.T) {
	s := newTestRedisStore(t, redistest.EnvURL(t))
	ctx := context.Background()
	at := pinnedBase() + 10_000
	caps := CapsOfWindows(WindowCaps{TPM: 100_000})
	team := NewLimit("", "team", redistest.UniqueID(t), caps)
	keyA, keyC := NewLimit("", "key", redistest.UniqueID(t)+"-a", caps), NewLimit("", "key", redistest.UniqueID(t)+"-c", caps)
	settlements := []struct {
		chain         []Limit
		admitted      int64
		reserved, use int64
	}{
		{[]Limit{keyA}, at, 1000, 300},
		{[]Limit{team}, at, 500, 100},
		{[]Limit{team}, at, 500, 100},
		{[]Limit{keyC, team}, at + 2, 1000, 50},
	}
	admitted := make([]Decision, len(settlements))
	for i, st := range settlements {
		if st.admitted > at {
			if _, err := pinned(s, at+1).Reset(ctx, team); err != nil {
				t.Fatal(err)
			}
		}
		a, err := pinned(s, st.admitted).Admit(ctx, st.chain, totalTokens(st.reserved))
		if err != nil || !a.Admitted {
			t.Fatalf("admission %d: %+v %v", i, a, err)
		}
		admitted[i] = a.Decision
	}
	var call scriptCall
	for i, st := range settlements {
		call.charges.add(st.chain, Charge{Tokens: totalTokens(st.use).Minus(totalTokens(st.reserved))}.Settling(admitted[i]), MomentAt(at+3))
	}
	if _, charged, err := pinned(s, at+3).call(ctx, &call, false); err != nil || charged != nil {
		t.Fatalf("settlements: %v %v", charged, err)
	}
	d, err := pinned(s, at+3).Peek(ctx, []Limit{keyA, keyC, team})
	if err != nil {
		t.Fatal(err)
	}
	got := []int64{d.Counts[0].Window[TPM].Cur, d.Counts[1].Window[TPM].Cur, d.Counts[2].Window[TPM].Cur}
	if want := []int64{300, 50, 250}; !slices.Equal(got, want) {
		t.Fatalf("tpm of the first key, the other key and the team %v, want %v: what each used (the reset took the team's reservations of the first moment, and the second's came after it)", got, want)
	}
}
