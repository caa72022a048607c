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
	"github.com/rolter/caddy-ratelimit/internal/poll"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// clusterOrgChain is a cluster of three primaries, three stores on it, a
// pinned moment, and a chain rooted at an org: a key of keyCaps, then the
// org's limit in scope, of the caps of its id.
func clusterOrgChain(t *testing.T, keyCaps Caps, scope string, caps func(org string) Caps) (*redistest.Cluster, []Store, int64, []Limit) {
	c := redistest.NewCluster(t, 3)
	org := "org-" + redistest.UniqueID(t)
	tag := ChainTag("org", org)
	return c, clusterStores(t, c, 3), pinnedBase() + 1000, []Limit{
		NewLimit(tag, "key", "k", keyCaps),
		NewLimit(tag, scope, org, caps(org)),
	}
}

// admitsAll are the caps of a key that admits everything.
var admitsAll = CapsOfWindows(WindowCaps{RPM: 1 << 30})

func clusterStores(t *testing.T, c *redistest.Cluster, n int) []Store {
	stores := make([]Store, n)
	for i := range stores {
		stores[i] = newTestRedisStoreOf(t, &RedisDeployment{Cluster: c.URLs()}, time.Second)
	}
	return stores
}

// orgChain is a key/team/org chain rooted at its org, as Handler.chain
// builds it on a cluster.
func orgChain(org, key, team string, keyRPM, orgRPM int64) []Limit {
	tag := ChainTag("org", org)
	return []Limit{
		NewLimit(tag, "key", KeyID(false, key), CapsOfWindows(WindowCaps{RPM: keyRPM})),
		NewLimit(tag, "team", team, CapsOfWindows(WindowCaps{TPM: 1000})),
		NewLimit(tag, "org", org, CapsOfWindows(WindowCaps{RPM: orgRPM, TPM: 1000})),
	}
}

// Reservations and their settlement keep their guarantees on a cluster,
// where calls are not coalesced: 40 concurrent reservations of 1000 across
// three limiters admit exactly 10 against the org's tpm 10500, and a
// settlement lands in its chain's slot and period.
func TestClusterReservationsHoldTheTPMAndSettleInTheirSlot(t *testing.T) {
	c, stores, at, chain := clusterOrgChain(t, CapsOfWindows(WindowCaps{TPM: 1 << 30}), "org", func(string) Caps { return CapsOfWindows(WindowCaps{TPM: 10_500}) })
	if got := raceReservations(t, stores, chain, 40, 1000, at); got != 10 {
		t.Fatalf("admitted %d of 40 reservations of 1000 against tpm 10500, want exactly 10", got)
	}
	settle(t, pinned(stores[1], at+5_000), chain, Charge{Tokens: totalTokens(-10_000), Minute: at / MinuteMillis})
	if n := c.Count(t, PeriodKey(chain[1].Prefix, TPM, at/MinuteMillis)); n != 0 {
		t.Fatalf("the org's token window holds %d after every reservation was given back", n)
	}
}

// Day windows keep their guarantees on a cluster: their keys carry the
// chain's hash tag, so 40 reservations of 1000 across three limiters admit
// exactly 10 against a tpd of 10500, counted in the day periods of the
// chain's slot, and a settlement minutes later still lands in its day.
func TestClusterDayWindowsAreExactAndSettleInTheirSlot(t *testing.T) {
	c, stores, at, chain := clusterOrgChain(t, CapsOfWindows(WindowCaps{RPD: 1000}), "org", func(string) Caps {
		return CapsOfWindows(WindowCaps{TPD: 10_500, RPD: 1000})
	})
	if got := raceReservations(t, stores, chain, 40, 1000, at); got != 10 {
		t.Fatalf("admitted %d of 40 reservations of 1000 against tpd 10500, want exactly 10", got)
	}
	day := DayOf(at / MinuteMillis)
	if n := c.Count(t, PeriodKey(chain[1].Prefix, RPD, day)); n != 10 {
		t.Fatalf("the org's day request window holds %d, want 10", n)
	}
	settle(t, pinned(stores[2], at+3*MinuteMillis), chain, Charge{Tokens: totalTokens(-4_000), Minute: at / MinuteMillis})
	if n := c.Count(t, PeriodKey(chain[1].Prefix, TPD, day)); n != 6_000 {
		t.Fatalf("the org's day token bucket holds %d after 4000 were given back, want 6000", n)
	}
}

