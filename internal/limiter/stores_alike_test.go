package limiter

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// randomCaps are the caps of a random limit: each window now and then, small
// enough for a few requests or tokens to fill it, a token bucket in some,
// and a cap of 1 to 4 requests in flight in some; at least one of them.
// Tokens come in tens (randomReservation, randomUsage), and so do the token
// caps: counts often reach a cap exactly. Redis expires a key on its own
// clock, not on a test's pinned one: the buckets refill slowly, from 10 s
// for a token (their key lives twice the time the bucket takes to fill
// after its last write), and the slots' leases are of 3 to 6 s (their key
// lives two leases after its last write), so that no key expires while a
// history runs.
func randomCaps(t testing.TB, rng *rand.Rand) Caps {
	t.Helper()
	// How often a limit caps each window, in percent, and its cap's
	// range, in requests or tens of tokens.
	odds := [NumWindows]struct{ percent, least, most int64 }{
		RPM: {70, 1, 6}, TPM: {50, 2, 19}, ITPM: {25, 2, 13}, OTPM: {25, 1, 8},
		RPD: {20, 2, 11}, TPD: {20, 5, 34}, ITPD: {17, 4, 23}, OTPD: {17, 2, 16},
	}
	var w WindowCaps
	for k, o := range odds {
		if rng.Int64N(100) < o.percent {
			w[k] = o.least + rng.Int64N(o.most-o.least+1)
			if WindowKind(k).Kind() != Requests {
				w[k] *= 10
			}
		}
	}
	caps := CapsOfWindows(w)
	if rng.IntN(10) < 4 {
		burst := 1 + rng.Int64N(4)
		caps.Bucket = newTokenBucket(t, []string{"0.01", "0.037", "0.1"}[rng.IntN(3)], burst, 1+rng.Int64N(burst))
	}
	if rng.IntN(10) < 3 {
		caps.Concurrent = concurrencyCap{Max: 1 + rng.Int64N(4), LeaseMillis: 3000 + rng.Int64N(3001)}
	}
	if rng.IntN(10) < 3 {
		// In tens of nano-dollars, as costs come (randomReservation,
		// randomUsage), in one of three calendars.
		for p := range NumBudgetPeriods {
			if rng.IntN(3) > 0 {
				caps.Budgets.Max[p] = 10 * (3 + rng.Int64N(30))
			}
		}
		if caps.Budgets.Max != [NumBudgetPeriods]int64{} {
			c, err := CalendarOf([]string{"UTC", "Asia/Kolkata", "America/New_York"}[rng.IntN(3)])
			if err != nil {
				t.Fatal(err)
			}
			caps.Budgets.Calendar = c
		}
	}
	if caps == (Caps{}) {
		caps = CapsOfWindows(WindowCaps{RPM: 3})
	}
	caps.Shadow = rng.IntN(10) < 2
	caps.Learn = rng.IntN(10) < 3
	if rng.IntN(10) < 3 {
		caps.Floors = randomFloors(rng)
	}
	if rng.IntN(10) < 4 {
		caps.Notify = randomNotify(rng)
	}
	return caps
}

// randomNotify are 1 to 4 fractions from 1% to 100%, from low to high:
// with the small caps of randomCaps, some levels reach two at once.
func randomNotify(rng *rand.Rand) (notify [MaxNotify]uint8) {
	percents := rng.Perm(100)[:1+rng.IntN(4)]
	slices.Sort(percents)
	for i, p := range percents {
		notify[i] = uint8(p + 1)
	}
	return notify
}

// randomFloors are 1 to 3 floors of 10% to 70% each, together at most
// 100%.
func randomFloors(rng *rand.Rand) (floors [MaxFloors]uint8) {
	left := 100
	for i := range 1 + rng.IntN(3) {
		if left < 10 {
			break
		}
		floors[i] = uint8(10 + rng.IntN(min(left, 70)-9))
		left -= int(floors[i])
	}
	return floors
}

