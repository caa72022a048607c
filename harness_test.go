package ratelimit

// The tests' harness, by concern:
//
//   - this file: eventually, the one wait for what nothing signals (over
//     internal/poll, which the Redis harness shares);
//   - harness_caddy_test.go: the gateways under test, in this process or in
//     Caddy processes of their own, all on loopback, and the HTTP clients
//     that talk to them;
//   - harness_proc_*_test.go: a gateway process dies with the test binary;
//   - harness_upstream_test.go: the one fake upstream, whose modes play
//     each API a test needs;
//   - redis_test_helpers_test.go: the throwaway Redis servers and topologies;
//   - main_test.go: TestMain.

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/poll"
)

// waitBound bounds every wait of the tests for something that happens at
// once on an idle machine (a request answered, a charge landed, a slot
// freed). Under -race on a loaded machine it can take seconds; a test that
// passes never waits it out.
const waitBound = 10 * time.Second

// pollEvery is how often eventually asks again.
const pollEvery = 10 * time.Millisecond

// eventually returns once check finds nothing wrong (nil), asking it again
// every pollEvery; once waitBound has passed it fails the test with
// check's last complaint. It is for what nothing signals: a charge the
// gateway makes after its response, a counter in a store, a metric, a
// goroutine that has let go. Where something does signal (a channel, an
// answer), tests wait on that instead; a wait that may fail without
// failing the test calls poll.Until itself.
func eventually(t testing.TB, check func() error) {
	t.Helper()
	if err := poll.Until(waitBound, pollEvery, check); err != nil {
		t.Fatalf("after %v: %v", waitBound, err)
	}
}

// waitCount waits until count, of what, is want.
func waitCount(t testing.TB, what string, count func() int64, want int64) {
	t.Helper()
	eventually(t, func() error {
		if n := count(); n != want {
			return fmt.Errorf("%d %s, want %d", n, what, want)
		}
		return nil
	})
}

// A gateway whose port another socket takes between freePort's probe and
// Caddy's bind starts on another port, and serves there: in this process,
// and as a process of its own.
func TestAGatewayWhosePortIsTakenBeforeItBindsStartsOnAnother(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	takenFirst := func() func() int {
		first := true
		return func() int {
			if first {
				first = false
				return port
			}
			return freePort()
		}
	}
	up := newUpstream(t)
	gw := startGatewayOn(t, takenFirst(), up.URL, "", "\treverse_proxy {upstream}")
	p := startCaddyProcessOn(t, takenFirst(), caddyBinary(t), up.URL, "", "\treverse_proxy {upstream}")
	c := flightClient(t)
	for _, url := range []string{gw.url, p.url} {
		if url == fmt.Sprintf("http://127.0.0.1:%d", port) {
			t.Fatalf("a gateway says it serves on %d, the port another socket holds", port)
		}
		if a := post(c, url); a.err != nil || a.status != 200 || a.body != chatCompletion {
			t.Fatalf("the gateway at %s answered %d %s %v", url, a.status, a.body, a.err)
		}
	}
	if n := up.hits.Load(); n != 2 {
		t.Fatalf("the upstream saw %d requests, want one from each gateway", n)
	}
}
