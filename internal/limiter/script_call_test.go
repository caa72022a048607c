package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/coalesce"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// One call decides its admissions in arrival order, each as if sent alone:
// a refused one charges nothing, and each reads what those before it charged.
func TestBatchedAdmissionsAreDecidedInArrivalOrderEachAllOrNothing(t *testing.T) {
	s := newTestRedisStore(t, redistest.EnvURL(t))
	at := pinnedBase() + 1000
	org := newLimit("org", redistest.UniqueID(t), 2, 0)
	k1 := newBucketLimit(t, "key", redistest.UniqueID(t), "1", 1, 0)
	k2, k3 := newLimit("key", redistest.UniqueID(t), 5, 0), newLimit("key", redistest.UniqueID(t), 5, 0)
	var c scriptCall
	for _, chain := range [][]Limit{{k1, org}, {k1, org}, {k2, org}, {k3, org}} {
		if !c.add(chain, TokenCounts{}) {
			t.Fatal("a chain was refused by the call")
		}
	}
	if len(c.limits) != 4 {
		t.Fatalf("%d distinct limits in the call, want 4 (k1, org, k2, k3)", len(c.limits))
	}
	ds, _, err := pinned(s, at).call(context.Background(), &c, false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i, d := range ds {
		line := fmt.Sprintf("%v org=%d", d.Admitted, d.Counts[1].Window[RPM].Cur)
		if i < 2 {
			line += fmt.Sprintf(" k1-bucket-down=%d", d.Counts[0].Deficit/MicroTokens)
		}
		got = append(got, line)
	}
	want := []string{
		"true org=0 k1-bucket-down=0",  // k1's bucket full, the org empty
		"false org=1 k1-bucket-down=1", // k1's bucket of 1 is empty now
		"true org=1",                   // the refusal above charged the org nothing
		"false org=2",                  // the org's rpm 2 is full
	}
	if !slices.Equal(got, want) {
		t.Fatalf("decisions\n%q\nwant\n%q", got, want)
	}
	count := redisKit(redistest.EnvURL(t)).count
	if n := count(t, s, org.Prefix, RPM, at/MinuteMillis); n != 2 {
		t.Fatalf("org charged %d, want the 2 admitted", n)
	}
	if n := count(t, s, k3.Prefix, RPM, at/MinuteMillis); n != 0 {
		t.Fatalf("the refused k3 was charged %d", n)
	}
}

// Concurrent admissions through the coalescer each get their own decision:
// under rpm 5, the five admitted read 0 to 4 requests, one each.
func TestCoalescedAdmissionsEachReadTheCountsTheirTurnLeft(t *testing.T) {
	s := newTestRedisStore(t, redistest.EnvURL(t))
	at := pinnedBase() + 1000
	org := newLimit("org", redistest.UniqueID(t), 5, 0)
	var mu sync.Mutex
	var seen []int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			chain := []Limit{newLimit("key", fmt.Sprintf("%s-%d", org.ID, i), 100, 0), org}
			d, err := pinned(s, at).Admit(context.Background(), chain, TokenCounts{})
			if err != nil {
				t.Error(err)
				return
			}
			if d.Admitted {
				mu.Lock()
				seen = append(seen, d.Counts[1].Window[RPM].Cur)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	slices.Sort(seen)
	if !slices.Equal(seen, []int64{0, 1, 2, 3, 4}) {
		t.Fatalf("the admitted read the org's count as %v, want 0 to 4 once each", seen)
	}
}

// An admission whose waiter gives up once the coalescer has put it in a
// call (its client went away, or its timeout passed) may still be admitted
// by that call, for no one: its slots are then freed, not held, and renewed,
// for as long as the store lives. Here a call in flight keeps the admission
// waiting, the next call takes it, and its waiter gives up before that call
// is sent.
func TestAnAdmissionWhoseWaiterGaveUpInItsCallHoldsNoSlot(t *testing.T) {
	s := newTestRedisStoreOf(t, &RedisDeployment{URL: redistest.EnvURL(t)}, time.Minute) // no waiter times out
	at := pinnedBase() + 1000
	first := []Limit{newLimit("key", redistest.UniqueID(t), 100, 0)}
	gaveUp := []Limit{newSlotLimit("key", redistest.UniqueID(t), 5, 0, 3*time.Second)}
	firstSent, releaseFirst, gaveUpSent := make(chan struct{}), make(chan struct{}), make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	waiting := &noticedContext{Context: ctx, waits: make(chan struct{})}
	returned := make(chan error, 1)
	s.calls = coalesce.New(callsInFlight, chargeLinger, func(item *scriptItem) coalesce.Batch[*scriptItem] {
		b := &scriptBatch{store: s}
		b.Add(item)
		admits := func(chain []Limit) bool {
			return slices.ContainsFunc(b.items, func(i *scriptItem) bool { return i.answer != nil && i.chain[0].Prefix == chain[0].Prefix })
		}
		return hookedBatch{b, func() {
			switch {
			case admits(first):
				close(firstSent)
				<-releaseFirst
			case admits(gaveUp):
				cancel()
				if err := <-returned; err == nil {
					t.Error("the admission answered after its waiter gave up")
				}
				defer close(gaveUpSent)
			}
			b.Send()
		}}
	})
	firstDone := make(chan error, 1)
	go func() {
		_, err := pinned(s, at).Admit(context.Background(), first, TokenCounts{})
		firstDone <- err
	}()
	<-firstSent // the call slot is taken
	go func() {
		_, err := s.Admit(waiting, gaveUp, TokenCounts{})
		returned <- err
	}()
	<-waiting.waits // the admission waits for the next call
	close(releaseFirst)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	<-gaveUpSent
	// What the call freed rides in the store's next calls: a charge that
	// rides after it is done once it is.
	done := make(chan error, 1)
	s.calls.Ride(&scriptItem{chain: first, done: func(err error) { done <- err }})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := heldCount(s.held, gaveUp[0].Prefix); n != 0 {
		t.Fatalf("the store's ledger holds %d slots of an admission nobody waited for, to renew for ever", n)
	}
	if n := inFlight(t, s, gaveUp, 0, at); n != 0 {
		t.Fatalf("Redis holds %d slots of an admission nobody waited for", n)
	}
}

// noticedContext notices when its Done is first asked for: the coalescer
// asks only once an admission waits in line.
type noticedContext struct {
	context.Context
	once  sync.Once
	waits chan struct{}
}

func (c *noticedContext) Done() <-chan struct{} {
	c.once.Do(func() { close(c.waits) })
	return c.Context.Done()
}

// hookedBatch is a call whose Send is send, which makes the call itself.
type hookedBatch struct {
	*scriptBatch
	send func()
}

func (b hookedBatch) Send() { b.send() }

func TestCallRefusesAChainWhoseCountersItHoldsUnderOtherCaps(t *testing.T) {
	var c scriptCall
	c.add([]Limit{newLimit("key", "a", 5, 0), newLimit("org", "o", 10, 0)}, TokenCounts{})
	if c.add([]Limit{newLimit("key", "b", 5, 0), newLimit("org", "o", 20, 0)}, TokenCounts{}) {
		t.Fatal("joined a call that holds the org's counters under rpm 10 with rpm 20")
	}
	if !c.add([]Limit{newLimit("key", "b", 5, 0), newLimit("org", "o", 10, 0)}, TokenCounts{}) {
		t.Fatal("refused a chain with the same caps")
	}
	many := make([]Limit, MaxCallLimits)
	for i := range many {
		many[i] = newLimit("s", fmt.Sprint(i), 1, 0)
	}
	if c.add(many, TokenCounts{}) {
		t.Fatal("joined a call past 255 distinct limits")
	}
}

// Concurrent token charges coalesce into calls that sum them per key: the org
// holds every response's tokens exactly once, each key its own.
func TestCoalescedTokenChargesAddUpExactly(t *testing.T) {
	url := redistest.EnvURL(t)
	s := newTestRedisStore(t, url)
	at := pinnedBase() + 1000
	org := newLimit("org", redistest.UniqueID(t), 0, MaxCap)
	keys := make([]Limit, 50)
	var wg sync.WaitGroup
	for i := range keys {
		keys[i] = newLimit("key", fmt.Sprintf("%s-%d", org.ID, i), 0, 1<<40)
		wg.Add(1)
		go func() {
			defer wg.Done()
			settle(t, pinned(s, at), []Limit{keys[i], org}, Charge{Tokens: totalTokens(int64(i + 1))})
		}()
	}
	wg.Wait()
	count := redisKit(url).count
	if n := count(t, s, org.Prefix, TPM, at/MinuteMillis); n != 50*51/2 {
		t.Fatalf("org holds %d tokens, want %d", n, 50*51/2)
	}
	for i, k := range keys {
		if n := count(t, s, k.Prefix, TPM, at/MinuteMillis); n != int64(i+1) {
			t.Fatalf("key %d holds %d tokens, want %d", i, n, i+1)
		}
	}
}

// A call of many admissions decides each exactly as it would have been
// decided alone, one call after another: the same answers, each reading the
// same counts, and the same counters after. Twin limits (the same caps under
// other ids) get the same history, then the same admissions, batched on one
// side and one by one on the other; caps, histories and chains are random,
// with windows, token windows, buckets, caps on requests in flight and
// learned quotas (the history's reports), and floors, whose classes the
// history's requests mix and each limit of the batch has one of, with and
// without reservations. The history's admitted requests hold slots,
// some of whose leases have lapsed by the batch; the batch carries frees of
// some of them and token charges of responses among its admissions, in any
// order, which the call makes before its admissions read, as one by one
// they are made first. Both sides' ledgers then hold the same slots. The
// trials share one batch, emptied after each call as the store empties the
// batches it reuses: a reused batch decides as a new one.
func TestABatchDecidesExactlyAsItsAdmissionsOneByOne(t *testing.T) {
	s := newTestRedisStore(t, redistest.EnvURL(t))
	ctx := context.Background()
	batch := &scriptBatch{}
	var admissions, readSlots, slotRefusals, readLearned, providerRefusals, readFloors, floorRefusals, frees int
	check := func(err error) { // a charge's or a free's outcome
		if err != nil {
			t.Error(err)
		}
	}
	for trial := range 40 {
		rng := rand.New(rand.NewPCG(uint64(trial), 8))
		base := pinnedBase()
		at := base + 1000 + rng.Int64N(58000)
		id := redistest.UniqueID(t)
		var sideA, sideB []Limit
		for i := range 5 {
			caps := randomCaps(t, rng)
			if i == 0 && caps.Concurrent.Max == 0 {
				// A cap on requests in flight in every trial, small
				// enough for a batch to fill.
				caps.Concurrent = concurrencyCap{Max: 1 + rng.Int64N(2), LeaseMillis: 3000 + rng.Int64N(3001)}
			}
			if i == 1 && caps.Floors[0] == 0 { // and floors, whose classes a batch may not mix
				caps.Floors = randomFloors(rng)
			}
			sideA = append(sideA, NewLimit("", fmt.Sprint("s", i), id+"a", caps))
			sideB = append(sideB, NewLimit("", fmt.Sprint("s", i), id+"b", caps))
		}
		// chain picks 1 to 3 of the limits, in any order, on both sides,
		// each of a random class of its floors (if it has floors) before
		// the batch, and of one in it (a call holds one class of a limit).
		inBatch := false
		var batchClass [5]uint8
		for i, l := range sideA {
			batchClass[i] = uint8(rng.IntN(l.NumFloors() + 1))
		}
		chain := func() (a, b []Limit) {
			for _, i := range randomChain(rng, len(sideA), 3) {
				class := batchClass[i]
				if !inBatch {
					class = uint8(rng.IntN(sideA[i].NumFloors() + 1))
				}
				la, lb := sideA[i], sideB[i]
				la.Class, lb.Class = class, class
				a, b = append(a, la), append(b, lb)
			}
			return a, b
		}
		// The requests in flight on each side, twins at the same index:
		// admitted chains holding slots, not yet freed.
		var heldA, heldB [][]Limit
		// The same history on both sides: admissions and token charges in
		// the previous minute, then in this one before at, then within 8 s
		// of at, whose slots' leases (3 to 6 s) may still run at at.
		earlier := base + rng.Int64N(at-base)
		for _, when := range []int64{base - 60000 + rng.Int64N(60000), earlier, max(earlier, at-rng.Int64N(8000))} {
			for range rng.IntN(8) {
				a, b := chain()
				da, errA := pinned(s, when).Admit(ctx, a, TokenCounts{})
				db, errB := pinned(s, when).Admit(ctx, b, TokenCounts{})
				if errA != nil || errB != nil {
					t.Fatal(errA, errB)
				}
				if da.Admitted != db.Admitted {
					t.Fatalf("trial %d: twin admissions of the history decided %v and %v", trial, da.Admitted, db.Admitted)
				}
				if da.Admitted && HoldsSlots(a) {
					heldA, heldB = append(heldA, a), append(heldB, b)
				}
			}
			for range rng.IntN(4) {
				a, b := chain()
				tokens := randomUsage(rng)
				for _, c := range [][]Limit{a, b} {
					settle(t, pinned(s, when), c, Charge{Tokens: tokens})
				}
			}
			for range rng.IntN(3) { // what the provider said of its quota
				a, b := chain()
				r := randomReport(rng, when)
				learnOrFail(t, s, a, r)
				learnOrFail(t, s, b, r)
			}
		}
		// Every other trial reserves: some admissions reserve input and
		// output tokens on their token windows (up to past the caps), some
		// none. Frees of requests of the history and token charges ride
		// among them. The batch is one call, as the coalescer makes it.
		for range rng.IntN(3) { // and just before the batch
			a, b := chain()
			r := randomReport(rng, at)
			learnOrFail(t, s, a, r)
			learnOrFail(t, s, b, r)
		}
		batch.store = pinned(s, at)
		inBatch = true
		var items []*scriptItem
		var alone [][]Limit
		var reserves []TokenCounts
		var freedB, chargedB [][]Limit
		var charges []Charge
		for range 1 + rng.IntN(12) {
			switch n := rng.IntN(6); {
			case n == 0 && len(heldA) > 0:
				i := rng.IntN(len(heldA))
				items = append(items, &scriptItem{chain: heldA[i], free: true, done: func(err error) { s.Release(); check(err) }})
				freedB = append(freedB, heldB[i])
				heldA, heldB = slices.Delete(heldA, i, i+1), slices.Delete(heldB, i, i+1)
			case n == 1:
				a, b := chain()
				c := Charge{Tokens: randomUsage(rng)}
				items = append(items, &scriptItem{chain: a, charge: c, done: check})
				chargedB, charges = append(chargedB, b), append(charges, c)
			default:
				a, b := chain()
				var reserve TokenCounts
				if trial%2 == 1 && rng.IntN(3) > 0 {
					reserve = randomReservation(rng)
				}
				items = append(items, &scriptItem{chain: a, reserve: reserve, answer: make(chan scriptAnswer, 1)})
				alone, reserves = append(alone, b), append(reserves, reserve)
			}
		}
		for _, item := range items {
			if !batch.Add(item) {
				t.Fatal("an item was refused by the call")
			}
		}
		batch.Send()
		batch.reset()
		for i, c := range chargedB {
			settle(t, pinned(s, at), c, charges[i])
		}
		for _, c := range freedB {
			freeAndWait(t, pinned(s, at), c)
		}
		m := 0
		for _, item := range items {
			if item.answer == nil {
				continue
			}
			batched := <-item.answer
			if batched.err != nil {
				t.Fatal(batched.err)
			}
			d, err := pinned(s, at).run(ctx, alone[m], reserves[m], false)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := describeDecision(batched.d), describeDecision(d); got != want {
				t.Fatalf("trial %d, admission %d of %d: batched %s, alone %s", trial, m, len(alone), got, want)
			}
			if d.Admitted && HoldsSlots(alone[m]) {
				heldA, heldB = append(heldA, item.chain), append(heldB, alone[m])
			}
			if !d.Admitted && RefusalOf(alone[m], d).UntilFreed {
				slotRefusals++
			}
			if slices.ContainsFunc(d.Counts, func(c Counts) bool { return c.Slots > 0 }) {
				readSlots++
			}
			if slices.ContainsFunc(d.Counts, func(c Counts) bool { return c.Extra().Learned != LearnedCounts{} }) {
				readLearned++
			}
			if !d.Admitted && RefusalOf(alone[m], d).Kind == Provider {
				providerRefusals++
			}
			if slices.ContainsFunc(d.Counts, func(c Counts) bool { return c.Extra().Floors.Held != [FloorShares]int64{} }) {
				readFloors++
			}
			if !d.Admitted && RefusalOf(alone[m], d).Floor > 0 {
				floorRefusals++
			}
			m++
		}
		admissions, frees = admissions+len(alone), frees+len(freedB)
		for i := range sideA { // what each side holds after
			da, errA := pinned(s, at).Peek(ctx, sideA[i:i+1])
			db, errB := pinned(s, at).Peek(ctx, sideB[i:i+1])
			if errA != nil || errB != nil {
				t.Fatal(errA, errB)
			}
			if got, want := describeDecision(da), describeDecision(db); got != want {
				t.Fatalf("trial %d, limit %d after: batched side %s, one-by-one side %s", trial, i, got, want)
			}
			if a, b := heldCount(s.held, sideA[i].Prefix), heldCount(s.held, sideB[i].Prefix); a != b {
				t.Fatalf("trial %d, limit %d after: the ledger holds %d slots on the batched side, %d on the other", trial, i, a, b)
			}
		}
		// The requests still in flight end: the store holds itself open
		// for their frees.
		if held := append(heldA, heldB...); len(held) > 0 {
			for _, c := range held[1:] {
				s.Free(c)
			}
			freeAndWait(t, s, held[0]) // and waits for the others, which ride before
		}
	}
	t.Logf("%d admissions batched, %d of them reading slots in flight, %d refused for want of one, %d reading a learned quota, %d refused by one, %d reading what floors hold, %d refused for a floor; %d frees batched",
		admissions, readSlots, slotRefusals, readLearned, providerRefusals, readFloors, floorRefusals, frees)
}

// The store reuses its batches, each emptied after its call: a call made
// with a reused batch decides, charges and frees as one made with a new
// batch, whatever the last call held. Twin limits, the same caps under two
// ids, go in a batch reused call after call on one side and in a new batch
// each call on the other. An org's limit, shared by most chains, takes
// another position in each call; each call also charges a finished
// response's tokens and frees the oldest request holding one of the org's
// slots; the later admissions are refused for the org's slots and rpm.
func TestAReusedBatchDecidesAsANewOne(t *testing.T) {
	s := newTestRedisStore(t, redistest.EnvURL(t))
	at := pinnedBase() + 1000
	outcome := func(err error) {
		if err != nil {
			t.Error(err)
		}
	}
	freed := func(err error) { s.Release(); outcome(err) }
	type side struct {
		limits []Limit
		held   [][]Limit // admitted chains holding a slot of the org, not yet freed
	}
	sideOf := func(id string) *side {
		sd := &side{}
		for i := range 4 {
			sd.limits = append(sd.limits, newLimit(fmt.Sprint("s", i), id, 4, 1000))
		}
		sd.limits = append(sd.limits, newSlotLimit("org", id, 3, 6, time.Minute))
		return sd
	}
	sides := [2]*side{sideOf(redistest.UniqueID(t)), sideOf(redistest.UniqueID(t))}
	reused := &scriptBatch{}
	for call, chains := range [][][]int{{{0, 4}, {1, 4}}, {{4, 2}, {3}, {4, 0}}, {{2, 4, 1}, {4}, {3, 4}}} {
		reused.store = pinned(s, at)
		batches := [2]*scriptBatch{reused, {store: pinned(s, at)}}
		var items [][2]*scriptItem
		for _, positions := range chains {
			var pair [2]*scriptItem
			for i, sd := range sides {
				var chain []Limit
				for _, p := range positions {
					chain = append(chain, sd.limits[p])
				}
				pair[i] = &scriptItem{chain: chain, answer: make(chan scriptAnswer, 1)}
				if !batches[i].Add(pair[i]) {
					t.Fatalf("call %d: an admission was refused by its call", call)
				}
			}
			items = append(items, pair)
		}
		for i, sd := range sides {
			batches[i].Add(&scriptItem{chain: []Limit{sd.limits[call], sd.limits[4]}, charge: Charge{Tokens: TokenCounts{Total: 70 + int64(call)}}, done: outcome})
			if len(sd.held) > 0 {
				batches[i].Add(&scriptItem{chain: sd.held[0], free: true, done: freed})
				sd.held = sd.held[1:]
			}
		}
		reused.Send()
		reused.reset()
		batches[1].Send()
		for m, pair := range items {
			a, b := <-pair[0].answer, <-pair[1].answer
			if a.err != nil || b.err != nil {
				t.Fatal(a.err, b.err)
			}
			if got, want := describeDecision(a.d), describeDecision(b.d); got != want {
				t.Fatalf("call %d, admission %d: the reused batch decided %s, a new one %s", call, m, got, want)
			}
			if a.d.Admitted && HoldsSlots(pair[0].chain) {
				for i, sd := range sides {
					sd.held = append(sd.held, pair[i].chain)
				}
			}
		}
	}
	for _, sd := range sides {
		for _, chain := range sd.held {
			freeAndWait(t, s, chain)
		}
	}
}

func describeDecision(d Decision) string {
	counts := make([]string, len(d.Counts))
	for i, c := range d.Counts {
		extra := c.extra
		c.extra = nil
		if counts[i] = fmt.Sprintf("%+v", c); extra != nil {
			counts[i] += fmt.Sprintf(" extra=%+v", *extra)
		}
	}
	return fmt.Sprintf("admitted=%v reserve=%d counts=%v", d.Admitted, d.Reserve, counts)
}
