package limiter

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

func TestMemoryStoreDropsCountersThatNoEstimateReads(t *testing.T) {
	s := newTestMemoryStore(t, time.Hour) // swept by hand below
	base := pinnedBase()
	for i := 0; i < 1000; i++ {
		admitOrFail(t, s, []Limit{newLimit("key", redistest.UniqueID(t), 5, 0)}, base)
	}
	live := newLimit("org", "acme", 100, 0)
	admitOrFail(t, s, []Limit{live}, base+MinuteMillis)
	s.sweep() // at base+60 s the buckets of base are still the previous ones
	if n := s.size(); n != 1001 {
		t.Fatalf("%d counters after a sweep one minute on, want all 1001", n)
	}
	admitOrFail(t, s, []Limit{live}, base+2*MinuteMillis)
	s.sweep()
	if n := s.size(); n != 1 {
		t.Fatalf("%d counters after a sweep two minutes on, want only the live one", n)
	}
	if n := memoryCount(t, s, live.Prefix, RPM, base/MinuteMillis+2); n != 1 {
		t.Fatalf("the live counter lost its count: %d", n)
	}
}

func TestMemoryStoreKeepsATokenBucketUntilItIsFullAgain(t *testing.T) {
	s := newTestMemoryStore(t, time.Hour) // swept by hand below
	base := pinnedBase()
	chain := []Limit{newBucketLimit(t, "key", redistest.UniqueID(t), "0.01", 2, 0)} // a token per 100 s
	fill(t, s, chain, base, 2)
	admitOrFail(t, s, []Limit{newLimit("org", "clock", 100, 0)}, base+199_999)
	s.sweep()
	if s.size() != 2 {
		t.Fatal("swept a bucket 1 ms before it is full again")
	}
	admitOrFail(t, s, []Limit{newLimit("org", "clock", 100, 0)}, base+200_000)
	s.sweep()
	if s.size() != 1 {
		t.Fatal("kept a bucket that is full again, and the minute windows of which are old")
	}
}

func (s *MemoryStore) size() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += s.shards[i].n
		s.shards[i].mu.Unlock()
	}
	return n
}

func TestMemoryStoreAdmissionAllocatesOnlyTheDecisionsCounts(t *testing.T) {
	s := newTestMemoryStore(t, time.Hour)
	at := pinnedBase()
	id := redistest.UniqueID(t)
	chain := []Limit{
		newLimit("key", id, 1<<40, 1<<40), newLimit("project", id, 1<<40, 1<<40),
		newLimit("team", id, 1<<40, 1<<40), newLimit("org", id, 1<<40, 1<<40),
	}
	admitOrFail(t, s, chain, at) // creates the counters
	allocs := testing.AllocsPerRun(100, func() { admitOrFail(t, s, chain, at) })
	if allocs != 1 {
		t.Fatalf("an admission of a chain of 4 allocates %v times, want once, for its counts", allocs)
	}
}

func TestMemoryStoreChainLongerThanTheStackArraysAdmitsAndCharges(t *testing.T) {
	s := newTestMemoryStore(t, time.Hour)
	at := pinnedBase()
	var chain []Limit
	for i := 0; i < 2*stackChain+1; i++ {
		chain = append(chain, newLimit("scope"+strconv.Itoa(i), redistest.UniqueID(t), 2, 0))
	}
	fill(t, s, chain, at, 2)
	if admitOrFail(t, s, chain, at).Admitted {
		t.Fatal("admitted a third request against rpm 2")
	}
	for _, l := range chain {
		if n := memoryCount(t, s, l.Prefix, RPM, at/MinuteMillis); n != 2 {
			t.Fatalf("%s charged %d requests, want 2", l.Prefix, n)
		}
	}
}

func TestMemoryStoreChainsThatShareCountersInAnyOrderNeverDeadlock(t *testing.T) {
	s := newTestMemoryStore(t, time.Hour)
	at := pinnedBase()
	a, b, c := newLimit("key", redistest.UniqueID(t), 1<<40, 0), newLimit("team", redistest.UniqueID(t), 1<<40, 0), newLimit("org", redistest.UniqueID(t), 1<<40, 0)
	chains := [][]Limit{{a, b, c}, {c, b, a}, {b, c, a}, {a, c}, {c, a, c}, {b, b}}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, chain := range chains {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				if d, _ := pinned(s, at).Admit(context.Background(), chain, TokenCounts{}); !d.Admitted {
					t.Error("refused under caps that admit everything")
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("admissions of chains that share counters are stuck")
	}
}

func TestMemoryStoreCountsExactlyWhileItsShardsGrowAndAreSwept(t *testing.T) {
	s := newTestMemoryStore(t, time.Hour) // swept by hand below
	ctx := context.Background()
	now := pinnedBase()
	live := []Limit{newLimit("key", redistest.UniqueID(t), 1<<40, 0), newLimit("org", redistest.UniqueID(t), 1<<40, 0)}
	admitOrFail(t, s, live, now)
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churn.Add(2)
	go func() { // new counters, which grow the shards, and which the sweep drops: a peek charges nothing
		defer churn.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
				s.Peek(ctx, []Limit{newLimit("key", "gone"+strconv.Itoa(i), 1, 0)})
			}
		}
	}()
	go func() {
		defer churn.Done()
		for {
			select {
			case <-stop:
				return
			default:
				s.sweep()
			}
		}
	}()
	const workers, each = 4, 5000
	var admitters sync.WaitGroup
	for range workers {
		admitters.Add(1)
		go func() {
			defer admitters.Done()
			for range each {
				s.Admit(ctx, live, TokenCounts{})
			}
		}()
	}
	admitters.Wait()
	close(stop)
	churn.Wait()
	for _, l := range live {
		if n := memoryCount(t, s, l.Prefix, RPM, now/MinuteMillis); n != 1+workers*each {
			t.Fatalf("%s counted %d requests, want %d: an admission missed its counter and made another", l.Prefix, n, 1+workers*each)
		}
	}
	if n := s.size(); n < len(live) {
		t.Fatalf("%d counters left, want at least the %d live ones", n, len(live))
	}
}

// waitCounters waits until s holds want counters, as its sweep timer runs.
func waitCounters(t *testing.T, s *MemoryStore, want int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); s.counters.Load() != want; {
		if time.Now().After(deadline) {
			t.Fatalf("%d counters, want %d", s.counters.Load(), want)
		}
		time.Sleep(time.Millisecond)
	}
	if n := s.size(); int64(n) != want {
		t.Fatalf("the shards hold %d counters, the count says %d", n, want)
	}
}

// Idle counters go once their windows are over, on the sweep's own timer:
// no request has to come for the store to notice the time.
func TestIdleInProcessCountersAreReclaimedWithoutTraffic(t *testing.T) {
	s := newTestMemoryStore(t, 5*time.Millisecond)
	base := pinnedBase()
	for range 1000 {
		admitOrFail(t, s, []Limit{newLimit("key", redistest.UniqueID(t), 5, 0)}, base)
	}
	for range 200 {
		admitOrFail(t, s, []Limit{NewLimit("", "team", redistest.UniqueID(t), CapsOfWindows(WindowCaps{RPD: 5}))}, base)
	}
	waitCounters(t, s, 1200)
	pinned(s, base+2*MinuteMillis) // the minute windows are over; the day windows are not
	waitCounters(t, s, 200)
	pinned(s, base+2*dayMinutes*MinuteMillis)
	waitCounters(t, s, 0)
}
