package ratelimit

// Test-only helpers for the Redis tests:
//
//   - redisURLFromEnv: the switch that turns the Redis tests on (./test.sh sets it).
//   - startRedis: a throwaway redis-server per test, which a test can stop and
//     start again on the same port (Redis outages).
//   - newResetProxy: a TCP proxy that kills the connections open at a given
//     moment at their next command (a connection dying while a command is in
//     flight), which go-redis cannot notice in advance.
//
// Every identifier not named above is prefixed with "rh" to keep clear of the
// names used by the package's other test files.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// rhRedisURLEnv enables the Redis tests. Its value is the URL of a Redis the
// tests may use; tests that need a server of their own use startRedis.
const rhRedisURLEnv = "ROLTER_TEST_REDIS_URL"

// rhReadyTimeout bounds how long a freshly started redis-server may take to
// answer PING.
const rhReadyTimeout = 5 * time.Second

// redisURLFromEnv returns ROLTER_TEST_REDIS_URL, or skips the test when it is
// unset.
func redisURLFromEnv(t testing.TB) string {
	t.Helper()
	u := os.Getenv(rhRedisURLEnv)
	if u == "" {
		t.Skip("set ROLTER_TEST_REDIS_URL to run the Redis tests (./test.sh does)")
	}
	return u
}

// testRedis is a throwaway redis-server on a loopback port, owned by one test.
// Stop and Start may be called from any goroutine, but not concurrently with
// each other.
type testRedis struct {
	bin  string
	dir  string
	port int

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has exited
	foreign bool          // the last launch found another server on the port
}

// startRedis starts a redis-server (no persistence, own temp dir) on a free
// loopback port and waits until it answers commands (polled with INFO server,
// which also tells that the answer comes from this process). It skips when the Redis tests
// are disabled (see redisURLFromEnv) and fails when they are enabled but
// redis-server is not on PATH. The server is killed in t.Cleanup.
func startRedis(t testing.TB) *testRedis {
	t.Helper()
	r := &testRedis{bin: rhRedisServerBin(t), dir: t.TempDir()}
	t.Cleanup(func() { r.stop() })
	rhLaunchOnFreePort(t, r, nil)
	return r
}

// rhRedisServerBin skips when the Redis tests are disabled and fails when
// they are enabled but redis-server is not on PATH.
func rhRedisServerBin(t testing.TB) string {
	t.Helper()
	redisURLFromEnv(t)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("%s is set but redis-server is not on PATH (./test.sh installs it): %v", rhRedisURLEnv, err)
	}
	return bin
}

// rhLaunchOnFreePort starts r on a free port. The port is found free and
// then handed to redis-server, so another process may take it in between:
// it tries a few ports. prepare, if not nil, runs before each attempt.
func rhLaunchOnFreePort(t testing.TB, r *testRedis, prepare func() error) {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := rhFreePort()
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		r.port = port
		if prepare != nil {
			if err := prepare(); err != nil {
				t.Fatalf("preparing redis-server in %s: %v", r.dir, err)
			}
		}
		if lastErr = r.launch(); lastErr == nil {
			return
		}
		r.stop()
		// ETXTBSY: a child forked elsewhere in the test binary while a
		// wrapper script was open for writing still held it when we exec'd it.
		if errors.Is(lastErr, syscall.ETXTBSY) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !r.portTaken() {
			break
		}
	}
	t.Fatalf("starting %s: %v", r.bin, lastErr)
}

// URL is the server's address as a redis:// URL, database 0.
func (r *testRedis) URL() string { return "redis://" + r.Addr() + "/0" }

