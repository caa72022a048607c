package limiter

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// storeKit is what the conformance suite needs of a store implementation.
type storeKit struct {
	// replicas returns n stores that share counters the way gateway replicas
	// do: separate Redis clients (and connections), or the one process store.
	replicas func(t *testing.T, n int) []Store
	// count reads one period of s directly, bypassing the store's logic.
	count func(t *testing.T, s Store, prefix string, k WindowKind, period int64) int64
	// state is everything s holds for the chain's limits at the pinned
	// time, as stored: window buckets and token buckets.
	state func(t *testing.T, s Store, chain []Limit, at int64) string
}

func memoryKit() storeKit {
	return storeKit{
		replicas: func(t *testing.T, n int) []Store {
			s := newTestMemoryStore(t, time.Hour)
			out := make([]Store, n)
			for i := range out {
				out[i] = s
			}
			return out
		},
		count: memoryCount,
		state: func(_ *testing.T, s Store, chain []Limit, _ int64) string {
			var out strings.Builder
			for _, l := range chain {
				c := s.(*MemoryStore).counter(l.Prefix)
				c.mu.Lock()
				fmt.Fprintf(&out, "%s %v %v\n", l.Prefix, c.minute, c.bkt)
				if c.others != nil {
					fmt.Fprintf(&out, "%v\n", c.others.windows)
				}
				c.mu.Unlock()
			}
			return out.String()
		},
	}
}

func memoryCount(_ *testing.T, s Store, prefix string, k WindowKind, period int64) int64 {
	c := s.(*MemoryStore).counter(prefix)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.periods(k)[period&1].count(period)
}

func redisKit(url string) storeKit {
	return storeKit{
		replicas: func(t *testing.T, n int) []Store {
			out := make([]Store, n)
			for i := range out {
				out[i] = newTestRedisStore(t, url)
			}
			return out
		},
		count: func(t *testing.T, _ Store, prefix string, k WindowKind, period int64) int64 {
			return redisCount(t, url, prefix, k, period)
		},
		state: func(t *testing.T, _ Store, chain []Limit, at int64) string {
			var c scriptCall
			c.add(chain, TokenCounts{})
			keys := c.keys(MomentAt(at).Minute)
			vals, err := redistest.TestClient(t, url).MGet(context.Background(), keys...).Result()
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprint(keys, vals)
		},
	}
}