// randomReport is a provider's report at about now, a second late at most
// (older than one a limit holds now and then): each quota now and then,
// in requests or tens of tokens, full again within a minute, and now and
// then a refusal of up to 5 s.
func randomReport(rng *rand.Rand, now int64) Report {
	r := Report{At: now - rng.Int64N(1000)}
	for k := range r.Quotas {
		if rng.IntN(2) == 0 {
			continue
		}
		limit := 1 + rng.Int64N(12)
		if k > 0 {
			limit *= 10
		}
		r.Quotas[k] = ReportedQuota{Limit: limit, Remaining: rng.Int64N(limit + 1), ResetMillis: rng.Int64N(60_000), From: 1 + rng.Int64N(9)}
	}
	if rng.IntN(6) == 0 {
		r.Refused, r.Wait, r.WaitFrom = true, rng.Int64N(5000), 1+rng.Int64N(9)
	}
	return r
}

// randomChain is the positions of 1 to most of n limits, in a random order.
func randomChain(rng *rand.Rand, n, most int) []int {
	return rng.Perm(n)[:1+rng.IntN(min(most, n))]
}

// randomReservation is a request's reservation of input and output tokens,
// and their largest cost, up to past the caps of randomCaps; either part
// may be none, and so may the cost (a model priced at 0).
func randomReservation(rng *rand.Rand) TokenCounts {
	in, out := 10*rng.Int64N(6), 10*rng.Int64N(5)
	if in+out == 0 {
		out = 10
	}
	return TokenCounts{Total: in + out, Input: in, Output: out, Cost: 10 * rng.Int64N(8)}
}

// randomUsage is a response's usage: its total may be above its input and
// output (Anthropic's cache reads); and its cost.
func randomUsage(rng *rand.Rand) TokenCounts {
	in, out := 10*rng.Int64N(10), 10*rng.Int64N(6)
	return TokenCounts{Total: in + out + 10*rng.Int64N(2), Input: in, Output: out, Cost: 10 * rng.Int64N(10)}
}

var (
	alikeHistories = flag.Int("alike.histories", 200, "how many random histories TestBothStoresDecideEveryRandomHistoryAlike runs")
	alikeSeed      = flag.Uint64("alike.seed", 0, "the seed of its first history, the next ones' are the following numbers (0: a random one)")
)

// alikeSteps is the steps of a history; alikePool, the limits its chains
// are drawn from.
const (
	alikeSteps = 200
	alikePool  = 6
)

// The in-process store and the Redis store restate the same arithmetic, in
// Go and in Lua: the same random history, run through both on pinned
// clocks, gets the same answers. A history is admissions of random chains
// of 1 to 4 limits from a pool of six with random caps (every kind of
// window, token buckets, caps on requests in flight with leases of a few
// seconds (now and then one taken under two leases, as two handlers
// sharing its counters do), and day and month budgets in three time zones; some of them
// shadow limits, which count and never refuse), with and
// without reservations of tokens and costs; settlements of the
// reservations, which give tokens back or charge more in the reservation's
// buckets, and replace reserved costs by real ones in their periods (and
// charge what they used where a reset since took their reservation); resets
// of a limit's windows and bucket; token and cost charges of responses; frees of the slots of admitted requests,
// each once, whether their lease is live or has lapsed; renewals of every
// slot a store holds, on both at the same moment; peeks; and clock steps
// of milliseconds to hours, some onto minute and day boundaries, some onto
// the end of a lease or of a budget's period. Every admission, refusal (its
// limit, kind, window and wait, or that it waits for a request in flight
// to end) and count, the slots in flight included, is compared. Redis
// answers some refusals from its refusal cache, which holds only what
// refuses on requests windows and buckets: such an answer must be the
// in-process store's refusal as the cache makes it.
//
// Both stores' ledgers, which their renewals write, must hold one slot of
// a concurrency cap per admitted request of its chain not yet freed, and a
// renewal must leave exactly that many in flight, lapsed leases included.
// Without Redis the in-process store runs the histories alone, against
// those counts and its own reads: an admission reads what a peek just
// before it read, and what refusedUnread refuses is never admitted.
//
// -alike.histories runs more histories, -alike.seed replays one (with
// -alike.histories=1).
func TestBothStoresDecideEveryRandomHistoryAlike(t *testing.T) {
	seed := *alikeSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	compared := false
	t.Run("InProcessAgainstRedis", func(t *testing.T) {
		url := redistest.EnvURL(t)
		compared = true
		runAlikeHistories(t, seed, url)
	})
	if !compared {
		t.Run("InProcessAgainstItsOwnReads", func(t *testing.T) { runAlikeHistories(t, seed, "") })
	}
}

