package ratelimit

// Test-only helpers for the Redis Cluster and Redis Sentinel tests, built on
// redis_test_helpers_test.go:
//
//   - startRedisCluster: a throwaway Redis Cluster of N primaries, no replicas.
//     testCluster tells which node owns a key, reads a counter from it, and can
//     move a hash slot to another node (MOVED afterwards, ASK/TRYAGAIN midway).
//   - startRedisSentinel: a primary, one replica and three sentinels
//     monitoring them as "mymaster". testSentinel kills the primary and waits
//     for the sentinels to promote the replica.
//
// Both skip exactly when the other Redis tests do (redisURLFromEnv), fail when
// the tests are enabled but redis-server is missing, use free
// loopback ports of their own and kill every process in t.Cleanup. Every
// server is a testRedis, launched, checked (INFO server process_id) and
// retried on a taken port like startRedis's, so its Stop and Start work too.
//
// Every identifier not named above is prefixed with "rh", as in
// redis_test_helpers_test.go.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

const (
	// rhTopologyReadyTimeout bounds how long a cluster or a sentinel set may
	// take to become usable once its processes run (normally about 2 s).
	rhTopologyReadyTimeout = 20 * time.Second
	// rhFailoverTimeout bounds WaitFailover. With down-after-milliseconds 1000
	// a failover normally takes 2-5 s; a split leader vote retries only after
	// twice failover-timeout (10 s).
	rhFailoverTimeout = 20 * time.Second
	// rhPollEvery is the polling period of the waits below.
	rhPollEvery = 50 * time.Millisecond
	// rhCmdTimeout bounds each command the helpers send.
	rhCmdTimeout = 2 * time.Second

	rhSentinelMaster = "mymaster"
)

// rhStartRedisWith is startRedis for servers that need options startRedis
// does not give. testRedis.launch runs r.bin with startRedis's options, so
// r.bin is a small sh script in the server's dir that execs
//
//	redis-server <pre...> <startRedis's options> <post...>
//
// (a config file must come first, and later options win). exec keeps the
// process id, so launch's INFO server check, Stop (SIGKILL) and Start work
// unchanged, and Start relaunches with the same options. prepare, if not nil,
// runs before each launch attempt (to write a config file afresh).
func rhStartRedisWith(t testing.TB, dir string, pre, post []string, prepare func() error) *testRedis {
	t.Helper()
	bin := rhRedisServerBin(t)
	script := filepath.Join(dir, "redis-server.sh")
	var sh strings.Builder
	sh.WriteString("#!/bin/sh\nexec")
	for _, a := range [][]string{{bin}, pre, {`"$@"`}, post} {
		for _, s := range a {
			if s != `"$@"` {
				s = rhShellQuote(s)
			}
			sh.WriteString(" " + s)
		}
	}
	sh.WriteString("\n")
	if err := os.WriteFile(script, []byte(sh.String()), 0o755); err != nil {
		t.Fatalf("writing %s: %v", script, err)
	}
	r := &testRedis{bin: script, dir: dir}
	t.Cleanup(func() { r.stop() })
	rhLaunchOnFreePort(t, r, prepare)
	return r
}

func rhShellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// rhPoll calls check every rhPollEvery until it returns nil or timeout
// passes, and returns check's last error (nil on success).
func rhPoll(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(rhPollEvery)
	}
}

// rhDo runs one command on addr with a fresh one-connection client.
func rhDo(addr string, args ...any) (any, error) {
	c := rhClient(addr, rhCmdTimeout)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rhCmdTimeout)
	defer cancel()
	return c.Do(ctx, args...).Result()
}

// rhInfoField returns field of INFO section on addr.
func rhInfoField(addr, section, field string) (string, error) {
	v, err := rhDo(addr, "INFO", section)
	if err != nil {
		return "", err
	}
	s, _ := v.(string)
	for _, line := range strings.Split(s, "\n") {
		if val, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return val, nil
		}
	}
	return "", fmt.Errorf("no %s in INFO %s of %s", field, section, addr)
}

