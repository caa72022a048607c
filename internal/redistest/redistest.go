// Package redistest starts throwaway Redis servers for the tests and the
// benchmark: redis-server processes on free loopback ports, each in a
// directory of its own and without persistence, checked to be the process
// that answers on their port, and killed when their owner stops them or dies.
//
// Start and Server serve commands as well as tests (cmd/withredis runs
// ./test.sh's tests and bench/run's Redis with them). The New functions are
// for tests: they skip or fail as EnvURL does, fail the test when a server
// does not start, and stop what they started in t.Cleanup.
package redistest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// URLEnv turns the Redis tests on. Its value is the URL of a Redis the tests
// may share; a test that needs a server of its own starts one with NewServer.
const URLEnv = "ROLTER_TEST_REDIS_URL"

// cmdTimeout bounds each command the harness sends.
const cmdTimeout = 2 * time.Second

// EnvURL returns the URL in URLEnv. Without it the Redis tests are off and
// the test is skipped, except in CI (CI=true), where every Redis test must
// run: there the test fails.
func EnvURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(URLEnv); u != "" {
		return u
	}
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatalf("CI is set and %s is not: in CI the Redis tests run, never skip (./test.sh starts a Redis for them)", URLEnv)
		return ""
	}
	t.Skipf("set %s to run the Redis tests (./test.sh does)", URLEnv)
	return ""
}

// Enabled reports whether the Redis tests run, as EnvURL decides: URLEnv is
// set, or CI is (where EnvURL then fails the test). A test that runs on
// Redis beside other stores in one go asks it before EnvURL.
func Enabled() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return os.Getenv(URLEnv) != "" || ci
}

// Client is a client of one connection that dials once and retries
// nothing, for one-shot checks: a client whose dials failed refuses to dial
// again for about a second, so a poll takes a fresh one each time.
func Client(addr string, timeout time.Duration) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                     addr,
		PoolSize:                 1,
		MaxRetries:               -1,
		DialerRetries:            1, // total attempts; 0 or less means 5
		DialTimeout:              timeout,
		ReadTimeout:              timeout,
		WriteTimeout:             timeout,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// do runs one command on addr with a fresh one-shot client.
func do(addr string, args ...any) (any, error) {
	c := Client(addr, cmdTimeout)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	return c.Do(ctx, args...).Result()
}

// infoField returns field of INFO section on addr.
func infoField(addr, section, field string) (string, error) {
	v, err := do(addr, "INFO", section)
	if err != nil {
		return "", err
	}
	s, _ := v.(string)
	for line := range strings.SplitSeq(s, "\n") {
		if val, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return val, nil
		}
	}
	return "", fmt.Errorf("no %s in INFO %s of %s", field, section, addr)
}

// pollEvery is how often this package's waits (poll.Until) ask again.
const pollEvery = 50 * time.Millisecond