func redisCount(t *testing.T, url, prefix string, k WindowKind, period int64) int64 {
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	defer c.Close()
	n, err := c.Get(context.Background(), PeriodKey(prefix, k, period)).Int64()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// newLimit is a per-minute limit without a hash tag.
func newLimit(scope, id string, perMinute, tokensPerMinute int64) Limit {
	return NewLimit("", scope, id, CapsOfWindows(WindowCaps{RPM: perMinute, TPM: tokensPerMinute}))
}

// newBucketLimit is a token-bucket limit without a hash tag; rate is in
// tokens per second, as configured.
func newBucketLimit(t testing.TB, scope, id, rate string, burst, cost int64) Limit {
	t.Helper()
	return NewLimit("", scope, id, Caps{Bucket: newTokenBucket(t, rate, burst, cost)})
}

// testClock is the clock of the stores that tests make, which a test pins
// in unix milliseconds for what happens at a given moment; unpinned (0) it
// is this machine's, as in production. Pinned, it is both of a Redis
// store's clocks at once, the gateway's and Redis's, so that the refusal
// cache's bound of Redis's clock is exact and the cache runs as in
// production.
type testClock struct{ pinned atomic.Int64 }

func (c *testClock) pin(unixMillis int64) { c.pinned.Store(unixMillis) }

func (c *testClock) unixMillis() int64 { return c.gateway().UnixMilli() }

func (c *testClock) gateway() time.Time {
	if at := c.pinned.Load(); at != 0 {
		return time.UnixMilli(at)
	}
	return time.Now()
}

// script pins Redis's clock to the gateway's reading; unpinned, Redis reads
// TIME.
func (c *testClock) script(gateway time.Time) string {
	if c.pinned.Load() == 0 {
		return ""
	}
	return HexArg(gateway.UnixMilli())
}

// testClocks holds the clock of every store the tests make, for pinned.
var testClocks sync.Map // store → *testClock

// registerTestClock makes c the clock of s for pinned, until the test ends.
func registerTestClock(t testing.TB, s Store, c *testClock) {
	testClocks.Store(s, c)
	t.Cleanup(func() { testClocks.Delete(s) })
}

// newTestMemoryStore is an in-process store on a test clock, destroyed in
// t.Cleanup.
func newTestMemoryStore(t testing.TB, sweepEvery time.Duration) *MemoryStore {
	c := new(testClock)
	s := NewMemoryStore(sweepEvery, c.unixMillis)
	registerTestClock(t, s, c)
	t.Cleanup(func() { s.Destruct() })
	return s
}

// pinned pins the clock of s, a store made by newTestMemoryStore or
// newTestRedisStore, at unix milliseconds at (0: this machine's) for the
// calls that follow, and returns it.
func pinned[S Store](s S, at int64) S {
	c, ok := testClocks.Load(Store(s))
	if !ok {
		panic("pinned: a store on another clock than a test's")
	}
	c.(*testClock).pin(at)
	return s
}

// pinnedBase is a period boundary near now, for pinned clocks whose keys
// Redis expires like real ones.
func pinnedBase() int64 { return (time.Now().UnixMilli()/MinuteMillis + 1) * MinuteMillis }

func TestStoreConformanceMemory(t *testing.T) {
	runConformance(t, memoryKit())
}

func TestStoreConformanceRedis(t *testing.T) {
	runConformance(t, redisKit(redistest.EnvURL(t)))
}

func runConformance(t *testing.T, kit storeKit) {
	counter := func(t *testing.T, s Store) func(prefix string, k WindowKind, period int64) int64 {
		return func(prefix string, k WindowKind, period int64) int64 { return kit.count(t, s, prefix, k, period) }
	}
	t.Run("ConcurrentRequestsAgainstRPM1AdmitExactlyOne", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		chain := []Limit{newLimit("key", redistest.UniqueID(t), 1, 0)}
		if got := raceAdmissions(t, []Store{s}, chain, 64, 0); got != 1 {
			t.Fatalf("admitted %d of 64 concurrent requests against rpm 1, want exactly 1", got)
		}
	})
	t.Run("ThreeReplicasRacing96AgainstRPM5AdmitAndCountExactlyFive", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		at := pinnedBase() + 1000
		chain := []Limit{newLimit("org", redistest.UniqueID(t), 5, 0)}
		if got := raceAdmissions(t, stores, chain, 96, at); got != 5 {
			t.Fatalf("admitted %d, want exactly 5", got)
		}
		if n := counter(t, stores[0])(chain[0].Prefix, RPM, at/MinuteMillis); n != 5 {
			t.Fatalf("counted %d requests in the store, want exactly 5", n)
		}
	})
	t.Run("KeyCapWinsAndOrgIsChargedOnlyWhatTheKeyAdmitted", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		at := pinnedBase() + 1000
		org := newLimit("org", redistest.UniqueID(t), 100, 0)
		key := newLimit("key", KeyID(false, "sk-"+redistest.UniqueID(t)), 3, 0)
		if got := raceAdmissions(t, stores, []Limit{key, org}, 48, at); got != 3 {
			t.Fatalf("admitted %d under key rpm 3 and org rpm 100, want 3", got)
		}
		count := counter(t, stores[0])
		if n := count(org.Prefix, RPM, at/MinuteMillis); n != 3 {
			t.Fatalf("org charged %d requests, want only the key's 3 admissions", n)
		}
		// A second key of the same org still gets in: the org was not overcharged.
		other := newLimit("key", KeyID(false, "sk-"+redistest.UniqueID(t)), 3, 0)
		if d := admitOrFail(t, stores[1], []Limit{other, org}, at); !d.Admitted {
			t.Fatal("a second key of the org was refused")
		}
	})
	t.Run("PreviousPeriodCountsInFullOnTheBoundaryAndHalfAtMidMinute", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		base := pinnedBase()
		chain := []Limit{newLimit("key", redistest.UniqueID(t), 10, 0)}
		for i := 0; i < 10; i++ { // fill the previous period
			if !admitOrFail(t, s, chain, base-MinuteMillis+int64(i)).Admitted {
				t.Fatalf("request %d of 10 refused in an empty window", i+1)
			}
		}
		if d := admitOrFail(t, s, chain, base); d.Admitted {
			t.Fatal("admitted on the boundary, where the previous period counts in full (10 of 10)")
		} else if got := d.Counts[0].Window[RPM]; got != (Window{Cur: 0, Prev: 10}) {
			t.Fatalf("read %+v, want prev 10", got)
		}
		// At mid-minute the previous 10 count as 5: five more fit, not six.
		for i := 0; i < 5; i++ {
			if !admitOrFail(t, s, chain, base+30_000+int64(i)).Admitted {
				t.Fatalf("request %d refused at mid-minute where the estimate is %d", i+1, 5+i)
			}
		}
		if admitOrFail(t, s, chain, base+30_010).Admitted {
			t.Fatal("sixth request admitted at mid-minute: estimate 5 + 5 = 10 = rpm")
		}
	})
	t.Run("ARequestOfThePreviousMinuteStillWeighsAtItsLastMillisecond", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		base := pinnedBase()
		chain := []Limit{newLimit("key", redistest.UniqueID(t), 2, 0)}
		for _, at := range []int64{base - 1, base} { // one in each minute
			if !admitOrFail(t, s, chain, at).Admitted {
				t.Fatalf("request at %d refused under rpm 2", at-base)
			}
		}
		// 1 + 1 * 1/60000 leaves less than one request of rpm 2.
		if admitOrFail(t, s, chain, base+MinuteMillis-1).Admitted {
			t.Fatal("admitted at the minute's last millisecond, where the previous request still weighs 1/60000")
		}
		if !admitOrFail(t, s, chain, base+MinuteMillis).Admitted {
			t.Fatal("refused on the next boundary, where only the one request of the minute before counts")
		}
	})
	t.Run("FullTPMWindowRefusesAndChargesNoRequestSlot", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 5000
		chain := []Limit{newLimit("key", redistest.UniqueID(t), 10, 1000)}
		if !admitOrFail(t, s, chain, at).Admitted {
			t.Fatal("first request refused")
		}
		settle(t, pinned(s, at+1), chain, Charge{Tokens: totalTokens(1000)})
		if tok := counter(t, s)(chain[0].Prefix, TPM, at/MinuteMillis); tok != 1000 {
			t.Fatalf("token window holds %d, want 1000", tok)
		}
		d := admitOrFail(t, s, chain, at+2)
		if d.Admitted {
			t.Fatal("admitted with the tpm window full")
		}
		if ref := RefusalOf(chain, d); ref.Kind != Tokens {
			t.Fatalf("refused on %v, want tokens", ref.Kind)
		}
		if n := counter(t, s)(chain[0].Prefix, RPM, at/MinuteMillis); n != 1 {
			t.Fatalf("request window holds %d after the refusal, want 1", n)
		}
	})
	t.Run("RefusedRequestIsChargedToNoLimitOfItsChain", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 5000
		org := newLimit("org", redistest.UniqueID(t), 100, 0)
		key := newLimit("key", redistest.UniqueID(t), 1, 0)
		admitOrFail(t, s, []Limit{key, org}, at)
		for i := 0; i < 5; i++ {
			if admitOrFail(t, s, []Limit{key, org}, at+1).Admitted {
				t.Fatal("admitted over the key's rpm 1")
			}
		}
		if n := counter(t, s)(org.Prefix, RPM, at/MinuteMillis); n != 1 {
			t.Fatalf("org charged %d, want 1", n)
		}
	})
	t.Run("PeekReadsWhatAdmitWouldAndChargesNothing", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 5000
		chain := []Limit{newLimit("key", redistest.UniqueID(t), 2, 0)}
		fill(t, s, chain, at, 1)
		for i := 0; i < 3; i++ {
			d, err := pinned(s, at).Peek(context.Background(), chain)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Admitted || d.Counts[0].Window[RPM].Cur != 1 {
				t.Fatalf("peek %d: %+v, want admitted with 1 counted", i, d)
			}
		}
		fill(t, s, chain, at, 1)
		if d, _ := pinned(s, at).Peek(context.Background(), chain); d.Admitted {
			t.Fatal("peek admits over the cap")
		}
		if n := counter(t, s)(chain[0].Prefix, RPM, at/MinuteMillis); n != 2 {
			t.Fatalf("counted %d, want the 2 admissions only", n)
		}
	})
	t.Run("TokensAreChargedOnlyToLimitsWithATPM", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 5000
		withTPM := newLimit("org", redistest.UniqueID(t), 0, 500)
		without := newLimit("key", redistest.UniqueID(t), 5, 0)
		settle(t, pinned(s, at), []Limit{without, withTPM}, Charge{Tokens: totalTokens(42)})
		count := counter(t, s)
		if n := count(withTPM.Prefix, TPM, at/MinuteMillis); n != 42 {
			t.Fatalf("org token window %d, want 42", n)
		}
		if n := count(without.Prefix, TPM, at/MinuteMillis); n != 0 {
			t.Fatalf("key without tpm charged %d tokens", n)
		}
	})
	t.Run("ChargesMadeLaterEachReportOnceAndAddUpExactly", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		org := newLimit("org", redistest.UniqueID(t), 0, 1<<40)
		var wg sync.WaitGroup
		var failed atomic.Int64
		for i := range 50 {
			wg.Add(1) // a second report of one charge would take the count below 0
			key := newLimit("key", fmt.Sprintf("%s-%d", org.ID, i), 5, 0)
			go s.Charge([]Limit{key, org}, Charge{Tokens: totalTokens(int64(i + 1))}, func(err error) {
				if err != nil {
					failed.Add(1)
				}
				wg.Done()
			})
		}
		wg.Wait()
		if failed.Load() != 0 {
			t.Fatalf("%d charges failed", failed.Load())
		}
		// On the store's clock: a minute may have turned meanwhile.
		now := time.Now().UnixMilli() / MinuteMillis
		count := counter(t, s)
		if n := count(org.Prefix, TPM, now) + count(org.Prefix, TPM, now-1); n != 50*51/2 {
			t.Fatalf("org holds %d tokens, want %d", n, 50*51/2)
		}
	})
	t.Run("RetryAfterIsTheExactReleaseWhenThePreviousPeriodRefuses", func(t *testing.T) {
		// rpm 10, previous period 12, current 3: at 10 s into the period the
		// estimate is 3 + 12×50/60 = 13. One more fits once 3 + 12×(60−t)/60 ≤ 9,
		// at t = 30 s.
		s := kit.replicas(t, 1)[0]
		base := pinnedBase()
		chain := []Limit{newLimit("key", redistest.UniqueID(t), 10, 0)}
		larger := []Limit{newLimit("key", chain[0].ID, 100, 0)} // the same counters under a larger cap
		fill(t, s, larger, base-MinuteMillis, 12)
		fill(t, s, larger, base, 3)
		assertReleaseAt(t, s, chain, base+10_000, base+30_000)
	})
	t.Run("RetryAfterIsTheExactReleaseWhenTheCurrentPeriodRefuses", func(t *testing.T) {
		// rpm 4, current period 6 (filled under a larger cap): one more fits in
		// the next period once 6×(60−t)/60 ≤ 3, at t = 30 s, i.e. 90 s after base.
		s := kit.replicas(t, 1)[0]
		base := pinnedBase()
		chain := []Limit{newLimit("key", redistest.UniqueID(t), 4, 0)}
		fill(t, s, []Limit{newLimit("key", chain[0].ID, 100, 0)}, base, 6)
		assertReleaseAt(t, s, chain, base+20_000, base+90_000)
	})
	t.Run("RetryAfterForTokensHonoursTheStrictInequality", func(t *testing.T) {
		// tpm 1000, previous 1200 tokens, current 400: fits once
		// 400 + 1200×(60−t)/60 < 1000, i.e. t > 30 s: released at 30.001 s.
		s := kit.replicas(t, 1)[0]
		base := pinnedBase()
		chain := []Limit{newLimit("key", redistest.UniqueID(t), 0, 1000)}
		settle(t, pinned(s, base-MinuteMillis), chain, Charge{Tokens: totalTokens(1200)})
		settle(t, pinned(s, base), chain, Charge{Tokens: totalTokens(400)})
		assertReleaseAt(t, s, chain, base+1000, base+30_001)
	})
	t.Run("RetryAfterWaitsForTheLastRefusingLimitOfTheChain", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		base := pinnedBase()
		key := newLimit("key", redistest.UniqueID(t), 4, 0)  // releases at base+90s (see above)
		org := newLimit("org", redistest.UniqueID(t), 10, 0) // releases later
		fill(t, s, []Limit{newLimit("key", key.ID, 100, 0), newLimit("org", org.ID, 100, 0)}, base, 6)
		fill(t, s, []Limit{newLimit("org", org.ID, 100, 0)}, base, 12)
		// org: current 18 > 9, next period: 18×(60−t)/60 ≤ 9 at t = 30 s → base+90 s as well;
		// add more to push it: 30 in total → 30×(60−t)/60 ≤ 9 at t = 42 s.
		fill(t, s, []Limit{newLimit("org", org.ID, 100, 0)}, base, 12)
		chain := []Limit{key, org}
		d := admitOrFail(t, s, chain, base+20_000)
		ref := RefusalOf(chain, d)
		if ref.First != 0 {
			t.Fatalf("first refusing limit %d, want the key (0)", ref.First)
		}
		assertReleaseAt(t, s, chain, base+20_000, base+60_000+42_000)
	})
	t.Run("FullBurstIsAdmittedAtOnceThenExactlyTheReplenishRate", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1500
		chain := []Limit{newBucketLimit(t, "key", redistest.UniqueID(t), "2", 5, 0)}
		fill(t, s, chain, at, 5)
		// A token is back every 500 ms, and only then: 20 more in 10 s.
		for k := int64(1); k <= 20; k++ {
			assertReleaseAt(t, s, chain, at+(k-1)*500, at+k*500)
		}
		if d := admitOrFail(t, s, chain, at+10_000); d.Admitted {
			t.Fatal("admitted a 26th request in 10 s at 2 per second after a burst of 5")
		}
	})
	t.Run("FractionalRateAndCostReleaseAtTheExactMillisecond", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1500
		// 0.5 per second: one token every 2 s.
		half := []Limit{newBucketLimit(t, "key", redistest.UniqueID(t), "0.5", 2, 0)}
		fill(t, s, half, at, 2)
		assertReleaseAt(t, s, half, at, at+2000)
		// 1.5 per second and a cost of 2: 2 tokens take 1333.3 ms, so the
		// request fits at 1334 ms and not a millisecond before.
		costly := []Limit{newBucketLimit(t, "key", redistest.UniqueID(t), "1.5", 4, 2)}
		fill(t, s, costly, at, 2)
		assertReleaseAt(t, s, costly, at, at+1334)
		// After a long idle spell the bucket is full again, and no fuller.
		fill(t, s, costly, at+3_600_000, 2)
		if d := admitOrFail(t, s, costly, at+3_600_000); d.Admitted {
			t.Fatal("a bucket of 4 admitted a third request of cost 2 after an idle hour")
		}
	})
	t.Run("RefusedRequestLeavesEveryBucketAndCounterOfItsChainAsItWas", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 5000
		chain := []Limit{
			newBucketLimit(t, "key", redistest.UniqueID(t), "1", 2, 0),
			NewLimit("", "team", redistest.UniqueID(t), CapsOfWindows(WindowCaps{RPM: 10, TPM: 1000})),
			newBucketLimit(t, "org", redistest.UniqueID(t), "100", 100, 3),
		}
		fill(t, s, chain, at, 2)
		settle(t, pinned(s, at), chain, Charge{Tokens: totalTokens(40)})
		before := kit.state(t, s, chain, at)
		for _, later := range []int64{at, at + 1, at + 999} {
			if admitOrFail(t, s, chain, later).Admitted {
				t.Fatalf("admitted at +%d ms with the key's bucket empty", later-at)
			}
		}
		if after := kit.state(t, s, chain, at); after != before {
			t.Fatalf("refusals changed the store:\nbefore %s\nafter  %s", before, after)
		}
	})
	t.Run("ThreeReplicasRacingOneBucketAdmitExactlyItsCapacity", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		at := pinnedBase() + 1000
		chain := []Limit{newBucketLimit(t, "key", redistest.UniqueID(t), "0.001", 7, 0)}
		if got := raceAdmissions(t, stores, chain, 96, at); got != 7 {
			t.Fatalf("admitted %d of 96 against a bucket of 7, want exactly 7", got)
		}
	})
	t.Run("KeyBucketAndOrgRPMFirstRefusalWinsAndNothingIsCharged", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		org := newLimit("org", redistest.UniqueID(t), 5, 0)
		first := newBucketLimit(t, "key", KeyID(false, "sk-"+redistest.UniqueID(t)), "1", 3, 0)
		fill(t, s, []Limit{first, org}, at, 3)
		d := admitOrFail(t, s, []Limit{first, org}, at)
		if ref := RefusalOf([]Limit{first, org}, d); d.Admitted || ref.First != 0 || ref.Kind != Burst || ref.WaitMillis != 1000 {
			t.Fatalf("admitted %v, refusal %+v: want the key's bucket, released in 1000 ms", d.Admitted, ref)
		}
		if n := kit.count(t, s, org.Prefix, RPM, at/MinuteMillis); n != 3 {
			t.Fatalf("org charged %d requests, want the 3 admitted", n)
		}
		second := newBucketLimit(t, "key", KeyID(false, "sk-"+redistest.UniqueID(t)), "1", 3, 0)
		fill(t, s, []Limit{second, org}, at, 2) // the org's rpm 5 is now full
		d = admitOrFail(t, s, []Limit{second, org}, at)
		if ref := RefusalOf([]Limit{second, org}, d); d.Admitted || ref.First != 1 || ref.Kind != Requests {
			t.Fatalf("admitted %v, refusal %+v: want the org's rpm", d.Admitted, ref)
		}
		if p, _ := pinned(s, at).Peek(context.Background(), []Limit{second}); p.Counts[0].Deficit != 2*MicroTokens {
			t.Fatalf("the second key's bucket is %d micro-tokens down, want the 2 admitted", p.Counts[0].Deficit)
		}
		// Both refusing: the wait is the later release, the org's window.
		d = admitOrFail(t, s, []Limit{first, org}, at)
		ref := RefusalOf([]Limit{first, org}, d)
		if ref.First != 0 || ref.Kind != Burst || ref.WaitMillis != releaseIn(d.Counts[1].Window[RPM], org.Windows[RPM], 1, d.Now.In(Minute)) {
			t.Fatalf("refusal %+v: want the key first and the org's release", ref)
		}
	})
	t.Run("ConcurrentReservationsOf1000AgainstTPM10500AdmitExactlyTen", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		at := pinnedBase() + 1000
		chain := []Limit{newLimit("key", redistest.UniqueID(t), 0, 1_000_000), newLimit("org", redistest.UniqueID(t), 0, 10_500)}
		if got := raceReservations(t, stores, chain, 40, 1000, at); got != 10 {
			t.Fatalf("admitted %d of 40 reservations of 1000 against tpm 10500, want exactly 10", got)
		}
		for _, l := range chain {
			if n := kit.count(t, stores[0], l.Prefix, TPM, at/MinuteMillis); n != 10_000 {
				t.Fatalf("%s holds %d reserved tokens, want the 10 admissions' 10000", l.Scope, n)
			}
		}
	})
	t.Run("ARefusedReservationChargesNothingAndWaitsForItsOwnSize", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 15_000
		chain := []Limit{newLimit("org", redistest.UniqueID(t), 10, 10_500)}
		fillReserving(t, s, chain, at, 9_000)
		a, err := pinned(s, at).Admit(context.Background(), chain, totalTokens(2_000))
		if err != nil {
			t.Fatal(err)
		}
		if a.Admitted || a.Refusal.Kind != Tokens {
			t.Fatalf("admitted %v, refusal %+v: want 2000 over the 1500 left refused on tokens", a.Admitted, a.Refusal)
		}
		if want := releaseIn(a.Counts[0].Window[TPM], 10_500, 2_000, a.Now.In(Minute)); a.Refusal.WaitMillis != want {
			t.Fatalf("wait %d ms, want %d, when 2000 tokens fit", a.Refusal.WaitMillis, want)
		}
		if n := kit.count(t, s, chain[0].Prefix, TPM, at/MinuteMillis); n != 9_000 {
			t.Fatalf("the refusal changed the token window to %d", n)
		}
		if n := kit.count(t, s, chain[0].Prefix, RPM, at/MinuteMillis); n != 9 {
			t.Fatalf("the refusal changed the req window to %d", n)
		}
		release := at + a.Refusal.WaitMillis
		if admitReserving(t, s, chain, release-1, 2_000).Admitted {
			t.Fatal("2000 tokens admitted 1 ms before the announced release")
		}
		if !admitReserving(t, s, chain, release, 2_000).Admitted {
			t.Fatal("2000 tokens refused at the announced release")
		}
	})
	t.Run("SettlementReplacesTheReservationInTheBucketItWasMadeIn", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		base := pinnedBase()
		chain := []Limit{newLimit("key", redistest.UniqueID(t), 0, 100_000)}
		d := admitReserving(t, s, chain, base+58_000, 1_000)                                                                 // at 0:58
		settle(t, pinned(s, base+MinuteMillis+1_000), chain, Charge{Tokens: totalTokens(700 - 1_000), Minute: d.Now.Minute}) // at 1:01
		if first, second := kit.count(t, s, chain[0].Prefix, TPM, base/MinuteMillis), kit.count(t, s, chain[0].Prefix, TPM, base/MinuteMillis+1); first != 700 || second != 0 {
			t.Fatalf("token windows %d and %d, want the usage 700 in the reservation's minute", first, second)
		}
		settle(t, pinned(s, base+MinuteMillis+2_000), chain, Charge{Tokens: totalTokens(-5_000), Minute: d.Now.Minute})
		if n := kit.count(t, s, chain[0].Prefix, TPM, base/MinuteMillis); n != 0 {
			t.Fatalf("a settlement took the window to %d, want never below 0", n)
		}
		d = admitReserving(t, s, chain, base+2*MinuteMillis+5_000, 1_000)
		settle(t, pinned(s, base+4*MinuteMillis), chain, Charge{Tokens: totalTokens(2_000), Minute: d.Now.Minute})
		if n := kit.count(t, s, chain[0].Prefix, TPM, d.Now.Minute); n != 1_000 {
			t.Fatalf("a settlement out of the window changed its bucket to %d, want it left at 1000", n)
		}
	})
	t.Run("UsageBelowTheReservationGivesTheRestBack", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1_000
		chain := []Limit{newLimit("org", redistest.UniqueID(t), 0, 10_500)}
		for range 10 {
			d := admitReserving(t, s, chain, at, 1_000)
			settle(t, s, chain, Charge{Tokens: totalTokens(600 - 1_000), Minute: d.Now.Minute})
		}
		admitted := 0
		for range 6 {
			if admitReserving(t, s, chain, at, 1_000).Admitted {
				admitted++
			}
		}
		if admitted != 4 {
			t.Fatalf("with 6000 of 10500 used, %d more reservations of 1000 fit, want exactly 4", admitted)
		}
	})
	// Spring's script returns a refused bucket's refilled level unchanged,
	// and X-RateLimit-Remaining says it: the issue's own example.
	t.Run("ABucketRefusalReportsTheWholeTokensItHolds", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []Limit{newBucketLimit(t, "key", redistest.UniqueID(t), "1", 3, 3)}
		fill(t, s, chain, at, 1) // the bucket runs dry
		d := admitOrFail(t, s, chain, at+1200)
		if d.Admitted {
			t.Fatal("admitted 1.2 s after the bucket ran dry, with 1.2 of the 3 tokens a request costs")
		}
		if left := chain[0].Bucket.Left(d.Counts[0].Deficit); left != 1 {
			t.Fatalf("the refused bucket holds %d whole tokens, want 1 of its 1.2", left)
		}
	})
	runWindowConformance(t, kit)
	runSlotConformance(t, kit)
	runBudgetConformance(t, kit)
	runLearnedConformance(t, kit)
	runFloorsConformance(t, kit)
	runNotifyConformance(t, kit)
	runTopConformance(t, kit)
}