// rhGetCount reads key on addr as an integer, 0 when missing. With asking it
// sends ASKING first on the same connection (a key of a slot being imported).
func rhGetCount(addr, key string, asking bool) (int64, error) {
	c := rhClient(addr, rhCmdTimeout)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), rhCmdTimeout)
	defer cancel()
	var get *redis.StringCmd
	if asking {
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Do(ctx, "ASKING")
			get = p.Get(ctx, key)
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, err
		}
	} else {
		get = c.Get(ctx, key)
	}
	n, err := get.Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

func rhSplitAddr(addr string) (host string, port int, err error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err = strconv.Atoi(p)
	return host, port, err
}

// ---------------------------------------------------------------- Cluster

// testCluster is a throwaway Redis Cluster: primaries only, the slots split
// evenly in start order. Nodes announce 127.0.0.1.
type testCluster struct {
	nodes []*testRedis
}

// startRedisCluster starts primaries cluster-enabled redis-servers (own
// dirs and nodes.conf, no persistence, node timeout 2 s), gives each an
// even share of the slots, joins them and waits until every node reports
// cluster_state:ok, all slots assigned and all nodes known. It skips when the
// Redis tests are disabled; everything is killed in t.Cleanup.
//
// Startup takes about 2.2 s, and cannot take much less: a primary reports
// cluster_state:ok no sooner than 2 s after it started (Redis's
// CLUSTER_WRITABLE_DELAY). redis-cli --cluster create is not used: it sleeps
// a second twice and, under load, took up to 4.4 s where this takes 2.2 s.
func startRedisCluster(t testing.TB, primaries int) *testCluster {
	t.Helper()
	redisURLFromEnv(t)
	if primaries < 1 {
		t.Fatalf("startRedisCluster: %d primaries", primaries)
	}
	c := &testCluster{}
	for i := 0; i < primaries; i++ {
		dir := t.TempDir()
		conf := filepath.Join(dir, "nodes.conf")
		c.nodes = append(c.nodes, rhStartRedisWith(t, dir, nil, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", conf,
			"--cluster-node-timeout", "2000",
		}, func() error {
			// A failed attempt may have written a node id for another port.
			if err := os.Remove(conf); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			return nil
		}))
	}

	// What redis-cli --cluster create does for primaries only, without its
	// two one-second sleeps: even slot ranges, distinct config epochs, MEET.
	for i, n := range c.nodes {
		first, last := i*16384/primaries, (i+1)*16384/primaries-1
		for _, cmd := range [][]any{
			{"CLUSTER", "ADDSLOTSRANGE", first, last},
			{"CLUSTER", "SET-CONFIG-EPOCH", i + 1},
		} {
			if _, err := rhDo(n.Addr(), cmd...); err != nil {
				t.Fatalf("%v on %s: %v", cmd, n.Addr(), err)
			}
		}
	}
	// Every pair meets directly: gossip alone can take a second or two more
	// to tell the nodes each other's slots.
	for i, a := range c.nodes {
		for _, b := range c.nodes[i+1:] {
			if _, err := rhDo(a.Addr(), "CLUSTER", "MEET", "127.0.0.1", b.port); err != nil {
				t.Fatalf("CLUSTER MEET %s on %s: %v", b.Addr(), a.Addr(), err)
			}
		}
	}

	want := strconv.Itoa(primaries)
	err := rhPoll(rhTopologyReadyTimeout, func() error {
		for _, n := range c.nodes {
			v, err := rhDo(n.Addr(), "CLUSTER", "INFO")
			if err != nil {
				return fmt.Errorf("CLUSTER INFO on %s: %v", n.Addr(), err)
			}
			info, _ := v.(string)
			lines := map[string]bool{}
			for _, l := range strings.Split(info, "\n") {
				lines[strings.TrimSpace(l)] = true
			}
			for _, line := range []string{"cluster_state:ok", "cluster_slots_assigned:16384", "cluster_known_nodes:" + want} {
				if !lines[line] {
					return fmt.Errorf("%s: no %q in CLUSTER INFO:\n%s", n.Addr(), line, info)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("cluster not ready within %v: %v", rhTopologyReadyTimeout, err)
	}
	return c
}

// Addrs are the nodes' host:port, in start order.
func (c *testCluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Addr()
	}
	return out
}

// URLs are the nodes as redis://127.0.0.1:N (no database: a cluster has only 0).
func (c *testCluster) URLs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = "redis://" + n.Addr()
	}
	return out
}

