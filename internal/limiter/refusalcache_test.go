package limiter

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// refusalCase is a refusal by Redis at base+at, of limits that the cache
// refuses until base+releases[i]: when Redis would admit again, absent
// traffic, on requests and buckets. A tokens refusal is Redis's alone (a
// settlement may give tokens back): its release is its refusal.
type refusalCase struct {
	name     string
	chain    func(t *testing.T) []Limit
	fill     func(t *testing.T, s Store, chain []Limit, base int64)
	at       int64
	reserve  int64 // the tokens the refused request reserves
	releases []int64
}

// fillUnder admits n requests on l's counters under a cap they never reach.
func fillUnder(t *testing.T, s Store, l Limit, at int64, n int) {
	t.Helper()
	fill(t, s, []Limit{newLimit(l.Scope, l.ID, 1000, 0)}, at, n)
}

func chargeTokens(t *testing.T, s Store, l Limit, at, tokens int64) {
	t.Helper()
	settle(t, pinned(s, at), []Limit{l}, Charge{Tokens: totalTokens(tokens)})
}

var refusalCases = []refusalCase{{
	// rpm 10, previous period 12, current 3: fits once 3 + 12×(60−t)/60 ≤ 9.
	name:  "RPMReleasedByThePreviousPeriodsWeightWithinTheMinute",
	chain: func(t *testing.T) []Limit { return []Limit{newLimit("key", redistest.UniqueID(t), 10, 0)} },
	fill: func(t *testing.T, s Store, chain []Limit, base int64) {
		fillUnder(t, s, chain[0], base-MinuteMillis, 12)
		fillUnder(t, s, chain[0], base, 3)
	},
	at: 10_000, releases: []int64{30_000},
}, {
	// rpm 4, current 6: fits in the next minute once 6×(60−t)/60 ≤ 3.
	name:  "RPMReleasedOnlyInTheNextMinute",
	chain: func(t *testing.T) []Limit { return []Limit{newLimit("key", redistest.UniqueID(t), 4, 0)} },
	fill: func(t *testing.T, s Store, chain []Limit, base int64) {
		fillUnder(t, s, chain[0], base, 6)
	},
	at: 20_000, releases: []int64{90_000},
}, {
	// tpm 1000, previous 1200, current 400: Redis admits once
	// 400 + 1200×(60−t)/60 < 1000, at 30.001 s; the cache never refuses it.
	name:  "TPMRefusalIsLeftToRedis",
	chain: func(t *testing.T) []Limit { return []Limit{newLimit("key", redistest.UniqueID(t), 0, 1000)} },
	fill: func(t *testing.T, s Store, chain []Limit, base int64) {
		chargeTokens(t, s, chain[0], base-MinuteMillis, 1200)
		chargeTokens(t, s, chain[0], base, 400)
	},
	at: 1000, releases: []int64{1000},
}, {
	// 1.5 tokens per second and a cost of 2: 1333.3 ms.
	name: "BucketWithAFractionalRateAndCost",
	chain: func(t *testing.T) []Limit {
		return []Limit{newBucketLimit(t, "key", redistest.UniqueID(t), "1.5", 4, 2)}
	},
	fill: func(t *testing.T, s Store, chain []Limit, base int64) {
		fill(t, s, chain, base+1500, 2)
	},
	at: 1500, releases: []int64{1500 + 1334},
}, {
	// The key's bucket refills in 2 s; the org's 30 requests weigh 9 or
	// less from 42 s into the next minute.
	name: "TwoLimitsOfAChainWithDifferentReleases",
	chain: func(t *testing.T) []Limit {
		return []Limit{newBucketLimit(t, "key", redistest.UniqueID(t), "0.5", 2, 0), newLimit("org", redistest.UniqueID(t), 10, 0)}
	},
	fill: func(t *testing.T, s Store, chain []Limit, base int64) {
		fillUnder(t, s, chain[1], base, 30)
		fill(t, s, chain[:1], base+20_000, 2)
	},
	at: 20_000, releases: []int64{22_000, 102_000},
}, {
	// One limit refusing on both kinds: the later release is the limit's.
	name:  "OneLimitRefusingOnTwoKinds",
	chain: func(t *testing.T) []Limit { return []Limit{newLimit("key", redistest.UniqueID(t), 4, 1000)} },
	fill: func(t *testing.T, s Store, chain []Limit, base int64) {
		chargeTokens(t, s, chain[0], base-MinuteMillis, 1200)
		chargeTokens(t, s, chain[0], base, 400)
		fillUnder(t, s, chain[0], base, 6)
	},
	at: 20_000, releases: []int64{90_000},
}, {
	// rpm 10, full a millisecond before the minute ends: the next minute
	// weighs the 10 as 9 from 6 s in.
	name:  "RefusalAMillisecondBeforeAMinuteBoundary",
	chain: func(t *testing.T) []Limit { return []Limit{newLimit("key", redistest.UniqueID(t), 10, 0)} },
	fill: func(t *testing.T, s Store, chain []Limit, base int64) {
		fill(t, s, chain, base+59_000, 10)
	},
	at: 59_999, releases: []int64{66_000},
}, {
	// rpm 4, current 6, refused while reserving 5000 of a tpm with room:
	// a requests refusal, cached whatever the reservation's size.
	name:  "RPMRefusalOfAReservation",
	chain: func(t *testing.T) []Limit { return []Limit{newLimit("key", redistest.UniqueID(t), 4, 100_000)} },
	fill: func(t *testing.T, s Store, chain []Limit, base int64) {
		fillUnder(t, s, chain[0], base, 6)
	},
	at: 20_000, reserve: 5_000, releases: []int64{90_000},
}, {
	// tpm 10000 with 9000 reserved, refused a reservation of 2000.
	name:  "ReservationOverTheRoomIsLeftToRedis",
	chain: func(t *testing.T) []Limit { return []Limit{newLimit("key", redistest.UniqueID(t), 0, 10_000)} },
	fill: func(t *testing.T, s Store, chain []Limit, base int64) {
		fillReserving(t, s, chain, base+1_000, 9_000)
	},
	at: 1_000, reserve: 2_000, releases: []int64{1_000},
}}

