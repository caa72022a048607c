package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
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
	ds, err := s.call(context.Background(), &c, at, false)
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
