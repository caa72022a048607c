package ratelimit

import (
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestStoreFailuresAreLoggedOncePerIntervalNotPerRequest(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	logger := zap.New(core)
	var l warnLimiter
	var wg sync.WaitGroup
	for i := 0; i < 500; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.log(logger, "rate limit store unavailable", zap.Error(errors.New("connection refused")))
		}()
	}
	wg.Wait()
	if n := logs.Len(); n != 1 {
		t.Fatalf("%d warnings for 500 failures within one interval, want 1", n)
	}
	l.next = time.Time{} // the interval has passed
	l.log(logger, "rate limit store unavailable", zap.Error(errors.New("connection refused")))
	entries := logs.All()
	if len(entries) != 2 {
		t.Fatalf("%d warnings, want 2", len(entries))
	}
	if got := entries[1].ContextMap()["suppressed_since_last"]; got != int64(499) {
		t.Fatalf("suppressed_since_last %v, want 499", got)
	}
}