// TestCachedRefusalNeverRefusesWhatRedisWouldAdmit drives the cache's clock
// exactly: a refusal recorded with send time sent maps sent + x ms to the
// Redis time at + x. At every such moment, up to and past the last release,
// the cache must refuse a limit exactly when Redis (peek, which charges
// nothing) refuses it on requests or a bucket, never when Redis admits it,
// and its answer must be Redis's own: the same counts, hence the same
// Retry-After and headers. Tokens refusals, whatever the size of the
// reservation refused, are left to Redis. The store's own cache, which
// recorded the refusal on its pinned clocks, answers as in production
// (refusedUnread) and must agree too.
func TestCachedRefusalNeverRefusesWhatRedisWouldAdmit(t *testing.T) {
	url := redistest.EnvURL(t)
	for _, c := range refusalCases {
		t.Run(c.name, func(t *testing.T) {
			s := newTestRedisStore(t, url)
			base := pinnedBase()
			chain := c.chain(t)
			c.fill(t, s, chain, base)
			at := base + c.at
			d := admitReserving(t, s, chain, at, c.reserve)
			if d.Admitted {
				t.Fatal("admitted, want a refusal")
			}
			cache := newRefusalCache()
			sent := time.Now()
			cache.record(chain, d, sent, cache.resetsSoFar())
			for _, x := range refusalProbes(c) {
				redisAt := at + x
				// At every moment whose elapsed time since sent rounds up
				// to x ms, and the store's cache at redisAt.
				end := sent.Add(time.Duration(x) * time.Millisecond)
				caches := []func([]Limit) (Admission, bool){
					func(chain []Limit) (Admission, bool) { return cache.refusedLocally(chain, end.Add(1-time.Millisecond)) },
					func(chain []Limit) (Admission, bool) { return cache.refusedLocally(chain, end) },
					pinned(s, redisAt).RefusedUnread,
				}
				for i, l := range chain {
					if refused := assertCacheAgreesWithRedis(t, s, caches, []Limit{l}, redisAt); refused != (redisAt < base+c.releases[i]) {
						t.Fatalf("limit %d at release%+d ms: cached refusal %v", i, redisAt-base-c.releases[i], refused)
					}
				}
				assertCacheAgreesWithRedis(t, s, caches, chain, redisAt)
			}
		})
	}
}

