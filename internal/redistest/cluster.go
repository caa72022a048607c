package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rolter/caddy-ratelimit/internal/poll"
)

// topologyReadyTimeout bounds how long a cluster or a sentinel set may take
// to become usable once its processes run (normally about 2 s).
const topologyReadyTimeout = 20 * time.Second

// Cluster is a throwaway Redis Cluster: primaries only, the slots split
// evenly in start order. Nodes announce 127.0.0.1; each is a Server, which
// a test may Stop and Start.
type Cluster struct {
	nodes []*Server
}

// NewCluster starts primaries cluster-enabled redis-servers (own
// dirs and nodes.conf, no persistence, node timeout 2 s), gives each an
// even share of the slots, joins them and waits until every node reports
// cluster_state:ok, all slots assigned and all nodes known. It skips or
// fails as EnvURL does; every node is stopped in t.Cleanup.
//
// Startup takes about 2.2 s, and cannot take much less: a primary reports
// cluster_state:ok no sooner than 2 s after it started (Redis's
// CLUSTER_WRITABLE_DELAY). redis-cli --cluster create is not used: it sleeps
// a second twice and, under load, took up to 4.4 s where this takes 2.2 s.
func NewCluster(t testing.TB, primaries int) *Cluster {
	t.Helper()
	EnvURL(t)
	c, err := startCluster(primaries, func() (string, error) { return t.TempDir(), nil })
	if c != nil {
		t.Cleanup(c.stopNodes)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// StartCluster is NewCluster for a cluster that outlives a test: tests of
// one package that share it, each with ids of its own and none changing
// its topology, spare 2 s each. Its caller stops it (Stop).
func StartCluster(primaries int) (*Cluster, error) {
	c, err := startCluster(primaries, func() (string, error) { return os.MkdirTemp("", "rolter-cluster-") })
	if err != nil && c != nil {
		c.Stop()
	}
	return c, err
}

// Stop stops a cluster of StartCluster's and removes its dirs.
func (c *Cluster) Stop() {
	c.stopNodes()
	for _, n := range c.nodes {
		os.RemoveAll(n.dir)
	}
}

func (c *Cluster) stopNodes() {
	for _, n := range c.nodes {
		n.Stop()
	}
}

// startCluster starts a cluster whose nodes' dirs dir makes; on an error,
// what it started is in the cluster it returns, if any.
func startCluster(primaries int, dir func() (string, error)) (*Cluster, error) {
	if primaries < 1 {
		return nil, fmt.Errorf("NewCluster: %d primaries", primaries)
	}
	c := &Cluster{}
	for range primaries {
		d, err := dir()
		if err != nil {
			return c, err
		}
		conf := filepath.Join(d, "nodes.conf")
		n, err := start(d, nil, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", conf,
			"--cluster-node-timeout", "2000",
		}, func() error {
			// A failed attempt may have written a node id for another port.
			if err := os.Remove(conf); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			return nil
		})
		if err != nil {
			return c, err
		}
		c.nodes = append(c.nodes, n)
	}

	// What redis-cli --cluster create does for primaries only, without its
	// two one-second sleeps: even slot ranges, distinct config epochs, MEET.
	for i, n := range c.nodes {
		first, last := i*16384/primaries, (i+1)*16384/primaries-1
		for _, cmd := range [][]any{
			{"CLUSTER", "ADDSLOTSRANGE", first, last},
			{"CLUSTER", "SET-CONFIG-EPOCH", i + 1},
		} {
			if _, err := do(n.Addr(), cmd...); err != nil {
				return c, fmt.Errorf("%v on %s: %v", cmd, n.Addr(), err)
			}
		}
	}
	// Every pair meets directly: gossip alone can take a second or two more
	// to tell the nodes each other's slots.
	for i, a := range c.nodes {
		for _, b := range c.nodes[i+1:] {
			if _, err := do(a.Addr(), "CLUSTER", "MEET", "127.0.0.1", b.port); err != nil {
				return c, fmt.Errorf("CLUSTER MEET %s on %s: %v", b.Addr(), a.Addr(), err)
			}
		}
	}

	want := strconv.Itoa(primaries)
	err := poll.Until(topologyReadyTimeout, pollEvery, func() error {
		for _, n := range c.nodes {
			v, err := do(n.Addr(), "CLUSTER", "INFO")
			if err != nil {
				return fmt.Errorf("CLUSTER INFO on %s: %v", n.Addr(), err)
			}
			info, _ := v.(string)
			lines := map[string]bool{}
			for l := range strings.SplitSeq(info, "\n") {
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
		return c, fmt.Errorf("cluster not ready within %v: %v", topologyReadyTimeout, err)
	}
	return c, nil
}

// Addrs are the nodes' host:port, in start order.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Addr()
	}
	return out
}

// URLs are the nodes as redis://127.0.0.1:N (no database: a cluster has only 0).
func (c *Cluster) URLs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = "redis://" + n.Addr()
	}
	return out
}

