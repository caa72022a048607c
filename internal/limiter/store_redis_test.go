package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rolter/caddy-ratelimit/internal/pricing"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

func newTestRedisStore(t testing.TB, url string) *RedisStore {
	t.Helper()
	return newTestRedisStoreOf(t, &RedisDeployment{URL: url}, time.Second)
}

// newTestRedisStoreOf is a store of config with the given timeout, destroyed
// in t.Cleanup.
func newTestRedisStoreOf(t testing.TB, config *RedisDeployment, timeout time.Duration) *RedisStore {
	t.Helper()
	c := new(testClock)
	s, err := NewRedisStore(config, timeout, RedisClock{Gateway: c.gateway, Script: c.script})
	if err != nil {
		t.Fatal(err)
	}
	registerTestClock(t, s, c)
	t.Cleanup(func() { s.Destruct() })
	return s
}

// The store speaks RESP2, whose replies it reads as RESP3's, unless its URL
// asks for RESP3: then go-redis looks for push notifications around every
// call.
func TestTheStoreSpeaksRESP2UnlessItsURLAsksForAnother(t *testing.T) {
	url := redistest.EnvURL(t)
	for _, tc := range []struct{ url, want string }{{url, "resp=2"}, {url + "?protocol=3", "resp=3"}} {
		s := newTestRedisStore(t, tc.url)
		chain := []Limit{newLimit("key", redistest.UniqueID(t), 1, 0)}
		if !admitOrFail(t, s, chain, 0).Admitted {
			t.Fatalf("%s: the first request was refused", tc.url)
		}
		info, err := s.client.Do(context.Background(), "CLIENT", "INFO").Text()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(strings.Fields(info), tc.want) {
			t.Errorf("%s: CLIENT INFO %q, want %s", tc.url, info, tc.want)
		}
	}
}