// Node is the node at addr (to Stop and Start it), or nil.
func (c *testCluster) Node(addr string) *testRedis {
	for _, n := range c.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// ask sends a command to the first node that answers (tests may stop nodes).
func (c *testCluster) ask(args ...any) (any, error) {
	var errs []error
	for _, n := range c.nodes {
		v, err := rhDo(n.Addr(), args...)
		if err == nil {
			return v, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", n.Addr(), err))
	}
	return nil, errors.Join(errs...)
}

// KeySlot is key's hash slot (CLUSTER KEYSLOT). It panics when no node answers.
func (c *testCluster) KeySlot(key string) int {
	v, err := c.ask("CLUSTER", "KEYSLOT", key)
	if err != nil {
		panic(fmt.Sprintf("testCluster.KeySlot(%q): %v", key, err))
	}
	return int(v.(int64))
}

// SlotOwner is the host:port of the node serving key's slot, per CLUSTER
// SLOTS of the first node that answers. During a migration that is still the
// source node. It panics when no node answers.
func (c *testCluster) SlotOwner(key string) string {
	addr, err := c.slotOwner(c.KeySlot(key))
	if err != nil {
		panic(fmt.Sprintf("testCluster.SlotOwner(%q): %v", key, err))
	}
	return addr
}

func (c *testCluster) slotOwner(slot int) (string, error) {
	var errs []error
	for _, n := range c.nodes {
		cl := rhClient(n.Addr(), rhCmdTimeout)
		ctx, cancel := context.WithTimeout(context.Background(), rhCmdTimeout)
		ranges, err := cl.ClusterSlots(ctx).Result()
		cancel()
		_ = cl.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("CLUSTER SLOTS on %s: %w", n.Addr(), err))
			continue
		}
		for _, r := range ranges {
			if slot >= r.Start && slot <= r.End && len(r.Nodes) > 0 {
				return r.Nodes[0].Addr, nil
			}
		}
		return "", fmt.Errorf("slot %d is not assigned per %s", slot, n.Addr())
	}
	return "", errors.Join(errs...)
}

// Count is GET key as an integer on the node serving it, 0 when missing.
// It follows one MOVED or ASK redirection (a slot being migrated).
func (c *testCluster) Count(t testing.TB, key string) int64 {
	t.Helper()
	addr, err := c.slotOwner(c.KeySlot(key))
	if err != nil {
		t.Fatalf("Count(%q): %v", key, err)
	}
	n, err := rhGetCount(addr, key, false)
	if err != nil {
		// "MOVED 1234 127.0.0.1:7001" or "ASK 1234 127.0.0.1:7001"
		f := strings.Fields(err.Error())
		if len(f) == 3 && (f[0] == "MOVED" || f[0] == "ASK") {
			n, err = rhGetCount(f[2], key, f[0] == "ASK")
		}
	}
	if err != nil {
		t.Fatalf("Count(%q) on %s: %v", key, addr, err)
	}
	return n
}

// MigrateSlot moves slot, with its keys, to the node at to: it is
// BeginSlotMigration, MoveKeys of every key, then Finish. Clients then get
// MOVED for the slot's keys.
func (c *testCluster) MigrateSlot(t testing.TB, slot int, to string) {
	t.Helper()
	m := c.BeginSlotMigration(t, slot, to)
	if m != nil {
		m.Finish(t)
	}
}

// slotMigration is a slot half-way from one node to another. The source
// answers ASK to a command on a key of the slot it no longer has; the target
// serves such a command when ASKING precedes it, except a multi-key one (a
// script with several keys too) whose keys are not all there yet, which gets
// TRYAGAIN.
type slotMigration struct {
	c            *testCluster
	slot         int
	from, to     string
	fromID, toID string
	toHost       string
	toPort       int
	finished     bool
}