// Addr is the server's host:port.
func (r *testRedis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Stop kills the server and waits for it to exit. The port stays the
// server's: Start brings it back there. Stopping a stopped server does nothing.
func (r *testRedis) Stop(t testing.TB) {
	t.Helper()
	r.stop()
}

// Start starts the stopped server again on the same port (with an empty
// dataset) and waits until it answers PING.
func (r *testRedis) Start(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	running := r.cmd != nil
	r.mu.Unlock()
	if running {
		t.Fatalf("redis-server on %s is already running", r.Addr())
	}
	if err := r.launch(); err != nil {
		r.stop()
		t.Fatalf("restarting redis-server on %s: %v", r.Addr(), err)
	}
}

func (r *testRedis) logPath() string { return filepath.Join(r.dir, "redis.log") }

// launch starts redis-server on r.port and waits until it answers (and is the
// process answering) or exits. On error the process may still be running; the caller stops it.
func (r *testRedis) launch() error {
	r.foreign = false
	logf, err := os.OpenFile(r.logPath(), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(r.bin,
		"--port", strconv.Itoa(r.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", r.dir,
	)
	cmd.Dir = r.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()

	deadline := time.Now().Add(rhReadyTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		// Dial first: go-redis logs every failed dial, PING only once the
		// port accepts connections.
		c, err := net.DialTimeout("tcp", r.Addr(), 500*time.Millisecond)
		if err == nil {
			_ = c.Close()
			var pid int
			if pid, err = rhServerPID(r.Addr(), 500*time.Millisecond); err == nil {
				if pid != cmd.Process.Pid {
					// Another server took the port before ours could.
					r.foreign = true
					return fmt.Errorf("%s is served by process %d, not our redis-server (%d)", r.Addr(), pid, cmd.Process.Pid)
				}
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to PING within %v: %v; log:\n%s", rhReadyTimeout, err, r.log())
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server exited before answering PING; log:\n%s", r.log())
		case <-tick.C:
		}
	}
}

// stop kills the process, if any, and waits for it to exit.
func (r *testRedis) stop() {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.cmd, r.done = nil, nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

func (r *testRedis) log() string {
	b, _ := os.ReadFile(r.logPath())
	return string(b)
}

func (r *testRedis) portTaken() bool {
	return r.foreign || strings.Contains(r.log(), "Address already in use")
}

// rhFreePort returns a loopback TCP port that was free a moment ago.
func rhFreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// rhServerPID asks the Redis at addr for its process id (INFO server), which
// also tells that it answers commands.
func rhServerPID(addr string, timeout time.Duration) (int, error) {
	c := rhClient(addr, timeout)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("no process_id in INFO server of %s", addr)
}

// rhPingOnce sends one PING to addr.
func rhPingOnce(addr string, timeout time.Duration) error {
	c := rhClient(addr, timeout)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Ping(ctx).Err()
}

// rhClient is a one-shot client (a client whose dials failed refuses to dial
// again for about a second, so polling uses a fresh one each time).
func rhClient(addr string, timeout time.Duration) *redis.Client {
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

// resetProxy is a TCP proxy on a loopback port in front of a Redis. After
// ResetAtNextCommand, each connection that was open then dies when its client
// next sends anything: the bytes are not forwarded, the client side is closed
// with an RST and the upstream side is closed. go-redis checks idle pooled
// connections before handing them out and quietly drops those the server has
// closed, so a plain close is invisible to it; this proxy instead makes a
// connection fail in the middle of a command, after it was handed out.
type resetProxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[*rhProxyConn]struct{}
	closed bool

	closeOnce sync.Once
}

type rhProxyConn struct {
	client, upstream *net.TCPConn
	armed            atomic.Bool
	once             sync.Once
}

// newResetProxy starts a proxy to target (host:port) on a free loopback port.
// It is closed, with all its connections, in t.Cleanup.
func newResetProxy(t testing.TB, target string) *resetProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("reset proxy: listen: %v", err)
	}
	p := &resetProxy{target: target, ln: ln, conns: make(map[*rhProxyConn]struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port; point the client here.
func (p *resetProxy) Addr() string { return p.ln.Addr().String() }

// ResetAtNextCommand arms every connection open now: the next bytes its client
// sends are dropped and the connection is reset. Connections accepted later
// work normally (as does one accepted but not yet connected upstream now).
func (p *resetProxy) ResetAtNextCommand() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pc := range p.conns {
		pc.armed.Store(true)
	}
}

// Connections is the number of client connections open through the proxy.
func (p *resetProxy) Connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines. It is safe to call more than once.
func (p *resetProxy) Close() {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		open := make([]*rhProxyConn, 0, len(p.conns))
		for pc := range p.conns {
			open = append(open, pc)
		}
		p.mu.Unlock()
		_ = p.ln.Close()
		for _, pc := range open {
			p.closeConn(pc, false)
		}
		p.wg.Wait()
	})
}

func (p *resetProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // listener closed
		}
		p.wg.Add(1)
		go p.serve(c.(*net.TCPConn))
	}
}

func (p *resetProxy) serve(client *net.TCPConn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	pc := &rhProxyConn{client: client, upstream: up.(*net.TCPConn)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = client.Close()
		_ = up.Close()
		return
	}
	p.conns[pc] = struct{}{}
	p.mu.Unlock()

	// upstream -> client
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_, _ = io.Copy(pc.client, pc.upstream)
		p.closeConn(pc, false)
	}()

	// client -> upstream, checking the trigger before forwarding anything.
	buf := make([]byte, 32<<10)
	for {
		n, err := pc.client.Read(buf)
		if n > 0 {
			if pc.armed.Load() {
				p.closeConn(pc, true)
				return
			}
			if _, werr := pc.upstream.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	p.closeConn(pc, false)
}

// closeConn closes both sides of pc once; with reset, the client side is
// closed with an RST rather than a FIN.
func (p *resetProxy) closeConn(pc *rhProxyConn, reset bool) {
	pc.once.Do(func() {
		if reset {
			_ = pc.client.SetLinger(0)
		}
		_ = pc.client.Close()
		_ = pc.upstream.Close()
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	})
}

// TestResetProxyKillsConnectionAtNextCommand checks the proxy against go-redis
// with both protocols. With RESP3 (go-redis's default) the reset surfaces as
// io.EOF, not ECONNRESET: before reading a reply go-redis peeks for push
// notifications, that peek consumes the socket's ECONNRESET and its error is
// ignored, and the reply read then finds end of file. Callers classifying
// "connection lost mid-command" must accept both.
func TestResetProxyKillsConnectionAtNextCommand(t *testing.T) {
	r := startRedis(t)
	for _, tc := range []struct {
		protocol int
		want     error
	}{
		{2, syscall.ECONNRESET},
		{3, io.EOF},
	} {
		t.Run(fmt.Sprintf("RESP%d", tc.protocol), func(t *testing.T) {
			rhCheckResetProxy(t, r.Addr(), tc.protocol, tc.want)
		})
	}
}

func rhCheckResetProxy(t *testing.T, redisAddr string, protocol int, wantErr error) {
	p := newResetProxy(t, redisAddr)
	c := redis.NewClient(&redis.Options{
		Addr:                     p.Addr(),
		Protocol:                 protocol,
		PoolSize:                 1,
		MaxRetries:               -1,
		DialerRetries:            1,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING through the proxy: %v", err)
	}
	id1, err := c.ClientID(ctx).Result()
	if err != nil {
		t.Fatalf("CLIENT ID: %v", err)
	}
	if n := p.Connections(); n != 1 {
		t.Fatalf("proxy has %d connections, want 1", n)
	}

	p.ResetAtNextCommand()
	err = c.Ping(ctx).Err()
	if err == nil {
		t.Fatal("PING on the armed connection succeeded, want it to fail")
	}
	if !errors.Is(err, wantErr) {
		t.Fatalf("PING on the armed connection: got %v (%T), want %v", err, err, wantErr)
	}

	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING on a new connection after the reset: %v", err)
	}
	id2, err := c.ClientID(ctx).Result()
	if err != nil {
		t.Fatalf("CLIENT ID after the reset: %v", err)
	}
	if id2 == id1 {
		t.Fatalf("still on connection %d after the reset, want a new one", id1)
	}
	deadline := time.Now().Add(2 * time.Second)
	for p.Connections() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("proxy has %d connections after the reset, want 1", p.Connections())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