// refusalProbes are the offsets from the refusal to probe: every millisecond
// near each release and each minute boundary, and a few hundred in between.
func refusalProbes(c refusalCase) []int64 {
	last := slices.Max(c.releases) - c.at + 1000
	var xs []int64
	for x := int64(0); x <= last; x += max(last/400, 1) {
		xs = append(xs, x)
	}
	near := slices.Clone(c.releases)
	for b := int64(MinuteMillis); b < c.at+last; b += MinuteMillis {
		near = append(near, b)
	}
	for _, n := range near {
		for x := n - c.at - 25; x <= n-c.at+25; x++ {
			if x >= 0 {
				xs = append(xs, x)
			}
		}
	}
	slices.Sort(xs)
	return slices.Compact(xs)
}

func refusesLocally(cache *refusalCache, chain []Limit, now time.Time) bool {
	_, ok := cache.refusedLocally(chain, now)
	return ok
}

// assertCacheAgreesWithRedis checks that each of the caches refuses chain
// exactly when Redis refuses it at redisAt, and then with the decision that
// Redis reads for the refusing limits; it reports whether they refuse.
func assertCacheAgreesWithRedis(t *testing.T, s Store, caches []func([]Limit) (Admission, bool), chain []Limit, redisAt int64) bool {
	t.Helper()
	whole, err := pinned(s, redisAt).Peek(context.Background(), chain)
	if err != nil {
		t.Fatal(err)
	}
	cacheable := make([]Limit, len(chain))
	for i, l := range chain {
		cacheable[i] = cachedCaps(l)
	}
	redisRefuses := RefusalOf(cacheable, whole).First >= 0
	var part Decision
	for _, refusedLocally := range caches {
		a, ok := refusedLocally(chain)
		if ok && whole.Admitted {
			t.Fatalf("at %d ms into the minute: the cache refuses what Redis admits", redisAt%MinuteMillis)
		}
		if ok != redisRefuses {
			t.Fatalf("at %d ms into the minute: the cache refuses %v, Redis refuses on requests or a bucket %v", redisAt%MinuteMillis, ok, redisRefuses)
		}
		if !ok {
			continue
		}
		sub, d, ref := a.Limits, a.Decision, a.Refusal
		if part.Counts == nil {
			if part, err = pinned(s, redisAt).Peek(context.Background(), sub); err != nil {
				t.Fatal(err)
			}
		}
		if d.Now != part.Now || !reflect.DeepEqual(d.Counts, part.Counts) {
			t.Fatalf("the cache answers %+v, Redis reads %+v", d, part)
		}
		var refusing []Limit // what Redis refuses on, which the headers describe
		for i, l := range chain {
			if RefusalOf(cacheable[i:i+1], Decision{Now: whole.Now, Counts: whole.Counts[i : i+1]}).First >= 0 {
				refusing = append(refusing, l)
			}
		}
		if !slices.Equal(sub, refusing) {
			t.Fatalf("the cache refuses on %v, Redis on %v", sub, refusing)
		}
		want := RefusalOf(cacheable, whole)
		if sub[ref.First].Prefix != chain[want.First].Prefix || ref.Kind != want.Kind || ref.WaitMillis != want.WaitMillis {
			t.Fatalf("the cache's refusal %+v of %s, Redis's %+v of %s", ref, sub[ref.First].Prefix, want, chain[want.First].Prefix)
		}
	}
	return redisRefuses
}

func TestCachedOrgRefusalAnswersEveryKeyOfTheOrgAndNothingElse(t *testing.T) {
	s := newTestRedisStore(t, redistest.EnvURL(t))
	at := pinnedBase() + 5000
	org := newLimit("org", redistest.UniqueID(t), 2, 0)
	key := func() Limit { return newLimit("key", KeyID(false, "sk-"+redistest.UniqueID(t)), 100, 0) }

	first := []Limit{key(), org}
	fill(t, s, first, at, 2)
	if size := cachedRefusals(s.refusals); size != 0 {
		t.Fatalf("%d refusals cached after two admissions", size)
	}
	second := []Limit{key(), org}
	if admitOrFail(t, s, second, at).Admitted {
		t.Fatal("admitted over the org's rpm 2")
	}
	if size := cachedRefusals(s.refusals); size != 1 {
		t.Fatalf("%d refusals cached, want the org's alone: its key fits", size)
	}

	third := []Limit{key(), org}
	a, _ := pinned(s, at).RefusedUnread(third)
	sub, ref := a.Limits, a.Refusal
	if ref.First != 0 || len(sub) != 1 || sub[0] != org || ref.Kind != Requests {
		t.Fatalf("another key of the org: refusal %+v by %v, want the org's rpm", ref, sub)
	}
	for name, chain := range map[string][]Limit{
		"the key alone":                 third[:1],
		"the key in another org":        {third[0], newLimit("org", redistest.UniqueID(t), 2, 0)},
		"the org under another rpm cap": {third[0], newLimit("org", org.ID, 3, 0)},
		"the org with a tpm cap added":  {NewLimit("", "org", org.ID, CapsOfWindows(WindowCaps{RPM: 2, TPM: 100}))},
	} {
		if _, refused := pinned(s, at).RefusedUnread(chain); refused {
			t.Errorf("%s is refused from the cache", name)
		}
	}
}