// BeginSlotMigration marks slot IMPORTING on to and MIGRATING on its current
// owner, moving no key yet. It returns nil (and does nothing) when to
// already owns the slot.
func (c *testCluster) BeginSlotMigration(t testing.TB, slot int, to string) *slotMigration {
	t.Helper()
	if c.Node(to) == nil {
		t.Fatalf("BeginSlotMigration: %s is not a node of the cluster %v", to, c.Addrs())
	}
	from, err := c.slotOwner(slot)
	if err != nil {
		t.Fatalf("BeginSlotMigration(%d): %v", slot, err)
	}
	if from == to {
		return nil
	}
	m := &slotMigration{c: c, slot: slot, from: from, to: to}
	if m.toHost, m.toPort, err = rhSplitAddr(to); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		addr string
		id   *string
	}{{from, &m.fromID}, {to, &m.toID}} {
		v, err := rhDo(x.addr, "CLUSTER", "MYID")
		if err != nil {
			t.Fatalf("CLUSTER MYID on %s: %v", x.addr, err)
		}
		*x.id, _ = v.(string)
	}
	// Importing first, as redis-cli does: a client sent by the source's ASK
	// must find the target ready.
	if _, err := rhDo(to, "CLUSTER", "SETSLOT", slot, "IMPORTING", m.fromID); err != nil {
		t.Fatalf("CLUSTER SETSLOT %d IMPORTING on %s: %v", slot, to, err)
	}
	if _, err := rhDo(from, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.toID); err != nil {
		t.Fatalf("CLUSTER SETSLOT %d MIGRATING on %s: %v", slot, from, err)
	}
	return m
}

