package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Tests of each store's reset and the refusal cache's forgetting.

// Each store's reset clears every window its limit caps and its bucket,
// keeps its slots and budgets, and answers what it cleared; a refusal the
// Redis store cached before the reset is forgotten.
func TestStoreResetClearsTheWindowsAndTheBucketAndKeepsSlotsAndBudgets(t *testing.T) {
	t.Run("memory", func(t *testing.T) { checkStoreReset(t, memoryKit()) })
	t.Run("redis", func(t *testing.T) { checkStoreReset(t, redisKit(redisURLFromEnv(t))) })
}

func checkStoreReset(t *testing.T, kit storeKit) {
	s := kit.replicas(t, 1)[0]
	ctx := context.Background()
	at := pinnedBase() + 10_000
	chain := []limit{
		newTaggedLimit("", "key", uniqueID(t), windowLimitCaps(windowCaps{rpm: 2, tpm: 100, rpd: 5})),
		newBucketLimit(t, "user", uniqueID(t), "0.001", 2, 1),
		newSlotLimit("team", uniqueID(t), 10, 0, time.Minute),
		newBudgetLimit(t, "org", uniqueID(t), 1_000_000, 0, 0, "UTC"),
	}
	reserve := tokenCounts{cost: 1000}
	for range 2 {
		if a, err := pinned(s, at).admit(ctx, chain, reserve); err != nil || !a.admitted {
			t.Fatalf("admission: %+v %v", a, err)
		}
	}
	settle(t, pinned(s, at), chain, charge{tokens: tokenCounts{total: 50, cost: 600}, unreserve: 1000})
	if a, err := pinned(s, at).admit(ctx, chain, reserve); err != nil || a.admitted {
		t.Fatalf("the third admission: %+v %v, want refused by the rpm and the bucket", a, err)
	}
	before, err := pinned(s, at).peek(ctx, chain)
	if err != nil {
		t.Fatal(err)
	}
	if c := before.counts; c[0].w[rpm].cur != 2 || c[0].w[tpm].cur != 50 || c[0].w[rpd].cur != 2 || c[1].deficit == 0 ||
		c[2].slots != 2 || c[3].spent[budgetDay] != 600 || c[3].reserved[budgetDay] != 1000 {
		t.Fatalf("before the reset: %+v", c)
	}

	var cleared []string
	for _, l := range chain {
		names, err := pinned(s, at).reset(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		cleared = append(cleared, fmt.Sprint(names))
	}
	if got := strings.Join(cleared, " "); got != "[rpm tpm rpd] [bucket] [] []" {
		t.Fatalf("cleared %s", got)
	}
	after, err := pinned(s, at).peek(ctx, chain)
	if err != nil {
		t.Fatal(err)
	}
	want := before.counts[2:]
	if c := after.counts; c[0] != (counts{}) || c[1] != (counts{}) || !slices.Equal(c[2:], want) {
		t.Fatalf("after the reset: %+v, want the windows and the bucket empty and the rest %+v", c, want)
	}
	for i := range 3 {
		a, err := pinned(s, at).admit(ctx, chain, reserve)
		if err != nil || a.admitted != (i < 2) {
			t.Fatalf("admission %d after the reset: %+v %v, want 2 admitted, then refused", i+1, a, err)
		}
	}
}

// A reset on Redis clears what Redis's clock reads even a minute away from
// the gateway's, behind (its previous period is the one before the
// gateway's previous) or ahead (its current period is the gateway's next).
func TestRedisResetClearsWhatARedisClockAMinuteFromTheGatewaysReads(t *testing.T) {
	redisURL := redisURLFromEnv(t)
	for _, skew := range []int64{-minuteMillis, minuteMillis} {
		t.Run(fmt.Sprintf("skew%+ds", skew/1000), func(t *testing.T) {
			var gatewayAt atomic.Int64
			s, err := newRedisStore(&RedisConfig{URL: redisURL}, time.Second, redisClock{
				gateway: func() time.Time { return time.UnixMilli(gatewayAt.Load()) },
				script:  func(g time.Time) string { return hexArg(g.UnixMilli() + skew) },
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Destruct() })
			ctx := context.Background()
			admit := func(chain []limit) admission {
				t.Helper()
				a, err := s.admit(ctx, chain, tokenCounts{})
				if err != nil {
					t.Fatal(err)
				}
				return a
			}
			at := pinnedBase() + 30_000 // half a minute into Redis's minute too
			id := uniqueID(t)
			capped := []limit{newLimit("key", id, 2, 0)}
			// 4 requests in Redis's previous minute weigh 2 at half a minute
			// into its current one: rpm 2 refuses.
			gatewayAt.Store(at - minuteMillis)
			for range 4 {
				if !admit([]limit{newLimit("key", id, 1000, 0)}).admitted {
					t.Fatal("a request under rpm 1000 refused")
				}
			}
			gatewayAt.Store(at)
			a := admit(capped)
			if a.admitted {
				t.Fatal("admitted, want refused by the previous minute's weight")
			}
			if got, want := a.now.minute, momentAt(at+skew).minute; got != want {
				t.Fatalf("Redis decided in minute %d, want %d: its clock is not the test's", got, want)
			}
			if _, err := s.reset(ctx, capped[0]); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if got := admit(capped).admitted; got != (i < 2) {
					t.Fatalf("admission %d after the reset: admitted %v, want 2 admitted, then refused", i+1, got)
				}
			}
		})
	}
}

func TestRefusalCacheResetForgetsOneLimitsRefusalsAndRecordsNoneSentBeforeIt(t *testing.T) {
	cache := newRefusalCache()
	sent := time.Now()
	refused := decision{now: momentAt(pinnedBase()), counts: []counts{{w: [numWindows]window{rpm: {cur: 1}}}}}
	key := newLimit("key", uniqueID(t), 1, 0)
	sameCountersOtherCaps := newTaggedLimit("", "key", key.id, windowLimitCaps(windowCaps{rpm: 1, rpd: 5}))
	other := newLimit("key", uniqueID(t), 1, 0)
	for _, l := range []limit{key, sameCountersOtherCaps, other} {
		cache.record([]limit{l}, refused, sent, cache.resetsSoFar())
		if !refusesLocally(cache, []limit{l}, sent) {
			t.Fatalf("%s is not cached", l.prefix)
		}
	}
	inFlight := cache.resetsSoFar() // an admission sent before the reset
	cache.forgetLimit(key.prefix)
	for l, want := range map[limit]bool{key: false, sameCountersOtherCaps: false, other: true} {
		if got := refusesLocally(cache, []limit{l}, sent); got != want {
			t.Errorf("%s under caps %+v refused locally: %v, want %v", l.prefix, l.limitCaps, got, want)
		}
	}
	// Redis may have decided that admission on the counters the reset
	// cleared: its refusal is not recorded. One sent after is.
	cache.record([]limit{key}, refused, sent, inFlight)
	if refusesLocally(cache, []limit{key}, sent) {
		t.Fatal("a refusal of an admission sent before the reset was recorded")
	}
	cache.record([]limit{key}, refused, sent, cache.resetsSoFar())
	if !refusesLocally(cache, []limit{key}, sent) {
		t.Fatal("a refusal of an admission sent after the reset was not recorded")
	}
}