func TestFirstAdmissionAfterClientKillIsStillEnforced(t *testing.T) {
	url := redistest.EnvURL(t)
	s := newTestRedisStore(t, url)
	chain := []Limit{newLimit("key", redistest.UniqueID(t), 1, 0)}
	if !admitOrFail(t, s, chain, 0).Admitted {
		t.Fatal("first request refused")
	}
	if err := redistest.TestClient(t, url).ClientKillByFilter(context.Background(), "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	d, err := s.Admit(context.Background(), chain, TokenCounts{})
	if err != nil {
		t.Fatalf("first admission after CLIENT KILL failed (would fail open): %v", err)
	}
	if d.Admitted {
		t.Fatal("first admission after CLIENT KILL was admitted over rpm 1")
	}
}

// storeOnADyingConnection is a store whose connections to url pass a proxy,
// with the first request of chain admitted at at; the proxy then resets the
// connection that carries the store's next command.
func storeOnADyingConnection(t *testing.T, url string, chain []Limit, at int64) *RedisStore {
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := redistest.NewResetProxy(t, opts.Addr)
	s := newTestRedisStore(t, "redis://"+proxy.Addr()+"/"+strconv.Itoa(opts.DB))
	if !admitOrFail(t, s, chain, at).Admitted {
		t.Fatal("first request refused")
	}
	proxy.ResetAtNextCommand()
	return s
}

// A connection that dies while the admission is on it (not before, when the
// pool would notice) is what the replay is for: without it this admission
// would fail open.
func TestAdmissionOnAConnectionThatDiesAtItsNextCommandIsReplayedOnce(t *testing.T) {
	url := redistest.EnvURL(t)
	at := pinnedBase() + 1000
	chain := []Limit{newLimit("key", redistest.UniqueID(t), 2, 0)}
	s := storeOnADyingConnection(t, url, chain, at)
	d, err := pinned(s, at).Admit(context.Background(), chain, TokenCounts{})
	if err != nil {
		t.Fatalf("admission on a dying connection was not replayed: %v", err)
	}
	if !d.Admitted {
		t.Fatal("second of rpm 2 refused after the replay")
	}
	if admitOrFail(t, s, chain, at).Admitted {
		t.Fatal("third request admitted over rpm 2")
	}
	if n := redisCount(t, url, chain[0].Prefix, RPM, at/MinuteMillis); n != 2 {
		t.Fatalf("counted %d requests, want exactly 2 (the dead attempt never reached Redis)", n)
	}
}

// A call that charges tokens and admits, on a connection that dies at its
// next command, replays its admissions alone: the charge fails with the
// error, for the caller to log, and is charged neither once nor twice.
func TestCallOnADyingConnectionReplaysItsAdmissionsButNotItsCharges(t *testing.T) {
	url := redistest.EnvURL(t)
	at := pinnedBase() + 1000
	chain := []Limit{newLimit("key", redistest.UniqueID(t), 2, 1000)}
	s := storeOnADyingConnection(t, url, chain, at)
	var c scriptCall
	c.charges.add(chain, Charge{Tokens: totalTokens(300)}, MomentAt(at))
	c.add(chain, TokenCounts{})
	ds, charged, err := pinned(s, at).call(context.Background(), &c, false)
	if err != nil {
		t.Fatalf("admission on a dying connection was not replayed: %v", err)
	}
	if !isDeadConnection(charged) {
		t.Fatalf("charge on a dying connection: %v, want the dead connection's error", charged)
	}
	if !ds[0].Admitted || ds[0].Counts[0].Window[TPM].Cur != 0 {
		t.Fatalf("replayed admission: admitted %v, read %d tokens; want admitted, 0", ds[0].Admitted, ds[0].Counts[0].Window[TPM].Cur)
	}
	if n := redisCount(t, url, chain[0].Prefix, TPM, at/MinuteMillis); n != 0 {
		t.Fatalf("%d tokens charged by a call whose connection died, want 0", n)
	}
	if n := redisCount(t, url, chain[0].Prefix, RPM, at/MinuteMillis); n != 2 {
		t.Fatalf("counted %d requests, want 2", n)
	}
}

// A call charges its tokens before it decides: its admissions read them.
func TestAdmissionsOfACallReadTheTokensItCharges(t *testing.T) {
	url := redistest.EnvURL(t)
	s := newTestRedisStore(t, url)
	at := pinnedBase() + 1000
	org := newLimit("org", redistest.UniqueID(t), 0, 500)
	key := newLimit("key", redistest.UniqueID(t), 10, 0)
	var c scriptCall
	c.charges.add([]Limit{key, org}, Charge{Tokens: totalTokens(500)}, MomentAt(at)) // the key has no tpm: only the org is charged
	c.add([]Limit{key, org}, TokenCounts{})
	ds, charged, err := pinned(s, at).call(context.Background(), &c, false)
	if err != nil || charged != nil {
		t.Fatal(err, charged)
	}
	if ds[0].Admitted || ds[0].Counts[1].Window[TPM].Cur != 500 {
		t.Fatalf("admitted %v having read %d tokens; want refused on the 500 charged first", ds[0].Admitted, ds[0].Counts[1].Window[TPM].Cur)
	}
	if len(c.keys(at/MinuteMillis)) != 5 { // key req cur/prev, org tok cur/prev, the org's charge
		t.Fatalf("keys %v", c.keys(at/MinuteMillis))
	}
}

func TestAdmissionFailsWithAnErrorWhileRedisIsDownAndResumesAfterRestart(t *testing.T) {
	srv := redistest.NewServer(t)
	s := newTestRedisStore(t, srv.URL())
	chain := []Limit{newLimit("key", redistest.UniqueID(t), 1, 0)}
	if !admitOrFail(t, s, chain, 0).Admitted {
		t.Fatal("first request refused")
	}
	srv.Stop()
	if _, err := s.Admit(context.Background(), chain, TokenCounts{}); err == nil {
		t.Fatal("admission succeeded with Redis stopped")
	}
	srv.Restart(t) // empty dataset and empty script cache
	if exists, err := redistest.TestClient(t, srv.URL()).ScriptExists(context.Background(), admitScript.Hash()).Result(); err != nil || exists[0] {
		t.Fatalf("script cache after restart: %v %v, want empty", exists, err)
	}
	// The pool may refuse to dial for about a second after failed dials: wait
	// for enforcement rather than assume it is instant.
	deadline := time.Now().Add(5 * time.Second)
	var d Admission
	var err error
	for {
		if d, err = s.Admit(context.Background(), chain, TokenCounts{}); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("admission did not resume after the restart: %v", err)
	}
	if !d.Admitted {
		t.Fatal("refused on an empty restarted Redis")
	}
	if admitOrFail(t, s, chain, 0).Admitted {
		t.Fatal("second request admitted over rpm 1 after the restart")
	}
}

// admitConcurrently runs rounds admissions back to back in each of n
// goroutines through s, each of a chain of its own, and returns how long
// each took and how many failed (on_redis_error would apply to those).
func admitConcurrently(t *testing.T, s *RedisStore, n, rounds int) (took []time.Duration, failed int) {
	t.Helper()
	id := redistest.UniqueID(t)
	took = make([]time.Duration, n*rounds)
	var failures atomic.Int64
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			for r := range rounds {
				chain := []Limit{newLimit("key", fmt.Sprintf("%s-%d-%d", id, g, r), 1, 0)}
				start := time.Now()
				if _, err := s.Admit(context.Background(), chain, TokenCounts{}); err != nil {
					failures.Add(1)
				}
				took[g*rounds+r] = time.Since(start)
			}
		})
	}
	wg.Wait()
	return took, int(failures.Load())
}