// alikeWorkers run histories at once, each on stores of its own (a pinned
// clock is a store's): a history spends most of its time waiting for Redis,
// or for a token charge's linger.
const alikeWorkers = 16

// runAlikeHistories runs the histories of the seeds from seed on, each in a
// subtest named by its seed, against Redis at redisURL ("": none), until
// one fails.
func runAlikeHistories(t *testing.T, seed uint64, redisURL string) {
	start := time.Now()
	var tally alikeTally
	seeds := make(chan uint64)
	var workers sync.WaitGroup
	for range alikeWorkers {
		memory := newTestMemoryStore(t, time.Hour)
		var redis *RedisStore
		if redisURL != "" {
			redis = newTestRedisStore(t, redisURL)
		}
		workers.Go(func() {
			for seed := range seeds {
				t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
					(&alikeHistory{t: t, seed: seed, tally: &tally, memory: memory, redis: redis}).run()
				})
			}
		})
	}
	n := 0
	for ; n < *alikeHistories && !t.Failed(); n++ {
		seeds <- seed + uint64(n)
	}
	close(seeds)
	workers.Wait()
	t.Logf("%d histories of %d steps from seed %d in %v: %d admissions, %d admitted, %d refused by Redis's cache, %d refused for want of a slot, %d by a budget, %d by the provider's quota, %d for a floor; %d crossings reported; %d settlements, %d frees (%d of a lapsed lease), %d renewals, %d resets, %d reports",
		n, alikeSteps, seed, time.Since(start), tally.admissions.Load(), tally.admitted.Load(), tally.cached.Load(), tally.slotRefusals.Load(), tally.budgetRefusals.Load(), tally.providerRefusals.Load(), tally.floorRefusals.Load(), tally.crossings.Load(),
		tally.settlements.Load(), tally.frees.Load(), tally.lapsedFrees.Load(), tally.renewals.Load(), tally.resets.Load(), tally.reports.Load())
}

// alikeTally is what the histories did, so that a run shows what it
// compared.
type alikeTally struct {
	admissions, admitted, cached, slotRefusals, budgetRefusals, providerRefusals, floorRefusals, crossings, settlements, frees, lapsedFrees, renewals, resets, reports atomic.Int64
}

// alikeHistory is one random history, run through the in-process store and
// Redis's (nil: the in-process store alone).
type alikeHistory struct {
	t      *testing.T
	seed   uint64
	tally  *alikeTally
	rng    *rand.Rand
	memory *MemoryStore
	redis  *RedisStore
	pool   []Limit
	now    int64         // the pinned clocks, in unix milliseconds
	open   []reservation // admitted reservations not yet settled
	// inFlight are the admitted chains that hold slots, not yet freed;
	// leaseEnds, by limit of the pool, when the lease of its slots last
	// written (by an admission or a renewal) ends.
	inFlight  [][]Limit
	leaseEnds [alikePool]int64
	steps     []string // what the history did, for a failure's message
}

type reservation struct {
	chain    []Limit
	decision Decision // the admission's: its reservation, and its clock
}

func (h *alikeHistory) run() {
	h.rng = rand.New(rand.NewPCG(h.seed, 0))
	id := redistest.UniqueID(h.t)
	for i := range alikePool {
		h.pool = append(h.pool, NewLimit("", fmt.Sprint("s", i), id, randomCaps(h.t, h.rng)))
	}
	// Now and then the last limit is another handler's of one before it:
	// its counters, its cap on requests in flight under another lease (two
	// slot_lease values: slots.go).
	if i := slices.IndexFunc(h.pool, func(l Limit) bool { return l.Concurrent.Max > 0 }); i >= 0 && i < alikePool-1 && h.rng.IntN(2) == 0 {
		caps := *h.pool[i].Caps
		caps.Concurrent.LeaseMillis = 3000 + h.rng.Int64N(3001)
		h.pool[alikePool-1] = NewLimit("", h.pool[i].Scope, id, caps)
	}
	h.now = nextDay() + h.rng.Int64N(dayMinutes*MinuteMillis)
	for range alikeSteps {
		switch n := h.rng.IntN(27); {
		case n < 9:
			h.admit()
		case n < 12:
			h.settle()
		case n < 14:
			h.chargeUsage()
		case n < 15:
			h.peek()
		case n < 18:
			h.free()
		case n < 19:
			h.renew()
		case n < 20:
			h.reset()
		case n < 22:
			h.learn()
		default:
			h.tick()
		}
	}
	// The requests still in flight end, so that the stores hold nothing
	// of the history: the Redis store holds itself open for their frees.
	for len(h.inFlight) > 0 {
		h.free()
	}
}

