package ratelimit

import (
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// TestMain removes the Caddy binary that the tests of gateway processes
// built (caddyBinary), and stops the Redis Cluster they share
// (sharedCluster).
func TestMain(m *testing.M) {
	code := m.Run()
	if caddyBuild.dir != "" {
		os.RemoveAll(caddyBuild.dir)
	}
	if c := sharedClusterStarted.Load(); c != nil {
		c.Stop()
	}
	os.Exit(code)
}

// sharedCluster is a Redis Cluster of three primaries that the tests share,
// started on first use: each test uses ids of its own, and none changes the
// cluster's topology, so that they spare a cluster's start (2 s) each. It
// skips or fails as redistest.EnvURL does.
func sharedCluster(t *testing.T) *redistest.Cluster {
	t.Helper()
	redistest.EnvURL(t)
	c, err := startSharedCluster()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var (
	startSharedCluster = sync.OnceValues(func() (*redistest.Cluster, error) {
		c, err := redistest.StartCluster(3)
		if err == nil {
			sharedClusterStarted.Store(c)
		}
		return c, err
	})
	sharedClusterStarted atomic.Pointer[redistest.Cluster]
)