// An admission ends within the timeout of its start whatever it waits for:
// a coalesced call in flight and then its own, or a pooled connection.
func TestEveryAdmissionEndsWithinTheTimeoutWhileRedisHangs(t *testing.T) {
	srv := redistest.NewServer(t)
	for _, tc := range []struct {
		name      string
		poolSize  int
		coalesced bool
	}{
		{"coalesced", 0, true},
		{"uncoalesced as on a cluster, one pooled connection", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestRedisStoreOf(t, &RedisDeployment{URL: srv.URL(), PoolSize: tc.poolSize}, redistest.HungTimeout)
			if !tc.coalesced {
				s.calls = nil
			}
			const n, rounds = 16, 8
			// The same traffic with Redis up loads the script and warms what
			// a first burst would pay for on a loaded machine.
			if _, failed := admitConcurrently(t, s, n, rounds); failed > 0 {
				t.Fatalf("%d admissions failed with Redis up", failed)
			}
			resume := srv.Hang(t)
			defer resume()
			took, failed := admitConcurrently(t, s, n, rounds)
			if failed != len(took) {
				t.Errorf("%d of %d admissions succeeded while Redis hangs", len(took)-failed, len(took))
			}
			redistest.CheckWithinTimeout(t, "admissions", took)
		})
	}
}

// An admission whose connection dies under it is replayed on a fresh one:
// when Redis hangs, that dial and the replay end within the admission's
// timeout too.
func TestAnAdmissionReplayedOnAFreshConnectionToAHungRedisEndsWithinTheTimeout(t *testing.T) {
	srv := redistest.NewServer(t)
	proxy := redistest.NewResetProxy(t, srv.Addr())
	s := newTestRedisStoreOf(t, &RedisDeployment{URL: "redis://" + proxy.Addr() + "/0"}, redistest.HungTimeout)
	chain := []Limit{newLimit("key", redistest.UniqueID(t), 1, 0)}
	admitOrFail(t, s, chain, 0)
	resume := srv.Hang(t)
	defer resume()
	proxy.ResetAtNextCommand()
	start := time.Now()
	_, err := s.Admit(context.Background(), chain, TokenCounts{})
	took := time.Since(start)
	if err == nil || isDeadConnection(err) {
		t.Fatalf("admission on a dying connection to a hung Redis: %v, want the replay's timeout", err)
	}
	redistest.CheckWithinTimeout(t, "replayed admissions", []time.Duration{took})
}