// chain is a random chain of limits of the pool, each of its counters
// once, as a handler's.
func (h *alikeHistory) chain() []Limit {
	var chain []Limit
	for _, i := range randomChain(h.rng, alikePool, 4) {
		if !slices.ContainsFunc(chain, func(l Limit) bool { return l.Prefix == h.pool[i].Prefix }) {
			l := h.pool[i]
			l.Class = uint8(h.rng.IntN(l.NumFloors() + 1)) // a request of a floor's class, or of none
			chain = append(chain, l)
		}
	}
	return chain
}

func (h *alikeHistory) log(format string, args ...any) {
	h.steps = append(h.steps, time.UnixMilli(h.now).UTC().Format("Jan 2 15:04:05.000 ")+fmt.Sprintf(format, args...))
}

// fail reports a divergence with the steps that led to it, and how to
// replay the history.
func (h *alikeHistory) fail(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("history of seed %d, step %d:\n%s\n"+format+"\n(replay: go test -run 'TestBothStoresDecideEveryRandomHistoryAlike' -args -alike.seed=%d -alike.histories=1)",
		append(append([]any{h.seed, len(h.steps) - 1, strings.Join(h.steps, "\n")}, args...), h.seed)...)
}

func (h *alikeHistory) must(err error) {
	h.t.Helper()
	if err != nil {
		h.fail("%v", err)
	}
}

// learn has both stores learn a random report for a chain.
func (h *alikeHistory) learn() {
	chain, r := h.chain(), randomReport(h.rng, h.now)
	h.log("learn %v on %v", r, scopesOf(chain))
	stores := []Store{h.memory}
	if h.redis != nil {
		stores = append(stores, h.redis)
	}
	for _, s := range stores {
		done := make(chan error, 1)
		s.Learn(chain, r, func(err error) { done <- err })
		h.must(<-done)
	}
	h.tally.reports.Add(1)
}

// admit admits a chain as the handler does: refusedUnread first, which may
// spare it the body, then admit.
func (h *alikeHistory) admit() {
	ctx := context.Background()
	chain := h.chain()
	var reserve TokenCounts
	if h.rng.IntN(3) > 0 {
		reserve = randomReservation(h.rng)
	}
	h.log("admit %s reserving %+v", scopesOf(chain), reserve)
	m := pinned(h.memory, h.now)
	before, err := m.Peek(ctx, chain)
	h.must(err)
	_, refusedUnread := m.RefusedUnread(chain)
	a, err := m.Admit(ctx, chain, reserve)
	h.must(err)
	if a.Now != before.Now || !slices.EqualFunc(a.Counts, before.Counts, sameCounts) {
		h.fail("the in-process store admits reading %s, a peek just before read %s", describeDecision(a.Decision), describeDecision(before))
	}
	if refusedUnread && a.Admitted {
		h.fail("the in-process store admits what its refusedUnread refuses")
	}
	h.tally.admissions.Add(1)
	if a.Admitted {
		h.tally.admitted.Add(1)
		if !reserve.IsZero() {
			h.open = append(h.open, reservation{chain: chain, decision: a.Decision})
		}
		if HoldsSlots(chain) {
			h.inFlight = append(h.inFlight, chain)
			h.leased(chain)
		}
	} else if a.Refusal.UntilFreed {
		h.tally.slotRefusals.Add(1)
	} else if a.Refusal.Kind == Budget {
		h.tally.budgetRefusals.Add(1)
	} else if a.Refusal.Kind == Provider {
		h.tally.providerRefusals.Add(1)
	}
	if !a.Admitted && a.Refusal.Floor > 0 {
		h.tally.floorRefusals.Add(1)
	}
	h.tally.crossings.Add(int64(len(Crossings(chain, a.Decision))))
	if h.redis == nil {
		return
	}
	r := pinned(h.redis, h.now)
	unread, cached := r.RefusedUnread(chain)
	ra, err := r.Admit(ctx, chain, reserve)
	h.must(err)
	if cached {
		h.tally.cached.Add(1)
	}
	switch {
	case !cached:
		if !sameAdmission(ra, a) {
			h.fail("Redis:      %s\nin-process: %s", describeAdmission(ra), describeAdmission(a))
		}
	case !sameAdmission(ra, unread):
		h.fail("Redis's admit answers from its cache %s, its refusedUnread %s", describeAdmission(ra), describeAdmission(unread))
	default:
		if got, want := withoutStoreCounts(ra), h.asCached(chain, a, ra.Limits); !sameAdmission(got, want) {
			h.fail("Redis's cache: %s\nin-process:    %s", describeAdmission(got), describeAdmission(want))
		}
	}
}

