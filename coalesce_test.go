package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// One call decides its admissions in arrival order, each as if sent alone:
// a refused one charges nothing, and each reads what those before it charged.
func TestBatchedAdmissionsAreDecidedInArrivalOrderEachAllOrNothing(t *testing.T) {
	s := newTestRedisStore(t, redisURLFromEnv(t))
	at := pinnedBase() + 1000
	org := newLimit("org", uniqueID(t), 2, 0)
	k1 := newBucketLimit(t, "key", uniqueID(t), "1", 1, 0)
	k2, k3 := newLimit("key", uniqueID(t), 5, 0), newLimit("key", uniqueID(t), 5, 0)
	var c scriptCall
	for _, chain := range [][]limit{{k1, org}, {k1, org}, {k2, org}, {k3, org}} {
		if !c.add(chain) {
			t.Fatal("a chain was refused by the call")
		}
	}
	if len(c.limits) != 4 {
		t.Fatalf("%d distinct limits in the call, want 4 (k1, org, k2, k3)", len(c.limits))
	}
	ds, _, err := s.call(context.Background(), &c, at, false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i, d := range ds {
		line := fmt.Sprintf("%v org=%d", d.admitted, d.counts[1].req.cur)
		if i < 2 {
			line += fmt.Sprintf(" k1-bucket-down=%d", d.counts[0].deficit/microTokens)
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
	count := redisKit(redisURLFromEnv(t)).count
	if n := count(t, s, org.prefix, requests, at/bucketMillis); n != 2 {
		t.Fatalf("org charged %d, want the 2 admitted", n)
	}
	if n := count(t, s, k3.prefix, requests, at/bucketMillis); n != 0 {
		t.Fatalf("the refused k3 was charged %d", n)
	}
}

// Concurrent admissions through the coalescer each get their own decision:
// under rpm 5, the five admitted read 0 to 4 requests, one each.
func TestCoalescedAdmissionsEachReadTheCountsTheirTurnLeft(t *testing.T) {
	s := newTestRedisStore(t, redisURLFromEnv(t))
	at := pinnedBase() + 1000
	org := newLimit("org", uniqueID(t), 5, 0)
	var mu sync.Mutex
	var seen []int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			chain := []limit{newLimit("key", fmt.Sprintf("%s-%d", org.id, i), 100, 0), org}
			d, err := s.admit(context.Background(), chain, at)
			if err != nil {
				t.Error(err)
				return
			}
			if d.admitted {
				mu.Lock()
				seen = append(seen, d.counts[1].req.cur)
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

func TestCallRefusesAChainWhoseCountersItHoldsUnderOtherCaps(t *testing.T) {
	var c scriptCall
	c.add([]limit{newLimit("key", "a", 5, 0), newLimit("org", "o", 10, 0)})
	if c.add([]limit{newLimit("key", "b", 5, 0), newLimit("org", "o", 20, 0)}) {
		t.Fatal("joined a call that holds the org's counters under rpm 10 with rpm 20")
	}
	if !c.add([]limit{newLimit("key", "b", 5, 0), newLimit("org", "o", 10, 0)}) {
		t.Fatal("refused a chain with the same caps")
	}
	many := make([]limit, maxCallLimits)
	for i := range many {
		many[i] = newLimit("s", fmt.Sprint(i), 1, 0)
	}
	if c.add(many) {
		t.Fatal("joined a call past 255 distinct limits")
	}
}

// Concurrent token charges coalesce into calls that sum them per key: the org
// holds every response's tokens exactly once, each key its own.
func TestCoalescedTokenChargesAddUpExactly(t *testing.T) {
	url := redisURLFromEnv(t)
	s := newTestRedisStore(t, url)
	at := pinnedBase() + 1000
	org := newLimit("org", uniqueID(t), 0, 1<<40)
	keys := make([]limit, 50)
	var wg sync.WaitGroup
	for i := range keys {
		keys[i] = newLimit("key", fmt.Sprintf("%s-%d", org.id, i), 0, 1<<40)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.recordTokens(context.Background(), []limit{keys[i], org}, int64(i+1), at); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	count := redisKit(url).count
	if n := count(t, s, org.prefix, tokens, at/bucketMillis); n != 50*51/2 {
		t.Fatalf("org holds %d tokens, want %d", n, 50*51/2)
	}
	for i, k := range keys {
		if n := count(t, s, k.prefix, tokens, at/bucketMillis); n != int64(i+1) {
			t.Fatalf("key %d holds %d tokens, want %d", i, n, i+1)
		}
	}
}

// recordingBatch is a call of ints whose send waits for release, and records
// what each call held.
type recordingBatch struct {
	r     *callRecorder
	items []int
}

type callRecorder struct {
	mu      sync.Mutex
	calls   [][]int
	release chan struct{} // nil: send returns at once
	full    int           // add refuses an item once a call holds this many; 0: never
	answers map[int]chan int
}

// answerFor is where the calls answer item.
func (r *callRecorder) answerFor(item int) chan int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answers == nil {
		r.answers = make(map[int]chan int)
	}
	r.answers[item] = make(chan int, 1)
	return r.answers[item]
}

func (r *callRecorder) start(first int) batch[int] { return &recordingBatch{r: r, items: []int{first}} }

func (b *recordingBatch) add(item int) bool {
	if b.r.full > 0 && len(b.items) == b.r.full {
		return false
	}
	b.items = append(b.items, item)
	return true
}

func (b *recordingBatch) send() {
	b.r.mu.Lock()
	b.r.calls = append(b.r.calls, b.items)
	release := b.r.release
	b.r.mu.Unlock()
	if release != nil && b.items[0] == 0 {
		<-release // the first call stays in flight until the test releases it
	}
	b.r.mu.Lock()
	for _, item := range b.items {
		b.r.answers[item] <- item
	}
	b.r.mu.Unlock()
}

func (r *callRecorder) recorded() [][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// submit awaits item in a goroutine, and returns once the item's call is
// made or the item waits behind n others; done is called when it returns.
func submit(q *coalescer[int], r *callRecorder, item int, ctx context.Context, n int, done func(answered bool)) {
	calls := len(r.recorded())
	answer := r.answerFor(item)
	go func() {
		got, err := await(ctx, q, item, answer, time.Hour)
		done(err == nil && got == item)
	}()
	for len(r.recorded()) == calls {
		q.mu.Lock()
		w := len(q.waiting)
		q.mu.Unlock()
		if w == n+1 {
			return
		}
		runtime.Gosched()
	}
}

// submitAll submits items one after another, each once the one before it
// waits, behind n others, so that their arrival order is known.
func submitAll(t *testing.T, q *coalescer[int], r *callRecorder, items []int, n int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i, item := range items {
		wg.Add(1)
		submit(q, r, item, context.Background(), n+i, func(answered bool) {
			if !answered {
				t.Errorf("item %d was not answered by its call", item)
			}
			wg.Done()
		})
	}
	return &wg
}

// waitIdle returns once no call is in flight and nothing waits: the last
// caller hands nothing on.
func waitIdle(q *coalescer[int]) {
	for {
		q.mu.Lock()
		idle := q.calls == 0 && len(q.waiting) == 0 && len(q.riders) == 0
		q.mu.Unlock()
		if idle {
			return
		}
		runtime.Gosched()
	}
}

// A lone request makes its call in its own goroutine, at once.
func TestLoneSubmissionMakesItsCallItself(t *testing.T) {
	r := &callRecorder{}
	q := newCoalescer(1, time.Hour, r.start)
	if got, err := await(context.Background(), q, 7, r.answerFor(7), time.Hour); err != nil || got != 7 {
		t.Fatalf("await = %d, %v", got, err)
	}
	if calls := r.recorded(); !slices.EqualFunc(calls, [][]int{{7}}, slices.Equal) {
		t.Fatalf("calls %v, want one call of the lone item, made before await returned", calls)
	}
}

// Items that arrive while every call is in flight go in the next call, in
// arrival order, up to what a call can hold; the rest go in the call after.
func TestItemsWaitingOnABusyCallGoInTheNextCallsInArrivalOrder(t *testing.T) {
	r := &callRecorder{release: make(chan struct{}), full: 3}
	q := newCoalescer(1, time.Hour, r.start)
	first := submitAll(t, q, r, []int{0}, 0) // in flight until released
	rest := submitAll(t, q, r, []int{1, 2, 3, 4, 5}, 0)
	close(r.release)
	first.Wait()
	rest.Wait()
	want := [][]int{{0}, {1, 2, 3}, {4, 5}}
	if calls := r.recorded(); !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("calls %v, want %v", calls, want)
	}
	waitIdle(q)
}

// A waiter whose context ends before a call takes it is in no call, and the
// items around it are still sent: the first waiting leads the next call and
// takes the others.
func TestAnItemThatGaveUpWaitingIsInNoCallAndTheRestAreSent(t *testing.T) {
	r := &callRecorder{release: make(chan struct{})}
	q := newCoalescer(1, time.Hour, r.start)
	first := submitAll(t, q, r, []int{0}, 0)
	before := submitAll(t, q, r, []int{1}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan bool, 1)
	submit(q, r, 2, ctx, 1, func(answered bool) { gaveUp <- !answered })
	after := submitAll(t, q, r, []int{3}, 2)
	cancel()
	if !<-gaveUp {
		t.Fatal("await answered an item whose context ended while it waited")
	}
	close(r.release)
	first.Wait()
	before.Wait()
	after.Wait()
	want := [][]int{{0}, {1, 3}}
	if calls := r.recorded(); !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("calls %v, want %v", calls, want)
	}
	waitIdle(q)
}

// A token charge takes no call of its own while calls come: it rides in the
// next one, made by an admission; with no other traffic a call is made for it
// once the linger is over.
func TestARiderGoesInTheNextCallAndAloneOnlyAfterTheLinger(t *testing.T) {
	r := &callRecorder{}
	q := newCoalescer(1, time.Hour, r.start)
	rider := r.answerFor(100)
	q.ride(100)
	if calls := r.recorded(); len(calls) != 0 {
		t.Fatalf("calls %v before any admission: a rider made its own", calls)
	}
	if _, err := await(context.Background(), q, 1, r.answerFor(1), time.Hour); err != nil {
		t.Fatal("admission not answered")
	}
	if got := <-rider; got != 100 {
		t.Fatalf("rider answered %d", got)
	}
	if calls := r.recorded(); !slices.EqualFunc(calls, [][]int{{1, 100}}, slices.Equal) {
		t.Fatalf("calls %v, want the admission's call carrying the rider", calls)
	}

	alone := &callRecorder{}
	q = newCoalescer(1, time.Millisecond, alone.start)
	rider = alone.answerFor(200)
	q.ride(200)
	if got := <-rider; got != 200 {
		t.Fatalf("rider answered %d", got)
	}
	if calls := alone.recorded(); !slices.EqualFunc(calls, [][]int{{200}}, slices.Equal) {
		t.Fatalf("calls %v, want a call of the rider's own", calls)
	}
	waitIdle(q)
}

// A rider behind a call in flight, with nothing else coming, is sent after
// that call: by the flush, which leaves the riders for a later look while
// every call is in flight.
func TestARiderBehindABusyCallIsSentAfterIt(t *testing.T) {
	r := &callRecorder{release: make(chan struct{})}
	q := newCoalescer(1, time.Millisecond, r.start)
	first := submitAll(t, q, r, []int{0}, 0) // in flight until released
	rider := r.answerFor(300)
	q.ride(300)
	close(r.release)
	first.Wait()
	if got := <-rider; got != 300 {
		t.Fatalf("rider answered %d", got)
	}
	if calls := r.recorded(); !slices.EqualFunc(calls, [][]int{{0}, {300}}, slices.Equal) {
		t.Fatalf("calls %v, want the busy call, then the rider's", calls)
	}
	waitIdle(q)
}

// A waiter whose call does not come within its timeout gives up with
// context.DeadlineExceeded, and is in no call.
func TestAWaiterGivesUpAfterItsTimeout(t *testing.T) {
	r := &callRecorder{release: make(chan struct{})}
	q := newCoalescer(1, time.Hour, r.start)
	first := submitAll(t, q, r, []int{0}, 0)
	if _, err := await(context.Background(), q, 1, r.answerFor(1), time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("await behind a busy call: %v, want context.DeadlineExceeded", err)
	}
	close(r.release)
	first.Wait()
	waitIdle(q)
	if calls := r.recorded(); !slices.EqualFunc(calls, [][]int{{0}}, slices.Equal) {
		t.Fatalf("calls %v, want only the first", calls)
	}
}

// A call of many admissions decides each exactly as it would have been
// decided alone, one call after another: the same answers, each reading the
// same counts, and the same counters after. Twin limits (the same caps under
// other ids) get the same history, then the same admissions, batched on one
// side and one by one on the other; caps, histories and chains are random,
// with windows, token windows and buckets.
func TestABatchDecidesExactlyAsItsAdmissionsOneByOne(t *testing.T) {
	s := newTestRedisStore(t, redisURLFromEnv(t))
	ctx := context.Background()
	for trial := range 40 {
		rng := rand.New(rand.NewPCG(uint64(trial), 8))
		base := pinnedBase()
		at := base + 1000 + rng.Int64N(58000)
		id := uniqueID(t)
		var sideA, sideB []limit
		for i := range 5 {
			lc := LimitConfig{Scope: fmt.Sprint("s", i)}
			if rng.IntN(10) < 7 {
				lc.RPM = 1 + rng.Int64N(6)
			}
			if rng.IntN(2) == 0 {
				lc.TPM = 20 + rng.Int64N(180)
			}
			if rng.IntN(10) < 4 {
				lc.Rate = json.Number([]string{"0.5", "1", "2.5"}[rng.IntN(3)])
				lc.Burst = 1 + rng.Int64N(4)
				lc.Cost = 1 + rng.Int64N(lc.Burst)
			}
			if lc.RPM == 0 && lc.TPM == 0 && lc.Rate == "" {
				lc.RPM = 3
			}
			caps, err := lc.caps()
			if err != nil {
				t.Fatal(err)
			}
			sideA = append(sideA, newTaggedLimit("", lc.Scope, id+"a", caps))
			sideB = append(sideB, newTaggedLimit("", lc.Scope, id+"b", caps))
		}
		// chain picks 1 to 3 of the limits, in order, on both sides.
		chain := func() (a, b []limit) {
			for i := range sideA {
				if rng.IntN(5) < 2 {
					a, b = append(a, sideA[i]), append(b, sideB[i])
				}
			}
			if len(a) == 0 {
				i := rng.IntN(len(sideA))
				a, b = []limit{sideA[i]}, []limit{sideB[i]}
			}
			return a, b
		}
		// The same history on both sides: admissions and token charges in
		// the previous minute, then in this one before at.
		for _, when := range []int64{base - 60000 + rng.Int64N(60000), base + rng.Int64N(at-base)} {
			for range rng.IntN(8) {
				a, b := chain()
				for _, c := range [][]limit{a, b} {
					if _, err := s.admit(ctx, c, when); err != nil {
						t.Fatal(err)
					}
				}
			}
			for range rng.IntN(4) {
				a, b := chain()
				tokens := 10 + rng.Int64N(140)
				for _, c := range [][]limit{a, b} {
					if err := s.recordTokens(ctx, c, tokens, when); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		var batch scriptCall
		var alone [][]limit
		for range 1 + rng.IntN(12) {
			a, b := chain()
			if !batch.add(a) {
				t.Fatal("a chain was refused by the call")
			}
			alone = append(alone, b)
		}
		batched, _, err := s.call(ctx, &batch, at, false)
		if err != nil {
			t.Fatal(err)
		}
		for m, c := range alone {
			d, err := s.run(ctx, c, at, false)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := describeDecision(batched[m]), describeDecision(d); got != want {
				t.Fatalf("trial %d, admission %d of %d: batched %s, alone %s", trial, m, len(alone), got, want)
			}
		}
		for i := range sideA { // what each side holds after
			da, errA := s.peek(ctx, sideA[i:i+1], at)
			db, errB := s.peek(ctx, sideB[i:i+1], at)
			if errA != nil || errB != nil {
				t.Fatal(errA, errB)
			}
			if got, want := describeDecision(da), describeDecision(db); got != want {
				t.Fatalf("trial %d, limit %d after: batched side %s, one-by-one side %s", trial, i, got, want)
			}
		}
	}
}

func describeDecision(d decision) string {
	return fmt.Sprintf("admitted=%v counts=%+v", d.admitted, d.counts)
}