// The keys an admission declares are named by the gateway's clock; when Redis's
// clock is in another minute, the script touches nothing and says which.
func TestScriptTouchesNothingWhenItsKeysNameAnotherMinute(t *testing.T) {
	url := redistest.EnvURL(t)
	s := newTestRedisStore(t, url)
	at := pinnedBase() + 7000
	chain := []Limit{newLimit("org", redistest.UniqueID(t), 5, 100)}
	stale := MomentAt(at).Minute - 1
	var c scriptCall
	c.add(chain, TokenCounts{})
	reply, err := s.runScript(context.Background(), admitScript, c.keys(stale), c.args(HexArg(at), stale, false, s.holder), true)
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := otherMinute(reply); !ok || b != MomentAt(at).Minute {
		t.Fatalf("reply %v, want {-1, now} naming the bucket of the script's clock", reply)
	}
	keys, err := redistest.TestClient(t, url).Keys(context.Background(), chain[0].Prefix+"*").Result()
	if err != nil || len(keys) != 0 {
		t.Fatalf("keys %v written by a call whose keys named another minute (%v)", keys, err)
	}
	var chargeOnly scriptCall
	chargeOnly.charges.add(chain, Charge{Tokens: totalTokens(9)}, MomentAt(at))
	reply, err = s.runScript(context.Background(), admitScript, chargeOnly.keys(stale), chargeOnly.args(HexArg(at), stale, false, s.holder), false)
	if _, ok := otherMinute(reply); !ok || err != nil {
		t.Fatalf("token charge with keys of another minute: %v %v", reply, err)
	}
	if keys, _ := redistest.TestClient(t, url).Keys(context.Background(), chain[0].Prefix+"*").Result(); len(keys) != 0 {
		t.Fatalf("keys %v written by a token charge whose keys named another minute", keys)
	}
}

func TestReplyOfTheWrongShapeIsAnError(t *testing.T) {
	var c scriptCall
	c.add([]Limit{newLimit("key", "k", 1, 0)}, TokenCounts{})
	for _, reply := range [][]int64{nil, {1, 0}, {1, 0, 0, 0, 0, 0, 0, 2}, {1, 0, 0, 0, 0, 0, 1}, {0, 0, 0, 0, 0, 0, 0, 1}} {
		if _, err := c.decode(reply, true); !errors.Is(err, ErrBadReply) {
			t.Fatalf("reply %v: err %v, want errBadReply", reply, err)
		}
	}
}