// asCached is a, the in-process store's answer to chain, as the refusal
// cache answers it from its refusals of sub: their counts, but those of
// token windows and slots (which the cache leaves to the store), and their
// refusal on requests windows and buckets.
func (h *alikeHistory) asCached(chain []Limit, a Admission, sub []Limit) Admission {
	cached := Admission{Decision: Decision{Now: a.Now}, Limits: sub}
	cacheable := make([]Limit, len(sub))
	for j, l := range sub {
		i := slices.IndexFunc(chain, func(c Limit) bool { return c.Prefix == l.Prefix })
		counts := a.Counts[i : i+1]
		if cacheable[j] = cachedCaps(l); RefusalOf(cacheable[j:j+1], Decision{Now: a.Now, Counts: counts}).First < 0 {
			h.fail("Redis's cache refuses %s, which the in-process store admits on requests and buckets", l.Scope)
		}
		cached.Counts = append(cached.Counts, counts[0])
	}
	cached.Refusal = RefusalOf(cacheable, cached.Decision)
	return withoutStoreCounts(cached)
}

// withoutStoreCounts is a with the counts that the refusal cache leaves to
// the store left out: those of token windows, the slots in flight, the
// budgets and the learned quotas.
func withoutStoreCounts(a Admission) Admission {
	a.Counts = slices.Clone(a.Counts)
	for i := range a.Counts {
		for k := range NumWindows {
			if k.Kind() != Requests {
				a.Counts[i].Window[k] = Window{}
			}
		}
		a.Counts[i].Slots = 0
		a.Counts[i].Spent, a.Counts[i].Reserved = [NumBudgetPeriods]int64{}, [NumBudgetPeriods]int64{}
		if a.Counts[i].extra != nil {
			a.Counts[i].ownExtra().Learned = LearnedCounts{}
		}
	}
	return a
}

// settle settles an open reservation: the usage reported replaces it in its
// buckets, more or less than it, or nothing at all (an upstream error). Now
// and then it settles one that the stores never admitted, in this minute or
// one of the two before: what it gives back may be more than its buckets
// hold, or out of its windows.
func (h *alikeHistory) settle() {
	var r reservation
	if len(h.open) > 0 && h.rng.IntN(4) > 0 {
		i := h.rng.IntN(len(h.open))
		r = h.open[i]
		h.open = slices.Delete(h.open, i, i+1)
	} else {
		reserved := randomReservation(h.rng)
		admitted := h.now - h.rng.Int64N(3*MinuteMillis)
		r = reservation{chain: h.chain(), decision: Decision{Now: MomentAt(admitted), Reserve: reserved}}
	}
	var used TokenCounts
	if h.rng.IntN(4) > 0 {
		used = randomUsage(h.rng)
	}
	c := Charge{Tokens: used.Minus(r.decision.Reserve)}.Settling(r.decision)
	c.Tokens.Cost = used.Cost
	h.tally.settlements.Add(1)
	h.log("settle %s admitted %v before by %+v", scopesOf(r.chain), time.Duration(h.now-r.decision.Now.UnixMillis)*time.Millisecond, c.Tokens)
	settle(h.t, pinned(h.memory, h.now), r.chain, c)
	if h.redis != nil {
		settle(h.t, pinned(h.redis, h.now), r.chain, c)
	}
}