// fill admits n requests of chain at the pinned time, all of which must fit.
func fill(t *testing.T, s Store, chain []Limit, at int64, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if !admitOrFail(t, s, chain, at).Admitted {
			t.Fatalf("fill: request %d of %d refused", i+1, n)
		}
	}
}

// assertReleaseAt checks that a request at time at is refused with a wait that
// ends exactly at release: still refused one millisecond before, admitted then.
func assertReleaseAt(t *testing.T, s Store, chain []Limit, at, release int64) {
	t.Helper()
	d := admitOrFail(t, s, chain, at)
	if d.Admitted {
		t.Fatal("admitted, want a refusal")
	}
	ref := RefusalOf(chain, d)
	if got := at + ref.WaitMillis; got != release {
		t.Fatalf("wait %d ms ends at base+%d, want base+%d", ref.WaitMillis, got%MinuteMillis, release%MinuteMillis)
	}
	if want := (release - at + 999) / 1000; ref.RetryAfterSeconds() != want {
		t.Fatalf("Retry-After %d s, want %d", ref.RetryAfterSeconds(), want)
	}
	if admitOrFail(t, s, chain, release-1).Admitted {
		t.Fatal("admitted 1 ms before the announced release")
	}
	if !admitOrFail(t, s, chain, release).Admitted {
		t.Fatal("refused at the announced release")
	}
}

