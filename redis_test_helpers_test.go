package ratelimit

// The Redis tests' helpers, over internal/redistest, which starts the
// servers, the proxy and the topologies:
//
//   - redisURLFromEnv: the switch that turns the Redis tests on (./test.sh
//     sets it); without it they skip, or fail in CI.
//   - startRedis: a throwaway redis-server per test, which a test can stop and
//     start again on the same port (Redis outages), or hang (Hang: the
//     process is stopped, and connections to it are accepted but answered
//     by nothing).
//   - newResetProxy: a TCP proxy that kills the connections open at a given
//     moment at their next command.
//   - startRedisCluster, startRedisSentinel: a Redis Cluster of N primaries,
//     and a primary, a replica and three sentinels.

import (
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// redisURLFromEnv returns ROLTER_TEST_REDIS_URL; without it the test skips,
// or fails in CI.
func redisURLFromEnv(t testing.TB) string {
	t.Helper()
	return redistest.EnvURL(t)
}

// testRedis is a throwaway redis-server on a loopback port, owned by one test.
type testRedis struct{ *redistest.Server }

// startRedis starts a redis-server of the test's own; it skips when the
// Redis tests are off, and stops the server in t.Cleanup.
func startRedis(t testing.TB) *testRedis {
	t.Helper()
	return &testRedis{redistest.NewServer(t)}
}

// Stop kills the server and waits for it to exit; Start brings it back on
// the same port.
func (r *testRedis) Stop(t testing.TB) {
	t.Helper()
	r.Server.Stop()
}

// Start starts the stopped server again, with an empty dataset.
func (r *testRedis) Start(t testing.TB) {
	t.Helper()
	if err := r.Server.Start(); err != nil {
		t.Fatal(err)
	}
}

type resetProxy = redistest.ResetProxy

// newResetProxy starts a proxy to target, closed in t.Cleanup.
func newResetProxy(t testing.TB, target string) *resetProxy {
	t.Helper()
	return redistest.NewResetProxy(t, target)
}

type testCluster = redistest.Cluster

// startRedisCluster starts a Redis Cluster of primaries nodes.
func startRedisCluster(t testing.TB, primaries int) *testCluster {
	t.Helper()
	return redistest.NewCluster(t, primaries)
}

type testSentinel = redistest.Sentinel

// startRedisSentinel starts a primary, a replica and three sentinels.
func startRedisSentinel(t testing.TB) *testSentinel {
	t.Helper()
	return redistest.NewSentinel(t)
}