// reset resets a limit of the pool on both stores: its windows and its
// bucket. The settlements of the reservations admitted before it, still
// open, then charge what they used.
func (h *alikeHistory) reset() {
	l := h.pool[h.rng.IntN(alikePool)]
	h.log("reset %s", l.Scope)
	h.tally.resets.Add(1)
	_, err := pinned(h.memory, h.now).Reset(context.Background(), l)
	h.must(err)
	if h.redis != nil {
		_, err := pinned(h.redis, h.now).Reset(context.Background(), l)
		h.must(err)
	}
}

// chargeUsage charges a response's usage to a chain, in the current
// buckets, as a realtime session does.
func (h *alikeHistory) chargeUsage() {
	chain, used := h.chain(), randomUsage(h.rng)
	h.log("record %s %+v", scopesOf(chain), used)
	settle(h.t, pinned(h.memory, h.now), chain, Charge{Tokens: used})
	if h.redis != nil {
		settle(h.t, pinned(h.redis, h.now), chain, Charge{Tokens: used})
	}
}

func (h *alikeHistory) peek() {
	if h.redis == nil {
		return // an admission compares the in-process store's peeks
	}
	chain := h.chain()
	h.log("peek %s", scopesOf(chain))
	m, err := pinned(h.memory, h.now).Peek(context.Background(), chain)
	h.must(err)
	r, err := pinned(h.redis, h.now).Peek(context.Background(), chain)
	h.must(err)
	if got, want := (Admission{Decision: r}), (Admission{Decision: m}); !sameAdmission(got, want) {
		h.fail("Redis peeks      %s\nin-process peeks %s", describeAdmission(got), describeAdmission(want))
	}
}

// free ends a request in flight: both stores free its slots, whether its
// lease is live or has lapsed. Both ledgers then count the requests still
// in flight.
func (h *alikeHistory) free() {
	if len(h.inFlight) == 0 {
		return
	}
	i := h.rng.IntN(len(h.inFlight))
	chain := h.inFlight[i]
	h.inFlight = slices.Delete(h.inFlight, i, i+1)
	h.log("free %s", scopesOf(chain))
	h.tally.frees.Add(1)
	for _, l := range chain {
		if l.Concurrent.Max > 0 && h.leaseEnds[h.poolIndex(l)] <= h.now {
			h.tally.lapsedFrees.Add(1)
			break
		}
	}
	pinned(h.memory, h.now).Free(chain)
	if h.redis != nil {
		freeAndWait(h.t, pinned(h.redis, h.now), chain)
	}
	h.checkLedgers()
}

// renew renews the slots each store holds, at the same moment: every
// concurrency cap then holds exactly a slot per request in flight that
// took one, for a lease, whether its lease had lapsed or not.
func (h *alikeHistory) renew() {
	h.log("renew")
	h.tally.renewals.Add(1)
	renewSlots(h.memory, h.now)
	if h.redis != nil {
		renewSlots(h.redis, h.now)
	}
	for i, l := range h.pool {
		if l.Concurrent.Max == 0 {
			continue
		}
		h.leaseEnds[i] = h.now + l.Concurrent.LeaseMillis
		want := h.holding(l)
		if n := inFlight(h.t, h.memory, []Limit{l}, 0, h.now); n != want {
			h.fail("the in-process store reads %d in flight of %s after a renewal, want the %d requests in flight", n, l.Scope, want)
		}
		if h.redis == nil {
			continue
		}
		if n := inFlight(h.t, h.redis, []Limit{l}, 0, h.now); n != want {
			h.fail("Redis reads %d in flight of %s after a renewal, want the %d requests in flight", n, l.Scope, want)
		}
	}
}

// checkLedgers checks that each store's ledger holds, of every concurrency
// cap of the pool, a slot per request in flight that took one.
func (h *alikeHistory) checkLedgers() {
	for _, l := range h.pool {
		if l.Concurrent.Max == 0 {
			continue
		}
		want := h.holding(l)
		if n := heldCount(h.memory.held, l.Prefix); n != want {
			h.fail("the in-process store's ledger holds %d slots of %s, want the %d requests in flight", n, l.Scope, want)
		}
		if h.redis == nil {
			continue
		}
		if n := heldCount(h.redis.held, l.Prefix); n != want {
			h.fail("Redis's ledger holds %d slots of %s, want the %d requests in flight", n, l.Scope, want)
		}
	}
}