func admitOrFail(t *testing.T, s Store, chain []Limit, at int64) Decision {
	t.Helper()
	a, err := pinned(s, at).Admit(context.Background(), chain, TokenCounts{})
	if err != nil {
		t.Fatal(err)
	}
	return a.Decision
}

// admitReserving admits chain on s at the pinned time with a reservation.
func admitReserving(t *testing.T, s Store, chain []Limit, at, reserve int64) Decision {
	t.Helper()
	a, err := pinned(s, at).Admit(context.Background(), chain, totalTokens(reserve))
	if err != nil {
		t.Fatal(err)
	}
	return a.Decision
}

// fillReserving admits requests reserving 1000 tokens each until tokens are
// reserved, all of which must fit.
func fillReserving(t *testing.T, s Store, chain []Limit, at, tokens int64) {
	t.Helper()
	for ; tokens > 0; tokens -= 1_000 {
		if !admitReserving(t, s, chain, at, 1_000).Admitted {
			t.Fatal("a filling reservation was refused")
		}
	}
}

// settle charges c to chain on s and waits for the store to have it.
func settle(t *testing.T, s Store, chain []Limit, c Charge) {
	t.Helper()
	done := make(chan error, 1)
	s.Charge(chain, c, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Error(err) // not Fatal: some callers charge from goroutines of their own
	}
}