// Node is the node at addr (to Stop and Start it), or nil.
func (c *Cluster) Node(addr string) *Server {
	for _, n := range c.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// ask sends a command to the first node that answers (tests may stop nodes).
func (c *Cluster) ask(args ...any) (any, error) {
	var errs []error
	for _, n := range c.nodes {
		v, err := do(n.Addr(), args...)
		if err == nil {
			return v, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", n.Addr(), err))
	}
	return nil, errors.Join(errs...)
}

// KeySlot is key's hash slot (CLUSTER KEYSLOT). It panics when no node answers.
func (c *Cluster) KeySlot(key string) int {
	v, err := c.ask("CLUSTER", "KEYSLOT", key)
	if err != nil {
		panic(fmt.Sprintf("Cluster.KeySlot(%q): %v", key, err))
	}
	return int(v.(int64))
}

// SlotOwner is the host:port of the node serving key's slot, per CLUSTER
// SLOTS of the first node that answers. During a migration that is still the
// source node. It panics when no node answers.
func (c *Cluster) SlotOwner(key string) string {
	addr, err := c.slotOwner(c.KeySlot(key))
	if err != nil {
		panic(fmt.Sprintf("Cluster.SlotOwner(%q): %v", key, err))
	}
	return addr
}

func (c *Cluster) slotOwner(slot int) (string, error) {
	var errs []error
	for _, n := range c.nodes {
		cl := Client(n.Addr(), cmdTimeout)
		ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
		shards, err := cl.ClusterShards(ctx).Result()
		cancel()
		_ = cl.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("CLUSTER SHARDS on %s: %w", n.Addr(), err))
			continue
		}
		for _, shard := range shards {
			for _, r := range shard.Slots {
				if int64(slot) < r.Start || int64(slot) > r.End {
					continue
				}
				for _, node := range shard.Nodes {
					if node.Role == "master" {
						return net.JoinHostPort(node.IP, strconv.FormatInt(node.Port, 10)), nil
					}
				}
			}
		}
		return "", fmt.Errorf("slot %d is not assigned per %s", slot, n.Addr())
	}
	return "", errors.Join(errs...)
}

// Count is GET key as an integer on the node serving it, 0 when missing.
// It follows one MOVED or ASK redirection (a slot being migrated).
func (c *Cluster) Count(t testing.TB, key string) int64 {
	t.Helper()
	addr, err := c.slotOwner(c.KeySlot(key))
	if err != nil {
		t.Fatalf("Count(%q): %v", key, err)
	}
	n, err := getCount(addr, key, false)
	if err != nil {
		// "MOVED 1234 127.0.0.1:7001" or "ASK 1234 127.0.0.1:7001"
		f := strings.Fields(err.Error())
		if len(f) == 3 && (f[0] == "MOVED" || f[0] == "ASK") {
			n, err = getCount(f[2], key, f[0] == "ASK")
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
func (c *Cluster) MigrateSlot(t testing.TB, slot int, to string) {
	t.Helper()
	m := c.BeginSlotMigration(t, slot, to)
	if m != nil {
		m.Finish(t)
	}
}

// SlotMigration is a slot half-way from one node to another. The source
// answers ASK to a command on a key of the slot it no longer has; the target
// serves such a command when ASKING precedes it, except a multi-key one (a
// script with several keys too) whose keys are not all there yet, which gets
// TRYAGAIN.
type SlotMigration struct {
	c            *Cluster
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
func (c *Cluster) BeginSlotMigration(t testing.TB, slot int, to string) *SlotMigration {
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
	m := &SlotMigration{c: c, slot: slot, from: from, to: to}
	if m.toHost, m.toPort, err = splitAddr(to); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		addr string
		id   *string
	}{{from, &m.fromID}, {to, &m.toID}} {
		v, err := do(x.addr, "CLUSTER", "MYID")
		if err != nil {
			t.Fatalf("CLUSTER MYID on %s: %v", x.addr, err)
		}
		*x.id, _ = v.(string)
	}
	// Importing first, as redis-cli does: a client sent by the source's ASK
	// must find the target ready.
	if _, err := do(to, "CLUSTER", "SETSLOT", slot, "IMPORTING", m.fromID); err != nil {
		t.Fatalf("CLUSTER SETSLOT %d IMPORTING on %s: %v", slot, to, err)
	}
	if _, err := do(from, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.toID); err != nil {
		t.Fatalf("CLUSTER SETSLOT %d MIGRATING on %s: %v", slot, from, err)
	}
	return m
}

// MoveKeys moves keys (which must be in the slot; missing ones are ignored)
// from the source to the target with MIGRATE.
func (m *SlotMigration) MoveKeys(t testing.TB, keys ...string) {
	t.Helper()
	if len(keys) == 0 {
		return
	}
	args := []any{"MIGRATE", m.toHost, m.toPort, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	v, err := do(m.from, args...)
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
func (m *SlotMigration) Finish(t testing.TB) {
	t.Helper()
	if m.finished {
		return
	}
	for {
		v, err := do(m.from, "CLUSTER", "GETKEYSINSLOT", m.slot, 100)
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
		if _, err := do(a, "CLUSTER", "SETSLOT", m.slot, "NODE", m.toID); err != nil {
			t.Fatalf("CLUSTER SETSLOT %d NODE on %s: %v", m.slot, a, err)
		}
	}
	m.finished = true
}

// getCount reads key on addr as an integer, 0 when missing. With asking it
// sends ASKING first on the same connection (a key of a slot being imported).
func getCount(addr, key string, asking bool) (int64, error) {
	c := Client(addr, cmdTimeout)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
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

func splitAddr(addr string) (host string, port int, err error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err = strconv.Atoi(p)
	return host, port, err
}
