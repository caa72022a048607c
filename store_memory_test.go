package ratelimit

import (
	"testing"
	"time"
)

func TestMemoryStoreDropsCountersThatNoEstimateReads(t *testing.T) {
	s := newMemoryStore(time.Hour) // swept by hand below
	defer s.Destruct()
	base := pinnedBase()
	for i := 0; i < 1000; i++ {
		admitOrFail(t, s, []limit{newLimit("key", uniqueID(t), 5, 0)}, base)
	}
	live := newLimit("org", "acme", 100, 0)
	admitOrFail(t, s, []limit{live}, base+bucketMillis)
	s.sweep() // at base+60 s the buckets of base are still the previous ones
	if n := s.size(); n != 1001 {
		t.Fatalf("%d counters after a sweep one minute on, want all 1001", n)
	}
	admitOrFail(t, s, []limit{live}, base+2*bucketMillis)
	s.sweep()
	if n := s.size(); n != 1 {
		t.Fatalf("%d counters after a sweep two minutes on, want only the live one", n)
	}
	if n := memoryCount(t, s, live.prefix, requests, base/bucketMillis+2); n != 1 {
		t.Fatalf("the live counter lost its count: %d", n)
	}
}

func TestMemoryStoreKeepsATokenBucketUntilItIsFullAgain(t *testing.T) {
	s := newMemoryStore(time.Hour) // swept by hand below
	defer s.Destruct()
	base := pinnedBase()
	chain := []limit{newBucketLimit(t, "key", uniqueID(t), "0.01", 2, 0)} // a token per 100 s
	fill(t, s, chain, base, 2)
	admitOrFail(t, s, []limit{newLimit("org", "clock", 100, 0)}, base+199_999)
	s.sweep()
	if s.size() != 2 {
		t.Fatal("swept a bucket 1 ms before it is full again")
	}
	admitOrFail(t, s, []limit{newLimit("org", "clock", 100, 0)}, base+200_000)
	s.sweep()
	if s.size() != 1 {
		t.Fatal("kept a bucket that is full again, and the minute windows of which are old")
	}
}

func (s *memoryStore) size() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += len(s.shards[i].counters)
		s.shards[i].mu.Unlock()
	}
	return n
}