// raceAdmissions sends n admissions at once, spread over the stores, and
// returns how many were admitted.
func raceAdmissions(t *testing.T, stores []Store, chain []Limit, n int, at int64) int {
	t.Helper()
	return raceReservations(t, stores, chain, n, 0, at)
}

// raceReservations is raceAdmissions with a reservation for each admission.
func raceReservations(t *testing.T, stores []Store, chain []Limit, n int, reserve, at int64) int {
	t.Helper()
	var admitted atomic.Int64
	var start, wg sync.WaitGroup
	start.Add(1)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(s Store) {
			defer wg.Done()
			start.Wait()
			d, err := pinned(s, at).Admit(context.Background(), chain, totalTokens(reserve))
			if err != nil {
				errs <- err
				return
			}
			if d.Admitted {
				admitted.Add(1)
			}
		}(stores[i%len(stores)])
	}
	start.Done()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return int(admitted.Load())
}

func TestBucketKeyLayoutIsTheSpecs(t *testing.T) {
	l := newLimit("org", "acme", 1, 0)
	if got, want := PeriodKey(l.Prefix, RPM, 29_000_000), "rolter:rl:org:acme:req:29000000"; got != want {
		t.Fatalf("%s, want %s", got, want)
	}
}

// totalTokens is a reservation or charge of n tokens on chains that cap only
// tpm or tpd.
func totalTokens(n int64) TokenCounts { return TokenCounts{Total: n} }

// newTokenBucket is the bucket of a limit's rate (tokens per second, as
// configured), burst and cost; a cost of 0 is 1, as in the config.
func newTokenBucket(t testing.TB, rate string, burst, cost int64) TokenBucket {
	t.Helper()
	milli, err := ParseRate(rate)
	if err != nil {
		t.Fatal(err)
	}
	return TokenBucket{Rate: milli, Burst: burst, Cost: max(cost, 1), RateText: rate}
}
