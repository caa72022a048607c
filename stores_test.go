package ratelimit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
		if _, err := st.Admit(context.Background(), []Limit{newLimit("key", redistest.UniqueID(t), 5, 0)}, TokenCounts{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := countMemoryCounters(); got != before+3 {
		t.Fatalf("the gauge reads %v after 3 new ids, want %v", got, before+3)
	}
}

func TestUnloadedRedisStoreStaysOpenUntilItsLastHolderReleasesIt(t *testing.T) {
	url := redistest.EnvURL(t)
	st, release, err := acquireRedisStore(&RedisConfig{URL: url}, 250*time.Millisecond) // a key no other test uses
	if err != nil {
		t.Fatal(err)
	}
	s := st.(*RedisStore)
	s.Hold() // a response admitted under the config being unloaded
	if err := release(); err != nil {
		t.Fatal(err)
	}
	chain := []Limit{newLimit("org", redistest.UniqueID(t), 0, 100)}
	settle(t, s, chain, Charge{Tokens: totalTokens(7)}) // after the unload
	s.Release()
	if err := s.client.Ping(context.Background()).Err(); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("client after the last release: %v, want closed", err)
	}
}
