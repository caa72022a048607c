package ratelimit

import (
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
)

// The stores' pools: every loaded config's handlers share one in-process
// store, and one Redis store per Redis they name, across reloads.

// memoryStores holds the one in-process store, kept across config reloads.
var memoryStores = caddy.NewUsagePool()

// The stores' clocks, read when a store is made: this machine's, and
// Redis's TIME. A test that must start at a given second of a minute moves
// them rather than wait for it (wait_test.go).
var (
	memoryStoreClock = limiter.SystemUnixMillis
	redisStoreClock  = limiter.SystemRedisClock
)

func acquireMemoryStore() (limiter.Store, func() error, error) {
	const key = "memory"
	v, _, err := memoryStores.LoadOrNew(key, func() (caddy.Destructor, error) {
		s := limiter.NewMemoryStore(30*time.Second, memoryStoreClock)
		s.StartRenewal()
		return s, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return v.(*limiter.MemoryStore), func() error {
		_, err := memoryStores.Delete(key)
		return err
	}, nil
}

// redisStores shares a client among the handlers of every loaded config with
// the same settings, so that a reload neither reconnects nor leaks a pool.
var redisStores = caddy.NewUsagePool()

// acquireRedisStore takes the store of a resolved config from the pool.
func acquireRedisStore(config *RedisConfig, timeout time.Duration) (limiter.Store, func() error, error) {
	key := config.poolKey(timeout)
	v, _, err := redisStores.LoadOrNew(key, func() (caddy.Destructor, error) {
		s, err := limiter.NewRedisStore(config.deployment(), timeout, redisStoreClock)
		if err == nil {
			s.StartRenewal()
		}
		return s, err
	})
	if err != nil {
		return nil, nil, err
	}
	return v.(*limiter.RedisStore), func() error {
		_, err := redisStores.Delete(key)
		return err
	}, nil
}

// countMemoryCounters is the counters of the process's in-process store,
// for the gauge.
func countMemoryCounters() float64 {
	n := int64(0)
	memoryStores.Range(func(_, v any) bool {
		n += v.(*limiter.MemoryStore).Counters()
		return true
	})
	return float64(n)
}

// Interface guards
var (
	_ caddy.Destructor = (*limiter.MemoryStore)(nil)
	_ caddy.Destructor = (*limiter.RedisStore)(nil)
)
