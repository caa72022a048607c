package redistest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/rolter/caddy-ratelimit/internal/poll"
)

func TestTopologyHelpersStartAClusterAndFailOverASentinelSet(t *testing.T) {
	EnvURL(t)
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		c := NewCluster(t, 3)
		t.Logf("cluster of %v ready in %v", c.Addrs(), time.Since(start).Round(time.Millisecond))

		cc := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                    c.Addrs(),
			DisableIdentity:          true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		t.Cleanup(func() { _ = cc.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()

		const key = "redistest:topology:{k}"
		if err := cc.IncrBy(ctx, key, 5).Err(); err != nil {
			t.Fatalf("INCRBY through the cluster client: %v", err)
		}
		if got, err := cc.Get(ctx, key).Int64(); err != nil || got != 5 {
			t.Fatalf("GET through the cluster client: %d, %v; want 5", got, err)
		}
		owner := c.SlotOwner(key)
		if got := c.Count(t, key); got != 5 {
			t.Fatalf("Count = %d, want 5 (owner %s)", got, owner)
		}
		if got := c.Count(t, "redistest:topology:missing"); got != 0 {
			t.Fatalf("Count of a missing key = %d, want 0", got)
		}

		// Half-way through a migration the key is on the target: the
		// source answers ASK, which the cluster client and Count follow,
		// and the target TRYAGAIN to a command on both keys of the slot.
		const key2 = "redistest:topology:{k}:2"
		if err := cc.Set(ctx, key2, 1, 0).Err(); err != nil {
			t.Fatalf("SET through the cluster client: %v", err)
		}
		slot := c.KeySlot(key)
		to := c.Addrs()[0]
		if to == owner {
			to = c.Addrs()[1]
		}
		m := c.BeginSlotMigration(t, slot, to)
		m.MoveKeys(t, key)
		if _, err := do(owner, "GET", key); err == nil || !strings.HasPrefix(err.Error(), "ASK ") {
			t.Fatalf("GET on the source mid-migration: %v, want an ASK redirection", err)
		}
		if got := c.Count(t, key); got != 5 {
			t.Fatalf("Count mid-migration = %d, want 5", got)
		}
		tc := Client(to, cmdTimeout)
		defer tc.Close()
		cmds, _ := tc.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Do(ctx, "ASKING")
			p.MGet(ctx, key, key2)
			return nil
		})
		if err := cmds[1].Err(); err == nil || !strings.HasPrefix(err.Error(), "TRYAGAIN") {
			t.Fatalf("ASKING + MGET of a moved and an unmoved key on the target: %v, want TRYAGAIN", err)
		}
		if got, err := cc.Incr(ctx, key).Result(); err != nil || got != 6 {
			t.Fatalf("INCR through the cluster client mid-migration: %d, %v; want 6", got, err)
		}
		m.Finish(t)
		if got := c.SlotOwner(key); got != to {
			t.Fatalf("slot %d owned by %s after the migration, want %s", slot, got, to)
		}
		if got, err := cc.Incr(ctx, key).Result(); err != nil || got != 7 {
			t.Fatalf("INCR through the cluster client after the migration: %d, %v; want 7", got, err)
		}
		c.MigrateSlot(t, slot, owner) // and back, in one go
		if got := c.Count(t, key) + c.Count(t, key2); got != 8 || c.SlotOwner(key) != owner {
			t.Fatalf("after migrating back: Counts sum to %d (want 8), owner %s (want %s)", got, c.SlotOwner(key), owner)
		}
	})

	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		s := NewSentinel(t)
		t.Logf("sentinel set %v ready in %v", s.SentinelAddrs(), time.Since(start).Round(time.Millisecond))

		fo, err := redis.ParseFailoverURL(s.FailoverURL())
		if err != nil {
			t.Fatal(err)
		}
		fo.DisableIdentity = true
		fc := redis.NewFailoverClient(fo)
		t.Cleanup(func() { _ = fc.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()

		const key = "redistest:topology:k"
		if err := fc.IncrBy(ctx, key, 5).Err(); err != nil {
			t.Fatalf("INCRBY through the failover client: %v", err)
		}
		// Replication is asynchronous: wait for the replica before the kill.
		if n, err := fc.Do(ctx, "WAIT", 1, 2000).Int(); err != nil || n != 1 {
			t.Fatalf("WAIT 1: %d, %v", n, err)
		}

		old := s.KillPrimary(t)
		killed := time.Now()
		primary := s.WaitFailover(t, old)
		t.Logf("failover %s -> %s announced by every sentinel after %v", old, primary,
			time.Since(killed).Round(time.Millisecond))
		if got := s.Count(t, key); got != 5 {
			t.Fatalf("Count on the new primary = %d, want 5", got)
		}
		err = poll.Until(10*time.Second, pollEvery, func() error { return fc.Incr(ctx, key).Err() })
		if err != nil {
			t.Fatalf("INCR through the failover client after the failover: %v", err)
		}
		t.Logf("failover client writing again %v after the kill", time.Since(killed).Round(time.Millisecond))
		if got := s.Count(t, key); got < 6 {
			t.Fatalf("Count after INCR = %d, want at least 6", got)
		}
	})
}
