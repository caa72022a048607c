package ratelimit

import (
	"context"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// The gauge counts the counters of the process's in-process store.
func TestTheMemoryCountersGaugeCountsTheProcesssCounters(t *testing.T) {
	st, release, err := acquireMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	before := countMemoryCounters()
	for range 3 {
		if _, err := st.Admit(context.Background(), []limiter.Limit{newLimit("key", redistest.UniqueID(t), 5, 0)}, limiter.TokenCounts{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := countMemoryCounters(); got != before+3 {
		t.Fatalf("the gauge reads %v after 3 new ids, want %v", got, before+3)
	}
}

// moveClocks makes memory and redis the clocks of the stores made until
// the test ends: the in-process store, which it first has the gateways of
// earlier tests let go of, and the Redis stores of servers no loaded config
// names yet (a test's own).
func moveClocks(t *testing.T, memory func() int64, redis limiter.RedisClock) {
	t.Helper()
	unloadGateways(t)
	held := 0
	memoryStores.Range(func(any, any) bool { held++; return true })
	if held > 0 {
		t.Fatal("the in-process store of an earlier test is still held: its config was not unloaded, or a response it admitted never ended")
	}
	memoryStoreClock, redisStoreClock = memory, redis
	t.Cleanup(func() { memoryStoreClock, redisStoreClock = limiter.SystemUnixMillis, limiter.SystemRedisClock })
}
