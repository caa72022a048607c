package redistest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/poll"
)

const (
	// failoverTimeout bounds WaitFailover. With down-after-milliseconds 1000
	// a failover normally takes 2-5 s; a split leader vote retries only after
	// twice failover-timeout (10 s).
	failoverTimeout = 20 * time.Second

	sentinelMaster = "mymaster"
)

// Sentinel is a throwaway primary, one replica and three sentinels
// monitoring them as "mymaster" (quorum 2, down-after-milliseconds 1000,
// failover-timeout 5000).
type Sentinel struct {
	data      []*Server // the initial primary, then the replica
	sentinels []*Server
}

// NewSentinel starts a primary, a replica of it (--replicaof) and,
// once the replica is in sync, three sentinels (redis-server sentinel.conf
// --sentinel). It waits until every sentinel lists the replica and the two
// other sentinels. It skips or fails as EnvURL does; every server is stopped
// in t.Cleanup. Startup takes about 2 s (sentinels find each other
// through hello messages, sent every 2 s).
func NewSentinel(t testing.TB) *Sentinel {
	t.Helper()
	EnvURL(t)
	s := &Sentinel{}
	// A primary waits 5 s (repl-diskless-sync-delay) for more replicas
	// before a full sync; both nodes may become the primary.
	noDelay := []string{"--repl-diskless-sync-delay", "0"}
	primary := startWith(t, t.TempDir(), nil, noDelay, nil)
	replica := startWith(t, t.TempDir(), nil,
		slices.Concat(noDelay, []string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.port)}), nil)
	s.data = []*Server{primary, replica}

	err := poll.Until(topologyReadyTimeout, pollEvery, func() error {
		st, err := infoField(replica.Addr(), "replication", "master_link_status")
		if err == nil && st != "up" {
			err = fmt.Errorf("replica %s: master_link_status:%s", replica.Addr(), st)
		}
		return err
	})
	if err != nil {
		t.Fatalf("replica not in sync within %v: %v", topologyReadyTimeout, err)
	}

	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n"+
		"sentinel failover-timeout %[1]s 5000\n"+
		"sentinel parallel-syncs %[1]s 1\n", sentinelMaster, primary.port)
	for range 3 {
		dir := t.TempDir()
		file := filepath.Join(dir, "sentinel.conf")
		// Port and dir come from the harness's options; sentinel rewrites
		// the file (myid, epochs, known peers), hence afresh per attempt.
		s.sentinels = append(s.sentinels, startWith(t, dir, []string{file, "--sentinel"}, nil,
			func() error { return os.WriteFile(file, []byte(conf), 0o600) }))
	}

	err = poll.Until(topologyReadyTimeout, pollEvery, func() error {
		for _, sn := range s.sentinels {
			for _, x := range []struct {
				what string
				want int
			}{{"replicas", 1}, {"sentinels", len(s.sentinels) - 1}} {
				v, err := do(sn.Addr(), "SENTINEL", x.what, sentinelMaster)
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
		t.Fatalf("sentinels not ready within %v: %v", topologyReadyTimeout, err)
	}
	return s
}

// MasterName is the name the sentinels monitor the primary under.
func (s *Sentinel) MasterName() string { return sentinelMaster }

// SentinelAddrs are the sentinels' host:port.
func (s *Sentinel) SentinelAddrs() []string {
	out := make([]string, len(s.sentinels))
	for i, n := range s.sentinels {
		out[i] = n.Addr()
	}
	return out
}

// FailoverURL is the set in go-redis's ParseFailoverURL form:
// redis://S1/0?master_name=mymaster&addr=S2&addr=S3.
func (s *Sentinel) FailoverURL() string {
	a := s.SentinelAddrs()
	q := url.Values{"master_name": {sentinelMaster}, "addr": a[1:]}
	return "redis://" + a[0] + "/0?" + q.Encode()
}

// PrimaryAddr is the primary's host:port as the first sentinel that answers
// announces it (SENTINEL get-master-addr-by-name).
func (s *Sentinel) PrimaryAddr(t testing.TB) string {
	t.Helper()
	var errs []error
	for _, sn := range s.sentinels {
		addr, err := announcedPrimary(sn.Addr())
		if err == nil {
			return addr
		}
		errs = append(errs, err)
	}
	t.Fatalf("no sentinel announces the primary: %v", errors.Join(errs...))
	return ""
}

func announcedPrimary(sentinel string) (string, error) {
	v, err := do(sentinel, "SENTINEL", "get-master-addr-by-name", sentinelMaster)
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
func (s *Sentinel) KillPrimary(t testing.TB) string {
	t.Helper()
	addr := s.PrimaryAddr(t)
	for _, n := range s.data {
		if n.Addr() == addr {
			n.Stop()
			return addr
		}
	}
	t.Fatalf("the announced primary %s is none of the data nodes", addr)
	return ""
}

// WaitFailover waits until every sentinel that answers announces the same
// primary, other than old, and that node answers ROLE with master; it
// returns its address. It fails after failoverTimeout.
func (s *Sentinel) WaitFailover(t testing.TB, old string) string {
	t.Helper()
	var primary string
	err := poll.Until(failoverTimeout, pollEvery, func() error {
		primary = ""
		seen := map[string][]string{}
		for _, sn := range s.sentinels {
			addr, err := announcedPrimary(sn.Addr())
			if err != nil {
				continue // a test may have stopped this sentinel
			}
			seen[addr] = append(seen[addr], sn.Addr())
			primary = addr
		}
		if len(seen) != 1 || primary == old {
			return fmt.Errorf("sentinels announce (primary: sentinels) %v", seen)
		}
		v, err := do(primary, "ROLE")
		if err != nil {
			return fmt.Errorf("ROLE on %s: %v", primary, err)
		}
		if l, _ := v.([]any); len(l) == 0 || l[0] != "master" {
			return fmt.Errorf("%s is announced but answers ROLE %v", primary, v)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("no failover away from %s within %v: %v", old, failoverTimeout, err)
	}
	return primary
}

// Count is GET key as an integer on the current primary, 0 when missing.
func (s *Sentinel) Count(t testing.TB, key string) int64 {
	t.Helper()
	addr := s.PrimaryAddr(t)
	n, err := getCount(addr, key, false)
	if err != nil {
		t.Fatalf("Count(%q) on %s: %v", key, addr, err)
	}
	return n
}
