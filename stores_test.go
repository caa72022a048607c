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