// holding is how many requests in flight hold a slot of l.
func (h *alikeHistory) holding(l Limit) int64 {
	n := int64(0)
	for _, chain := range h.inFlight {
		if slices.ContainsFunc(chain, func(c Limit) bool { return c.Prefix == l.Prefix }) {
			n++
		}
	}
	return n
}

// leased notes that an admission of chain wrote its concurrency caps'
// slots now, for a lease, which never ends a live one's sooner.
func (h *alikeHistory) leased(chain []Limit) {
	for _, l := range chain {
		if l.Concurrent.Max > 0 {
			end := &h.leaseEnds[h.poolIndex(l)]
			*end = max(*end, h.now+l.Concurrent.LeaseMillis)
		}
	}
}

func (h *alikeHistory) poolIndex(l Limit) int {
	return slices.IndexFunc(h.pool, func(p Limit) bool { return p.Prefix == l.Prefix })
}

// tick moves the clocks on by milliseconds, seconds, minutes or hours, or
// onto the next minute or day boundary, onto the end of the lease of slots
// a limit last took or renewed (when that is still to come), or onto the
// end of a budget's period: its last millisecond before, the boundary, or
// the millisecond after.
func (h *alikeHistory) tick() {
	const dayMillis = dayMinutes * MinuteMillis
	if end := h.leaseEnds[h.rng.IntN(alikePool)]; end > h.now && h.rng.IntN(2) == 0 {
		h.now = max(h.now, end-1+h.rng.Int64N(3))
		h.log("tick onto a lease's end")
		return
	}
	if l := h.pool[h.rng.IntN(alikePool)]; l.Budgets.Calendar != nil && h.rng.IntN(2) == 0 {
		end := l.Budgets.Calendar.SpanAt(BudgetPeriod(h.rng.IntN(int(NumBudgetPeriods))), MomentAt(h.now)).End
		h.now = max(h.now, end-1+h.rng.Int64N(3))
		h.log("tick onto the end of %s's budget period", l.Scope)
		return
	}
	switch h.rng.IntN(6) {
	case 0:
		h.now += 1 + h.rng.Int64N(999)
	case 1:
		h.now += 1000 * (1 + h.rng.Int64N(59))
	case 2:
		h.now += MinuteMillis * (1 + h.rng.Int64N(59))
	case 3:
		h.now += 60 * MinuteMillis * (1 + h.rng.Int64N(23))
	case 4:
		h.now = (FloorDiv(h.now, MinuteMillis)+1)*MinuteMillis - 1 + h.rng.Int64N(3)
	case 5:
		h.now = (FloorDiv(h.now, dayMillis)+1)*dayMillis - 1 + h.rng.Int64N(3)
	}
	h.log("tick")
}

// sameAdmission reports whether a and b are the same answer: the same
// decision, on the same limits, and the same refusal.
func sameAdmission(a, b Admission) bool {
	return a.Admitted == b.Admitted && a.Now == b.Now && a.Reserve == b.Reserve && slices.EqualFunc(a.Counts, b.Counts, sameCounts) &&
		slices.EqualFunc(a.Limits, b.Limits, func(l, m Limit) bool { return l.Prefix == m.Prefix }) && a.Refusal == b.Refusal
}

// sameCounts is whether a and b hold the same counts, their extra counts
// compared by value.
func sameCounts(a, b Counts) bool {
	ae, be := *a.Extra(), *b.Extra()
	a.extra, b.extra = nil, nil
	return a == b && ae == be
}

// describeAdmission is everything a store answers to an admission.
func describeAdmission(a Admission) string {
	return fmt.Sprintf("%s now=%d limits=%v refusal=%+v", describeDecision(a.Decision), a.Now.UnixMillis, scopesOf(a.Limits), a.Refusal)
}

// scopesOf names the limits of chain: within a history, their scopes.
func scopesOf(chain []Limit) []string {
	scopes := make([]string, len(chain))
	for i, l := range chain {
		scopes[i] = l.Scope
	}
	return scopes
}
