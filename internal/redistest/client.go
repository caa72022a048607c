package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// UniqueID is an ID no other test uses, which keeps the tests' counters
// apart in a Redis they share.
func UniqueID(t testing.TB) string {
	var b [6]byte
	rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:])
}

// TestClient is a client of the Redis at url, closed in t.Cleanup.
func TestClient(t testing.TB, url string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// CommandStats sums the calls and the microseconds that the Redis of c has
// spent in the named commands (INFO commandstats; "evalsha", "eval").
func CommandStats(t testing.TB, c *redis.Client, commands ...string) (calls int64, usec float64) {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		name, stats, _ := strings.Cut(line, ":")
		if !commandNamed(name, commands) {
			continue
		}
		for field := range strings.SplitSeq(stats, ",") {
			key, v, _ := strings.Cut(field, "=")
			switch key {
			case "calls":
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("%s: %v", line, err)
				}
				calls += n
			case "usec":
				n, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("%s: %v", line, err)
				}
				usec += n
			}
		}
	}
	return calls, usec
}

func commandNamed(stat string, commands []string) bool {
	for _, c := range commands {
		if stat == "cmdstat_"+c {
			return true
		}
	}
	return false
}

// ScriptCalls is how many scripts the Redis at url has run: EVALSHA, and
// the EVAL that go-redis sends after a NOSCRIPT.
func ScriptCalls(t testing.TB, url string) int64 {
	t.Helper()
	calls, _ := CommandStats(t, TestClient(t, url), "evalsha", "eval")
	return calls
}