func TestRefusalCacheStaysWithinItsBound(t *testing.T) {
	cache := newRefusalCache()
	const capacity = refusalShards * refusalsPerShard
	sent := time.Now()
	refused := Decision{Now: MomentAt(pinnedBase()), Counts: []Counts{{Window: [NumWindows]Window{RPM: {Cur: 1}}}}}
	for i := 0; i < 2*capacity; i++ {
		cache.record([]Limit{newLimit("key", fmt.Sprint(i), 1, 0)}, refused, sent, cache.resetsSoFar())
	}
	for i := range cache.shards {
		if n := len(cache.shards[i].byLimit); n > refusalsPerShard {
			t.Fatalf("shard %d holds %d refusals, above its %d", i, n, refusalsPerShard)
		}
	}
	if size := cachedRefusals(cache); size < capacity*7/8 {
		t.Fatalf("%d refusals held of %d inserted, want at least the 7/8 of %d that a full shard keeps", size, 2*capacity, capacity)
	}
	// Expired refusals go first: a full cache of them takes new ones
	// without dropping any that still holds.
	later := sent.Add(2 * time.Minute)
	for i := 0; i < capacity/2; i++ {
		cache.record([]Limit{newLimit("org", fmt.Sprint(i), 1, 0)}, refused, later, cache.resetsSoFar())
	}
	for i := 0; i < capacity/2; i++ {
		if !refusesLocally(cache, []Limit{newLimit("org", fmt.Sprint(i), 1, 0)}, later) {
			t.Fatalf("refusal %d was dropped while expired ones were held", i)
		}
	}
}

func cachedRefusals(c *refusalCache) int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.RLock()
		n += len(c.shards[i].byLimit)
		c.shards[i].mu.RUnlock()
	}
	return n
}

// The cache leaves concurrency caps to Redis, as it does token windows: a
// request in flight may end, or one more start, at any moment. A refusal it
// answers of a limit whose slots were full when Redis refused it waits for
// its requests window, as Redis then refuses it, whatever became of the
// slots: not for a request in flight to end, with no wait announced.
func TestACachedRefusalAnnouncesItsWindowsWaitWhateverItsSlotsWere(t *testing.T) {
	s := newTestRedisStore(t, redistest.EnvURL(t))
	at := pinnedBase() + 1000
	chain := []Limit{newSlotLimit("key", redistest.UniqueID(t), 1, 1, 3*time.Second)}
	fill(t, s, chain, at, 1) // rpm 1 and the only slot taken
	if d := admitOrFail(t, s, chain, at); d.Admitted || !RefusalOf(chain, d).UntilFreed {
		t.Fatalf("Redis answers %+v, want a refusal by rpm and the slot", d)
	}
	freeAndWait(t, pinned(s, at), chain)
	a, cached := pinned(s, at).RefusedUnread(chain)
	if !cached {
		t.Fatal("the cache does not answer the refusal by rpm 1")
	}
	redis, err := pinned(s, at).Peek(context.Background(), chain)
	if err != nil {
		t.Fatal(err)
	}
	if want := RefusalOf(chain, redis); a.Refusal != want {
		t.Fatalf("the cache refuses %+v, Redis %+v", a.Refusal, want)
	}
	if a.Refusal.UntilFreed || a.Refusal.WaitMillis != 2*MinuteMillis-1000 {
		t.Fatalf("the cache refuses %+v, want rpm's wait to the end of the next minute, and no wait for a slot", a.Refusal)
	}
}