// MoveKeys moves keys (which must be in the slot; missing ones are ignored)
// from the source to the target with MIGRATE.
func (m *slotMigration) MoveKeys(t testing.TB, keys ...string) {
	t.Helper()
	if len(keys) == 0 {
		return
	}
	args := []any{"MIGRATE", m.toHost, m.toPort, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	v, err := rhDo(m.from, args...)
	if err != nil {
		t.Fatalf("MIGRATE %v from %s to %s: %v", keys, m.from, m.to, err)
	}
	if s, _ := v.(string); s != "OK" && s != "NOKEY" {
		t.Fatalf("MIGRATE %v from %s to %s: %v", keys, m.from, m.to, v)
	}
}

// Finish moves the slot's remaining keys and assigns the slot to the target
// on every node (target first, then source, then the others), so that all
// nodes agree at once.
func (m *slotMigration) Finish(t testing.TB) {
	t.Helper()
	if m.finished {
		return
	}
	for {
		v, err := rhDo(m.from, "CLUSTER", "GETKEYSINSLOT", m.slot, 100)
		if err != nil {
			t.Fatalf("CLUSTER GETKEYSINSLOT %d on %s: %v", m.slot, m.from, err)
		}
		list, _ := v.([]any)
		if len(list) == 0 {
			break
		}
		keys := make([]string, len(list))
		for i, k := range list {
			keys[i] = fmt.Sprint(k)
		}
		m.MoveKeys(t, keys...)
	}
	order := []string{m.to, m.from}
	for _, a := range m.c.Addrs() {
		if a != m.to && a != m.from {
			order = append(order, a)
		}
	}
	for _, a := range order {
		if _, err := rhDo(a, "CLUSTER", "SETSLOT", m.slot, "NODE", m.toID); err != nil {
			t.Fatalf("CLUSTER SETSLOT %d NODE on %s: %v", m.slot, a, err)
		}
	}
	m.finished = true
}

// ---------------------------------------------------------------- Sentinel

// testSentinel is a throwaway primary, one replica and three sentinels
// monitoring them as "mymaster" (quorum 2, down-after-milliseconds 1000,
// failover-timeout 5000).
type testSentinel struct {
	data      []*testRedis // the initial primary, then the replica
	sentinels []*testRedis
}

// startRedisSentinel starts a primary, a replica of it (--replicaof) and,
// once the replica is in sync, three sentinels (redis-server sentinel.conf
// --sentinel). It waits until every sentinel lists the replica and the two
// other sentinels. It skips when the Redis tests are disabled; everything is
// killed in t.Cleanup. Startup takes about 2 s (sentinels find each other
// through hello messages, sent every 2 s).
func startRedisSentinel(t testing.TB) *testSentinel {
	t.Helper()
	redisURLFromEnv(t)
	s := &testSentinel{}
	// A primary waits 5 s (repl-diskless-sync-delay) for more replicas
	// before a full sync; both nodes may become the primary.
	noDelay := []string{"--repl-diskless-sync-delay", "0"}
	primary := rhStartRedisWith(t, t.TempDir(), nil, noDelay, nil)
	replica := rhStartRedisWith(t, t.TempDir(), nil,
		append(noDelay, "--replicaof", "127.0.0.1", strconv.Itoa(primary.port)), nil)
	s.data = []*testRedis{primary, replica}

	err := rhPoll(rhTopologyReadyTimeout, func() error {
		st, err := rhInfoField(replica.Addr(), "replication", "master_link_status")
		if err == nil && st != "up" {
			err = fmt.Errorf("replica %s: master_link_status:%s", replica.Addr(), st)
		}
		return err
	})
	if err != nil {
		t.Fatalf("replica not in sync within %v: %v", rhTopologyReadyTimeout, err)
	}

	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n"+
		"sentinel failover-timeout %[1]s 5000\n"+
		"sentinel parallel-syncs %[1]s 1\n", rhSentinelMaster, primary.port)
	for i := 0; i < 3; i++ {
		dir := t.TempDir()
		file := filepath.Join(dir, "sentinel.conf")
		// Port and dir come from startRedis's options; sentinel rewrites
		// the file (myid, epochs, known peers), hence afresh per attempt.
		s.sentinels = append(s.sentinels, rhStartRedisWith(t, dir, []string{file, "--sentinel"}, nil,
			func() error { return os.WriteFile(file, []byte(conf), 0o644) }))
	}

	err = rhPoll(rhTopologyReadyTimeout, func() error {
		for _, sn := range s.sentinels {
			for _, x := range []struct {
				what string
				want int
			}{{"replicas", 1}, {"sentinels", len(s.sentinels) - 1}} {
				v, err := rhDo(sn.Addr(), "SENTINEL", x.what, rhSentinelMaster)
				if err != nil {
					return fmt.Errorf("SENTINEL %s on %s: %v", x.what, sn.Addr(), err)
				}
				if l, _ := v.([]any); len(l) != x.want {
					return fmt.Errorf("sentinel %s knows %d %s, want %d", sn.Addr(), len(l), x.what, x.want)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("sentinels not ready within %v: %v", rhTopologyReadyTimeout, err)
	}
	return s
}

// MasterName is the name the sentinels monitor the primary under.
func (s *testSentinel) MasterName() string { return rhSentinelMaster }

// SentinelAddrs are the sentinels' host:port.
func (s *testSentinel) SentinelAddrs() []string {
	out := make([]string, len(s.sentinels))
	for i, n := range s.sentinels {
		out[i] = n.Addr()
	}
	return out
}

// FailoverURL is the set in go-redis's ParseFailoverURL form:
// redis://S1/0?master_name=mymaster&addr=S2&addr=S3.
func (s *testSentinel) FailoverURL() string {
	a := s.SentinelAddrs()
	q := url.Values{"master_name": {rhSentinelMaster}, "addr": a[1:]}
	return "redis://" + a[0] + "/0?" + q.Encode()
}

// Node is the data node (primary or replica) or sentinel at addr, or nil.
func (s *testSentinel) Node(addr string) *testRedis {
	for _, n := range append(append([]*testRedis{}, s.data...), s.sentinels...) {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// PrimaryAddr is the primary's host:port as the first sentinel that answers
// announces it (SENTINEL get-master-addr-by-name).
func (s *testSentinel) PrimaryAddr(t testing.TB) string {
	t.Helper()
	var errs []error
	for _, sn := range s.sentinels {
		addr, err := rhAnnouncedPrimary(sn.Addr())
		if err == nil {
			return addr
		}
		errs = append(errs, err)
	}
	t.Fatalf("no sentinel announces the primary: %v", errors.Join(errs...))
	return ""
}

func rhAnnouncedPrimary(sentinel string) (string, error) {
	v, err := rhDo(sentinel, "SENTINEL", "get-master-addr-by-name", rhSentinelMaster)
	if err != nil {
		return "", fmt.Errorf("SENTINEL get-master-addr-by-name on %s: %w", sentinel, err)
	}
	l, _ := v.([]any)
	if len(l) != 2 {
		return "", fmt.Errorf("SENTINEL get-master-addr-by-name on %s: %v", sentinel, v)
	}
	return net.JoinHostPort(fmt.Sprint(l[0]), fmt.Sprint(l[1])), nil
}

// KillPrimary kills (SIGKILL) the process of the primary the sentinels
// announce and returns its address, for WaitFailover.
func (s *testSentinel) KillPrimary(t testing.TB) string {
	t.Helper()
	addr := s.PrimaryAddr(t)
	for _, n := range s.data {
		if n.Addr() == addr {
			n.Stop(t)
			return addr
		}
	}
	t.Fatalf("the announced primary %s is none of the data nodes", addr)
	return ""
}

// WaitFailover waits until every sentinel that answers announces the same
// primary, other than old, and that node answers ROLE with master; it
// returns its address. It fails after rhFailoverTimeout.
func (s *testSentinel) WaitFailover(t testing.TB, old string) string {
	t.Helper()
	var primary string
	err := rhPoll(rhFailoverTimeout, func() error {
		primary = ""
		seen := map[string][]string{}
		for _, sn := range s.sentinels {
			addr, err := rhAnnouncedPrimary(sn.Addr())
			if err != nil {
				continue // a test may have stopped this sentinel
			}
			seen[addr] = append(seen[addr], sn.Addr())
			primary = addr
		}
		if len(seen) != 1 || primary == old {
			return fmt.Errorf("sentinels announce (primary: sentinels) %v", seen)
		}
		v, err := rhDo(primary, "ROLE")
		if err != nil {
			return fmt.Errorf("ROLE on %s: %v", primary, err)
		}
		if l, _ := v.([]any); len(l) == 0 || l[0] != "master" {
			return fmt.Errorf("%s is announced but answers ROLE %v", primary, v)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("no failover away from %s within %v: %v", old, rhFailoverTimeout, err)
	}
	return primary
}

// Count is GET key as an integer on the current primary, 0 when missing.
func (s *testSentinel) Count(t testing.TB, key string) int64 {
	t.Helper()
	addr := s.PrimaryAddr(t)
	n, err := rhGetCount(addr, key, false)
	if err != nil {
		t.Fatalf("Count(%q) on %s: %v", key, addr, err)
	}
	return n
}

// ---------------------------------------------------------------- self-test

func TestTopologyHelpersStartAClusterAndFailOverASentinelSet(t *testing.T) {
	redisURLFromEnv(t)
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		c := startRedisCluster(t, 3)
		t.Logf("cluster of %v ready in %v", c.Addrs(), time.Since(start).Round(time.Millisecond))

		cc := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                    c.Addrs(),
			DisableIdentity:          true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		t.Cleanup(func() { _ = cc.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()

		const key = "rh:topology:{k}"
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
		if got := c.Count(t, "rh:topology:missing"); got != 0 {
			t.Fatalf("Count of a missing key = %d, want 0", got)
		}

		// Half-way through a migration the key is on the target: the
		// source answers ASK, which the cluster client and Count follow,
		// and the target TRYAGAIN to a command on both keys of the slot.
		const key2 = "rh:topology:{k}:2"
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
		if _, err := rhDo(owner, "GET", key); err == nil || !strings.HasPrefix(err.Error(), "ASK ") {
			t.Fatalf("GET on the source mid-migration: %v, want an ASK redirection", err)
		}
		if got := c.Count(t, key); got != 5 {
			t.Fatalf("Count mid-migration = %d, want 5", got)
		}
		tc := rhClient(to, rhCmdTimeout)
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
		s := startRedisSentinel(t)
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

		const key = "rh:topology:k"
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
		err = rhPoll(10*time.Second, func() error { return fc.Incr(ctx, key).Err() })
		if err != nil {
			t.Fatalf("INCR through the failover client after the failover: %v", err)
		}
		t.Logf("failover client writing again %v after the kill", time.Since(killed).Round(time.Millisecond))
		if got := s.Count(t, key); got < 6 {
			t.Fatalf("Count after INCR = %d, want at least 6", got)
		}
	})
}