// BenchmarkAdmissionRedisServerTime reports the Redis server time of one
// admission (INFO commandstats: evalsha's usec over the admissions) for
// chains of 1, 2, 4 and 6 limits, each with an rpm and a tpm: one request at
// a time, and 32 at once from keys that share their other scopes, which the
// coalescer decides together; and for 4 limits, each admission reserving
// 1000 tokens, which the script then decides in its reserving mode, and
// each limit capping requests in flight too (in-flight-cap), each
// admission's free then counted with it.
func BenchmarkAdmissionRedisServerTime(b *testing.B) {
	url := redistest.EnvURL(b)
	for _, concurrent := range []bool{false, true} {
		for _, n := range []int{1, 2, 4, 6} {
			name := fmt.Sprintf("chain=%d", n)
			if concurrent {
				name += "/concurrent=32"
			}
			chainOf := func(key int) []Limit { return benchChain(n, fmt.Sprintf("bench%d", key%1000)) }
			b.Run(name, func(b *testing.B) { benchmarkRedisTime(b, url, concurrent, TokenCounts{}, false, chainOf) })
			if n == 4 {
				b.Run(name+"/reserving", func(b *testing.B) { benchmarkRedisTime(b, url, concurrent, totalTokens(1000), false, chainOf) })
				b.Run(name+"/reserving/settled", func(b *testing.B) {
					benchmarkRedisTime(b, url, concurrent, totalTokens(1000), true, chainOf)
				})
				if !concurrent {
					// Calls as the paired rounds of bench/run make them, with
					// redis-server on a core of its own: 6 admissions each,
					// with the settlements of the previous call's.
					b.Run("chain=4/batch=6/reserving/settled", func(b *testing.B) { benchmarkRedisBatches(b, url, 6, chainOf) })
				}
				inFlight := func(key int) []Limit { return withSlots(chainOf(key)) }
				b.Run(name+"/in-flight-cap", func(b *testing.B) { benchmarkRedisTime(b, url, concurrent, TokenCounts{}, false, inFlight) })
				// 1000 tokens at $0.60 per million, on a month budget of each limit.
				budgeted := func(key int) []Limit { return withBudgets(b, chainOf(key)) }
				b.Run(name+"/budget", func(b *testing.B) {
					benchmarkRedisTime(b, url, concurrent, TokenCounts{Total: 1000, Cost: 600_000}, false, budgeted)
				})
				// And the shared limit notifies at 80%, 95% and 100% of
				// its caps (its windows and its budget), never reached.
				notified := func(key int) []Limit { return withNotify(budgeted(key)) }
				b.Run(name+"/budget/notify", func(b *testing.B) {
					benchmarkRedisTime(b, url, concurrent, TokenCounts{Total: 1000, Cost: 600_000}, false, notified)
				})
				// The shared limit learns the provider's quota, which a
				// report has filled (as every answer's does).
				learning := func(key int) []Limit { return withLearning(chainOf(key)) }
				report := Report{At: time.Now().UnixMilli(), Quotas: [NumLearned]ReportedQuota{
					{Limit: MaxLearned, Remaining: MaxLearned - 1, ResetMillis: 3_600_000}, {Limit: MaxLearned, Remaining: MaxLearned - 1000, ResetMillis: 3_600_000}}}
				b.Run(name+"/reserving/learned", func(b *testing.B) {
					learnOrFail(b, newTestRedisStore(b, url), learning(0), report)
					benchmarkRedisTime(b, url, concurrent, totalTokens(1000), false, learning)
				})
				// And has two floors, of 60% and 10%, for the first of
				// which every request comes.
				floored := func(key int) []Limit { return withFloors(learning(key)) }
				b.Run(name+"/reserving/learned/floors", func(b *testing.B) {
					learnOrFail(b, newTestRedisStore(b, url), floored(0), report)
					benchmarkRedisTime(b, url, concurrent, totalTokens(1000), false, floored)
				})
			}
		}
	}
}

