package limiter

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// benchmarkCaps admit everything a benchmark sends: the org's counter of a
// shared chain sees tens of millions of requests a minute.
var benchmarkCaps = CapsOfWindows(WindowCaps{RPM: MaxCap, TPM: MaxCap})

// benchmarkChains are n chains of four limits, key, project, team and org,
// as a gateway builds them: keys are digested and distinct, ten keys share a
// project, ten projects a team, and the teams spread over eight orgs.
func benchmarkChains(n int) [][]Limit {
	chains := make([][]Limit, n)
	for i := range chains {
		project, team := i/10, i/100
		chains[i] = []Limit{
			NewLimit("", "key", KeyID(false, "sk-bench-"+strconv.Itoa(i)), benchmarkCaps),
			NewLimit("", "project", "p"+strconv.Itoa(project), benchmarkCaps),
			NewLimit("", "team", "t"+strconv.Itoa(team), benchmarkCaps),
			NewLimit("", "org", "o"+strconv.Itoa(team%8), benchmarkCaps),
		}
	}
	return chains
}

// admitAll admits one request of each chain, on the store's own clock.
func admitAll(b *testing.B, s *MemoryStore, chains [][]Limit) {
	for _, chain := range chains {
		if d, _ := s.Admit(context.Background(), chain, TokenCounts{}); !d.Admitted {
			b.Fatal("refused under caps that admit everything")
		}
	}
}

// benchmarkStore is a store whose counters for n chains already exist, as
// under steady traffic, and another copy of those chains: a gateway builds
// a chain's strings for each request, so their bytes are not those the store
// keeps.
func benchmarkStore(b *testing.B, n int) (*MemoryStore, [][]Limit) {
	s := NewMemoryStore(30*time.Second, SystemUnixMillis)
	b.Cleanup(func() { s.Destruct() })
	admitAll(b, s, benchmarkChains(n))
	return s, benchmarkChains(n)
}

// BenchmarkMemoryStoreAdmissions is one core's admissions per second over
// 10,000 keys.
func BenchmarkMemoryStoreAdmissions(b *testing.B) {
	s, chains := benchmarkStore(b, 10_000)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if d, _ := s.Admit(ctx, chains[i], TokenCounts{}); !d.Admitted {
			b.Fatal("refused under caps that admit everything")
		}
		if i++; i == len(chains) {
			i = 0
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "admissions/s")
}

// BenchmarkMemoryStoreAdmissionsParallel is BenchmarkMemoryStoreAdmissions
// on every core (-cpu): without a global lock it scales with them, short of
// the orgs' counters, which the cores share.
func BenchmarkMemoryStoreAdmissionsParallel(b *testing.B) {
	s, chains := benchmarkStore(b, 10_000)
	var workers atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		i := int(workers.Add(1)*7919) % len(chains) // apart from the other workers
		for pb.Next() {
			if d, _ := s.Admit(ctx, chains[i], TokenCounts{}); !d.Admitted {
				b.Error("refused under caps that admit everything")
				return
			}
			if i++; i == len(chains) {
				i = 0
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "admissions/s")
}

// BenchmarkMemoryStore100kActiveKeys is the heap that the store holds for
// 100,000 keys admitted within the minute (and their 10,000 projects, 1,000
// teams and 8 orgs): the chains themselves are dropped first, so what is
// left is the store's counters, its index and the prefixes it keeps.
func BenchmarkMemoryStore100kActiveKeys(b *testing.B) {
	const keys = 100_000
	var inUse int64
	for b.Loop() {
		before := heapAlloc()
		s := NewMemoryStore(time.Hour, SystemUnixMillis) // no sweep while measuring
		admitAll(b, s, benchmarkChains(keys))
		inUse = heapAlloc() - before
		runtime.KeepAlive(s)
		s.Destruct()
	}
	b.ReportMetric(float64(inUse)/(1<<20), "MiB/100k-keys")
	b.ReportMetric(float64(inUse)/keys, "B/key")
}

// heapAlloc is the live heap after a full collection.
func heapAlloc() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