func TestClusterAdmissionIsExactForOrgsOnDifferentShardsAcrossThreeLimiters(t *testing.T) {
	c := redistest.NewCluster(t, 3)
	stores := clusterStores(t, c, 3)
	at := pinnedBase() + 1000
	shards := map[string]bool{}
	var orgs []string
	for i := 0; len(shards) < 3 || len(orgs) < 4; i++ {
		org := fmt.Sprintf("org%d-%s", i, redistest.UniqueID(t))
		orgs = append(orgs, org)
		shards[c.SlotOwner("{org:"+org+"}")] = true
	}
	var wg sync.WaitGroup
	admitted := make([]int, len(orgs))
	for i, org := range orgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			admitted[i] = raceAdmissions(t, stores, orgChain(org, "sk-"+org, "team", 100, 5), 48, at)
		}()
	}
	wg.Wait()
	for i, org := range orgs {
		if admitted[i] != 5 {
			t.Errorf("%s: admitted %d of 48 against rpm 5, want exactly 5", org, admitted[i])
		}
		chain := orgChain(org, "sk-"+org, "team", 100, 5)
		if n := c.Count(t, PeriodKey(chain[2].Prefix, RPM, at/MinuteMillis)); n != 5 {
			t.Errorf("%s: counted %d on its shard, want exactly 5", org, n)
		}
	}
}

func TestClusterOrgCapIsSharedExactlyByItsKeysAndTeams(t *testing.T) {
	c := redistest.NewCluster(t, 3)
	stores := clusterStores(t, c, 3)
	at := pinnedBase() + 1000
	org := "acme-" + redistest.UniqueID(t)
	var admitted atomic.Int64
	var start, wg sync.WaitGroup
	start.Add(1)
	for i := 0; i < 60; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start.Wait()
			chain := orgChain(org, fmt.Sprintf("sk-%d", i%6), fmt.Sprintf("team%d", i%3), 100, 10)
			d, err := pinned(stores[i%3], at).Admit(context.Background(), chain, TokenCounts{})
			if err != nil {
				t.Error(err)
				return
			}
			if d.Admitted {
				admitted.Add(1)
			}
		}()
	}
	start.Done()
	wg.Wait()
	if admitted.Load() != 10 {
		t.Fatalf("admitted %d requests of 6 keys and 3 teams against the org's rpm 10, want exactly 10", admitted.Load())
	}
	orgLimit := orgChain(org, "", "", 0, 10)[2]
	if n := c.Count(t, PeriodKey(orgLimit.Prefix, RPM, at/MinuteMillis)); n != 10 {
		t.Fatalf("org counted %d, want 10", n)
	}
}

// While the org's slot migrates and its chain's keys are split between the
// two shards, the script gets TRYAGAIN (it did not run): it is retried within
// the timeout and then handled like an outage. Once the slot has moved, the
// MOVED reply is followed and the count goes on, exact, on the new shard.
func TestClusterSlotMigrationIsRetriedThenFollowedWithExactCounts(t *testing.T) {
	c := redistest.NewCluster(t, 3)
	s := newTestRedisStoreOf(t, &RedisDeployment{Cluster: c.URLs()}, 150*time.Millisecond)
	at := pinnedBase() + 1000
	org := "mover-" + redistest.UniqueID(t)
	chain := orgChain(org, "sk-a", "team", 100, 4)
	fill(t, s, chain, at, 2)
	tag := "{org:" + org + "}"
	var to string
	for _, a := range c.Addrs() {
		if a != c.SlotOwner(tag) {
			to = a
		}
	}
	m := c.BeginSlotMigration(t, c.KeySlot(tag), to)
	m.MoveKeys(t, PeriodKey(chain[0].Prefix, RPM, at/MinuteMillis)) // the key's counter moves, the org's stays
	if _, err := pinned(s, at).Admit(context.Background(), chain, TokenCounts{}); err == nil {
		t.Fatal("admitted while the chain's keys were split between two shards")
	}
	m.Finish(t)
	fill(t, s, chain, at, 2)
	if admitOrFail(t, s, chain, at).Admitted {
		t.Fatal("admitted over the org's rpm 4 after the move")
	}
	if n := c.Count(t, PeriodKey(chain[2].Prefix, RPM, at/MinuteMillis)); n != 4 {
		t.Fatalf("org counted %d on its new shard, want exactly 4", n)
	}
}