// benchmarkRedisBatches reports Redis's time per admission of calls of
// batch admissions, each reserving 1000 tokens, and with the settlements
// of the previous call's admitted (70 tokens used): what the same shape
// costs each time, where the coalescer's batches vary with the moment.
// Every key has counters before the timer starts, as on a gateway whose
// keys come back within their minute: a key's first admission of a minute
// also sets its keys' expiry.
func benchmarkRedisBatches(b *testing.B, url string, batch int, chainOf func(int) []Limit) {
	s := newTestRedisStore(b, url)
	admin := redistest.TestClient(b, url)
	ctx := context.Background()
	reserve := totalTokens(1000)
	var call scriptCall
	var settling [][]Limit
	var admitted []Decision
	send := func(first int) {
		call.reset()
		for i, chain := range settling {
			call.charges.add(chain, Charge{Tokens: totalTokens(70).Minus(reserve)}.Settling(admitted[i]), s.gatewayMoment())
		}
		settling = settling[:0]
		for key := first; key < first+batch; key++ {
			chain := chainOf(key)
			call.add(chain, reserve)
			settling = append(settling, chain)
		}
		ds, _, err := s.call(ctx, &call, false)
		if err != nil {
			b.Fatal(err)
		}
		admitted = append(admitted[:0], ds...)
	}
	for first := 0; first < 1000; first += batch { // loads the script, and makes the counters
		send(first)
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for first := batch; first < batch+b.N; first += batch {
		send(first)
	}
	b.StopTimer()
	calls, usec := redistest.CommandStats(b, admin, "evalsha")
	b.ReportMetric(usec/float64(calls*int64(batch)), "redis-µs/admission")
	b.ReportMetric(float64(batch), "admissions/call")
}

// BenchmarkAdmissionRedisServerTimeByActiveKeys reports the same for 4-scope
// chains, 32 at once, spread over 1,000 or 100,000 API keys whose counters
// (four per key) are all in Redis before the timer starts: what a larger
// keyspace costs each admission.
func BenchmarkAdmissionRedisServerTimeByActiveKeys(b *testing.B) {
	url := redistest.EnvURL(b)
	for _, active := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("keys=%d", active), func(b *testing.B) {
			id := fmt.Sprintf("active%d-", time.Now().UnixNano())
			chainOf := func(key int) []Limit { return benchChain(4, id+strconv.Itoa(key%active)) }
			admin := redistest.TestClient(b, url)
			ctx := context.Background()
			atMinute := time.Now().UnixMilli() / MinuteMillis
			pipe := admin.Pipeline()
			for k := range active {
				prefix := chainOf(k)[0].Prefix
				for _, window := range []WindowKind{RPM, TPM} {
					for _, at := range []int64{atMinute, atMinute - 1} {
						pipe.Set(ctx, PeriodKey(prefix, window, at), 1, 2*time.Minute)
					}
				}
				if pipe.Len() >= 4000 || k == active-1 {
					if _, err := pipe.Exec(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			benchmarkRedisTime(b, url, true, TokenCounts{}, false, chainOf)
		})
	}
}

// benchChain is a chain of n limits, each with an rpm and a tpm that admit
// everything: the key's, then scopes s1... shared by every key.
func benchChain(n int, key string) []Limit {
	chain := make([]Limit, n)
	chain[0] = newLimit("key", key, 1<<40, 1<<40)
	for i := 1; i < n; i++ {
		chain[i] = newLimit(fmt.Sprintf("s%d", i), "bench", 1<<40, 1<<40)
	}
	return chain
}

// withSlots is chain with a cap on requests in flight on every limit, which
// admits everything.
func withSlots(chain []Limit) []Limit {
	for i := range chain {
		chain[i].Concurrent = concurrencyCap{Max: 1 << 40, LeaseMillis: DefaultSlotLease.Milliseconds()}
	}
	return chain
}

// withNotify is chain whose last limit notifies at 80%, 95% and 100%.
func withNotify(chain []Limit) []Limit {
	chain[len(chain)-1] = notifying(chain[len(chain)-1], 80, 95, 100)
	return chain
}

// withLearning is chain whose last limit learns the provider's quota.
func withLearning(chain []Limit) []Limit {
	last := &chain[len(chain)-1]
	caps := *last.Caps
	caps.Learn = true
	last.Caps = &caps
	return chain
}

// withFloors is chain whose last limit has floors of 60% and 10%, and
// whose request is of the first's class.
func withFloors(chain []Limit) []Limit {
	last := &chain[len(chain)-1]
	caps := *last.Caps
	caps.Floors = [MaxFloors]uint8{60, 10}
	last.Caps, last.Class = &caps, 1
	return chain
}

// withBudgets is chain with a month budget on every limit, which admits
// everything.
func withBudgets(b *testing.B, chain []Limit) []Limit {
	c, err := CalendarOf("UTC")
	if err != nil {
		b.Fatal(err)
	}
	for i := range chain {
		chain[i].Budgets = BudgetCaps{Max: [NumBudgetPeriods]int64{BudgetMonth: pricing.MaxBudget}, Calendar: c}
	}
	return chain
}

// benchmarkRedisTime admits chainOf(0), chainOf(1), ... one at a time or 32
// at once, each reserving reserve (and freeing the slots it took once
// admitted), and with settle each admitted one's reservation settled as
// an answer's usage settles it (70 tokens used): the settlements ride in
// the calls that admit, as they do in the gateway. It reports Redis's
// server time per admission and the admissions per call.
func benchmarkRedisTime(b *testing.B, url string, concurrent bool, reserve TokenCounts, settle bool, chainOf func(int) []Limit) {
	s := newTestRedisStore(b, url)
	admin := redistest.TestClient(b, url)
	ctx := context.Background()
	if _, err := s.Admit(ctx, chainOf(0), TokenCounts{}); err != nil { // load the script
		b.Fatal(err)
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	var settling sync.WaitGroup
	var settleErr atomic.Value
	admitOne := func(chain []Limit) error {
		a, err := s.Admit(ctx, chain, reserve)
		if err != nil {
			return err
		}
		if HoldsSlots(chain) {
			s.Free(chain)
		}
		if settle && a.Admitted {
			settling.Add(1)
			c := Charge{Tokens: totalTokens(70).Minus(reserve), Minute: a.Now.Minute}
			s.Charge(chain, c, func(err error) {
				if err != nil {
					settleErr.Store(err)
				}
				settling.Done()
			})
		}
		return nil
	}
	b.ResetTimer()
	if concurrent {
		var next atomic.Int64
		b.SetParallelism(16) // 32 goroutines on 2 cores
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := admitOne(chainOf(int(next.Add(1)))); err != nil {
					b.Error(err)
					return
				}
			}
		})
	} else {
		for i := 0; i < b.N; i++ {
			if err := admitOne(chainOf(i)); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := rideAlong(s); err != nil { // the last frees
		b.Fatal(err)
	}
	settling.Wait()
	b.StopTimer()
	if err, _ := settleErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	calls, usec := redistest.CommandStats(b, admin, "evalsha")
	b.ReportMetric(usec/float64(b.N), "redis-µs/admission")
	b.ReportMetric(float64(b.N)/float64(calls), "admissions/call")
}

// An idle bucket's key expires once the bucket would be full, doubled for
// safety as Spring does; a missing key is a full bucket.
func TestIdleBucketExpiresTwiceTheTimeAnEmptyOneTakesToFill(t *testing.T) {
	url := redistest.EnvURL(t)
	s := newTestRedisStore(t, url)
	chain := []Limit{newBucketLimit(t, "key", redistest.UniqueID(t), "0.5", 3, 0)} // empty to full: 6 s
	admitOrFail(t, s, chain, 0)
	ttl, err := redistest.TestClient(t, url).PTTL(context.Background(), chain[0].Prefix+"bkt").Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 11*time.Second || ttl > 12*time.Second {
		t.Fatalf("bucket key expires in %v, want 12 s", ttl)
	}
}

// A day period is read until the end of the following day: its keys, those
// an admission creates and those a charge creates, expire two days after
// their creation; minute keys after two minutes.
func TestDayKeysExpireAfterTwoDaysAndMinuteKeysAfterTwoMinutes(t *testing.T) {
	url := redistest.EnvURL(t)
	s := newTestRedisStore(t, url)
	chain := []Limit{newWindowLimit("key", redistest.UniqueID(t), WindowCaps{RPM: 10, RPD: 100, TPD: 1000, OTPD: 1000})}
	if !admitOrFail(t, s, chain, 0).Admitted {
		t.Fatal("refused")
	}
	settle(t, s, chain, Charge{Tokens: TokenCounts{Total: 10, Output: 4}})
	now := MomentAt(time.Now().UnixMilli())
	c := redistest.TestClient(t, url)
	for _, k := range []struct {
		window WindowKind
		want   time.Duration
	}{{RPM, 2 * time.Minute}, {RPD, 48 * time.Hour}, {TPD, 48 * time.Hour}, {OTPD, 48 * time.Hour}} {
		key := PeriodKey(chain[0].Prefix, k.window, now.In(k.window.Span()).Period)
		ttl, err := c.TTL(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= k.want-10*time.Second || ttl > k.want {
			t.Errorf("%s expires in %v, want %v", key, ttl, k.want)
		}
	}
}

func TestUnloadedRedisStoreStaysOpenUntilItsLastHolderReleasesIt(t *testing.T) {
	url := redistest.EnvURL(t)
	s, err := NewRedisStore(&RedisDeployment{URL: url}, 250*time.Millisecond, SystemRedisClock)
	if err != nil {
		t.Fatal(err)
	}
	s.Hold()                             // a response admitted under the config being unloaded
	if err := s.Destruct(); err != nil { // the config's unload: its pool lets the store go
		t.Fatal(err)
	}
	chain := []Limit{newLimit("org", redistest.UniqueID(t), 0, 100)}
	settle(t, s, chain, Charge{Tokens: totalTokens(7)}) // after the unload
	s.Release()
	if err := s.client.Ping(context.Background()).Err(); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("client after the last release: %v, want closed", err)
	}
}