// After a failover admission resumes, exact, on the new primary, and the
// slots of the requests still in flight are counted there once after the
// next renewal, whatever of them the replica had.
func TestSentinelFailoverResumesExactAdmissionOnTheNewPrimary(t *testing.T) {
	set := redistest.NewSentinel(t)
	s := newTestRedisStoreOf(t, &RedisDeployment{Sentinel: &RedisSentinel{Master: set.MasterName(), URLs: sentinelURLs(set)}}, 200*time.Millisecond)
	ctx := context.Background()
	inFlightChain := []Limit{newSlotLimit("key", redistest.UniqueID(t), 3, 0, 30*time.Second)}
	fill(t, s, inFlightChain, 0, 2)

	// Steady traffic through the failover.
	stop := make(chan struct{})
	var during, failed atomic.Int64
	traffic := make(chan struct{})
	go func() {
		defer close(traffic)
		chain := []Limit{newLimit("org", "steady-"+redistest.UniqueID(t), 1_000_000, 0)}
		pace := time.NewTicker(time.Millisecond) // steady, not a busy loop
		defer pace.Stop()
		for {
			select {
			case <-stop:
				return
			case <-pace.C:
			}
			during.Add(1)
			if _, err := s.Admit(ctx, chain, TokenCounts{}); err != nil {
				failed.Add(1) // on_redis_error applies during the gap
			}
		}
	}()
	old := set.KillPrimary(t)
	set.WaitFailover(t, old)
	chain := []Limit{newLimit("org", redistest.UniqueID(t), 3, 0)}
	waitNewPrimary(t, s, chain)
	close(stop)
	<-traffic
	t.Logf("%d admissions during the failover, %d failed (on_redis_error)", during.Load(), failed.Load())
	admitted := 0
	for i := 0; i < 10; i++ {
		if d := admitOrFail(t, s, chain, 0); d.Admitted {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("admitted %d of 10 against rpm 3 on the new primary, want exactly 3", admitted)
	}
	renewSlots(s, 0)
	if n := inFlight(t, s, inFlightChain, 0, 0); n != 2 {
		t.Fatalf("%d in flight on the new primary after the renewal, want the 2 still running", n)
	}
	fill(t, s, inFlightChain, 0, 1)
	if admitOrFail(t, s, inFlightChain, 0).Admitted {
		t.Fatal("a fourth admitted under concurrent 3 on the new primary")
	}
	for range 3 {
		freeAndWait(t, s, inFlightChain)
	}
}

// waitNewPrimary waits until s reads chain again after a failover: the
// client finds the new primary only by asking the sentinels again after a
// failed call, so it is asked until it does.
func waitNewPrimary(t *testing.T, s Store, chain []Limit) {
	t.Helper()
	err := poll.Until(10*time.Second, 20*time.Millisecond, func() error {
		if _, err := s.Peek(context.Background(), chain); err != nil {
			return fmt.Errorf("the store does not read on the new primary: %w", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func sentinelURLs(set *redistest.Sentinel) []string {
	var urls []string
	for _, a := range set.SentinelAddrs() {
		urls = append(urls, "redis://"+a)
	}
	return urls
}

// BenchmarkAdmissionsSingleNodeVersusCluster measures admissions per second
// of 4-scope chains over 1000 orgs on one Redis and on a 3-shard cluster, in
// one run.
func BenchmarkAdmissionsSingleNodeVersusCluster(b *testing.B) {
	single := redistest.NewServer(b)
	c := redistest.NewCluster(b, 3)
	for _, tc := range []struct {
		name   string
		config *RedisDeployment
	}{{"single", &RedisDeployment{URL: single.URL()}}, {"cluster3", &RedisDeployment{Cluster: c.URLs()}}} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := NewRedisStore(tc.config, time.Second, SystemRedisClock)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Destruct()
			chains := make([][]Limit, 1000)
			for i := range chains {
				org := fmt.Sprintf("org%d", i)
				tag := ""
				if tc.config.topology() == cluster {
					tag = ChainTag("org", org)
				}
				chains[i] = []Limit{
					NewLimit(tag, "key", fmt.Sprintf("k%d", i), CapsOfWindows(WindowCaps{RPM: MaxCap, TPM: MaxCap})),
					NewLimit(tag, "project", "p", CapsOfWindows(WindowCaps{RPM: MaxCap, TPM: MaxCap})),
					NewLimit(tag, "team", "t", CapsOfWindows(WindowCaps{RPM: MaxCap, TPM: MaxCap})),
					NewLimit(tag, "org", org, CapsOfWindows(WindowCaps{RPM: MaxCap, TPM: MaxCap})),
				}
			}
			var next atomic.Int64
			b.SetParallelism(16)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := s.Admit(context.Background(), chains[next.Add(1)%int64(len(chains))], TokenCounts{}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "admissions/s")
		})
	}
}

// Slots keep their guarantees on a cluster, where calls are not coalesced:
// 30 racing admissions across three limiters admit exactly 5 against an
// org's concurrent 5, the org's slots key is in its chain's slot, and a
// renewal, one call per chain root in one pipeline, writes the slots of
// every root a limiter holds.
func TestClusterSlotsAreExactAndRenewedInEachChainsSlot(t *testing.T) {
	const lease = 30 * time.Second
	c, stores, at, chain := clusterOrgChain(t, admitsAll, "org", func(org string) Caps { return *newSlotLimit("org", org, 5, 0, lease).Caps })
	if got := raceAdmissions(t, stores, chain, 30, at); got != 5 {
		t.Fatalf("admitted %d of 30 racing requests against concurrent 5, want exactly 5", got)
	}
	if c.KeySlot(SlotsKey(chain[1])) != c.KeySlot(PeriodKey(chain[0].Prefix, RPM, at/MinuteMillis)) {
		t.Fatal("the org's slots key is outside its chain's slot")
	}

	// One limiter holds a slot under each of 8 roots; their slots keys are
	// lost (as by a node restarted empty), and its renewal writes them all.
	var chains [][]Limit
	for i := range 8 {
		root := fmt.Sprintf("org-%d-%s", i, redistest.UniqueID(t))
		chains = append(chains, []Limit{NewLimit(ChainTag("org", root), "org", root, *newSlotLimit("org", root, 1, 0, lease).Caps)})
		fill(t, stores[0], chains[i], at, 1)
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { client.Close() })
	for _, ch := range chains {
		if err := client.Del(context.Background(), SlotsKey(ch[0])).Err(); err != nil {
			t.Fatal(err)
		}
	}
	renewSlots(stores[0], at)
	for i, ch := range chains {
		if n := inFlight(t, stores[1], ch, 0, at); n != 1 {
			t.Fatalf("root %d: %d in flight after the renewal, want 1", i, n)
		}
	}
}

// Budgets keep their guarantees on a cluster: their keys carry the chain's
// hash tag, so 40 concurrent admissions across three limiters admit
// exactly the 10 whose largest costs the org's month budget holds, and
// their settlements, from another limiter, land in the chain's slot and
// the reservations' period.
func TestClusterBudgetsAreExactAndSettleInTheirSlot(t *testing.T) {
	c, stores, at, chain := clusterOrgChain(t, admitsAll, "org", func(org string) Caps {
		return *newBudgetLimit(t, "org", org, 0, 10*usd, 0, "Europe/Paris").Caps
	})
	var decisions []Decision
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 40 {
		s := pinned(stores[i%3], at)
		wg.Go(func() {
			a, err := s.Admit(context.Background(), chain, TokenCounts{Total: 1, Cost: usd})
			if err != nil {
				t.Error(err)
			}
			if a.Admitted {
				mu.Lock()
				decisions = append(decisions, a.Decision)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(decisions) != 10 {
		t.Fatalf("admitted %d of 40 admissions of $1 against a month budget of $10, want exactly 10", len(decisions))
	}
	month := chain[1].Budgets.Calendar.Span(BudgetMonth, at/MinuteMillis)
	spentKey, reservedKey := budgetKey(month, chain[1].Prefix, BudgetMonth, false), budgetKey(month, chain[1].Prefix, BudgetMonth, true)
	if c.KeySlot(reservedKey) != c.KeySlot(PeriodKey(chain[0].Prefix, RPM, at/MinuteMillis)) {
		t.Fatal("the org's budget keys are outside its chain's slot")
	}
	for _, d := range decisions {
		settle(t, pinned(stores[2], at+5_000), chain, settlement(d, usd/4))
	}
	if spent, reserved := c.Count(t, spentKey), c.Count(t, reservedKey); spent != 10*usd/4 || reserved != 0 {
		t.Fatalf("the org's month holds spent %d, reserved %d; want the 10 real costs, %d, and nothing reserved", spent, reserved, 10*usd/4)
	}
}

// A Sentinel-managed primary holds budgets as a single node does, and so
// does the primary that replaces it: what was spent is still spent.
func TestSentinelBudgetsHoldAcrossAFailover(t *testing.T) {
	set := redistest.NewSentinel(t)
	s := newTestRedisStoreOf(t, &RedisDeployment{Sentinel: &RedisSentinel{Master: set.MasterName(), URLs: sentinelURLs(set)}}, 200*time.Millisecond)
	at := pinnedBase()
	chain := []Limit{newBudgetLimit(t, "team", redistest.UniqueID(t), 3*usd, 0, 0, "UTC")}
	for range 2 {
		d := admitCost(t, s, chain, at, usd).Decision
		settle(t, pinned(s, at), chain, settlement(d, usd))
	}
	// The replica must have the spend before the primary dies.
	primary := redis.NewClient(&redis.Options{Addr: set.PrimaryAddr(t)})
	n, err := primary.Do(context.Background(), "WAIT", 1, 2000).Int()
	primary.Close()
	if err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d replicas, %v", n, err)
	}
	old := set.KillPrimary(t)
	set.WaitFailover(t, old)
	waitNewPrimary(t, pinned(s, at), chain)
	if !admitCost(t, s, chain, at, usd).Admitted {
		t.Fatal("the third dollar of a $3 budget was refused on the new primary")
	}
	if a := admitCost(t, s, chain, at, 1); a.Admitted || a.Refusal.Kind != Budget {
		t.Fatalf("a request beyond the budget was admitted on the new primary (refusal %+v)", a.Refusal)
	}
}

// On a cluster a shadow limit is counted in its chain's slot and refuses
// nothing: 30 racing admissions against an enforced rpm 10 and a shadow
// rpm 3 admit exactly 10, all counted by the shadow limit; caps that vary
// per request (a plan raised between two admissions) apply to the same
// counter there as anywhere.
func TestClusterShadowLimitsCountAndRefuseNothingAndCapsVaryOnOneCounter(t *testing.T) {
	c := redistest.NewCluster(t, 3)
	stores := clusterStores(t, c, 3)
	at := pinnedBase() + 1000
	org := "org-" + redistest.UniqueID(t)
	tag := ChainTag("org", org)
	shadow := CapsOfWindows(WindowCaps{RPM: 3})
	shadow.Shadow = true
	chain := []Limit{
		NewLimit(tag, "key", "k", CapsOfWindows(WindowCaps{RPM: 10})),
		NewLimit(tag, "org", org, shadow),
	}
	if got := raceAdmissions(t, stores, chain, 30, at); got != 10 {
		t.Fatalf("admitted %d of 30 against an enforced rpm 10 and a shadow rpm 3, want exactly 10", got)
	}
	if n := c.Count(t, PeriodKey(chain[1].Prefix, RPM, at/MinuteMillis)); n != 10 {
		t.Fatalf("the shadow limit counted %d, want the 10 admitted", n)
	}
	raised := []Limit{NewLimit(tag, "key", "k", CapsOfWindows(WindowCaps{RPM: 12}))}
	if got := raceAdmissions(t, stores, raised, 5, at); got != 2 {
		t.Fatalf("a plan raised from 10 to 12 admitted %d more, want 2", got)
	}
}

// On a cluster what a limit learned of the provider's quota is in its
// chain's slot, learned by one replica and read by the others in the same
// atomic admission: 40 racing admissions on three replicas against a
// report of 7 remaining admit exactly 7, and the provider's refusal pauses
// them all.
func TestClusterLearnedQuotasAreExactAndInTheirChainsSlot(t *testing.T) {
	c, stores, at, chain := clusterOrgChain(t, admitsAll, "provider", func(string) Caps { return Caps{Learn: true} })
	var key strings.Builder
	writeLearnedKey(&key, chain[1].Prefix)
	if c.KeySlot(key.String()) != c.KeySlot(PeriodKey(chain[0].Prefix, RPM, at/MinuteMillis)) {
		t.Fatal("the learned key is outside its chain's slot")
	}
	learnOrFail(t, stores[0], chain, requestsReport(at, 100, 7, 600_000))
	if got := raceAdmissions(t, stores, chain, 40, at); got != 7 {
		t.Fatalf("admitted %d of 40 against a report of 7 remaining, want exactly 7", got)
	}
	learnOrFail(t, stores[1], chain, Report{At: at + 10, Refused: true, Wait: 1000})
	if a := admitted(t, stores[2], chain, at+500, TokenCounts{}); a.Admitted || a.Refusal.Kind != Provider || a.Refusal.WaitMillis < 510 {
		t.Fatalf("during the pause: admitted %v, kind %v, wait %d", a.Admitted, a.Refusal.Kind, a.Refusal.WaitMillis)
	}
	for i, s := range stores {
		if a := admitted(t, s, chain, at+600_000, TokenCounts{}); !a.Admitted {
			t.Fatalf("replica %d refused once the report and the pause had ended", i)
		}
	}
}
