package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// readyTimeout bounds how long a freshly started redis-server may take to
// answer.
const readyTimeout = 5 * time.Second

// Server is a throwaway redis-server on a loopback port. Stop and Start may
// be called from any goroutine, but not concurrently with each other.
type Server struct {
	bin       string
	dir       string
	pre, post []string // arguments before and after the harness's own
	port      int

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has exited
	foreign bool          // the last launch found another server on the port
}

// Start starts a redis-server in dir (its working directory and log) on a
// free loopback port, without persistence, and returns once it answers
// commands and is the process answering. The caller stops it.
func Start(dir string) (*Server, error) {
	return start(dir, nil, nil, nil)
}

// NewServer is Start for a test: it skips or fails as EnvURL does, runs the
// server in a temporary directory of the test's, fails the test when the
// server does not start and stops it in t.Cleanup.
func NewServer(t testing.TB) *Server {
	t.Helper()
	EnvURL(t)
	return startWith(t, t.TempDir(), nil, nil, nil)
}

// startWith is start for a test, which it fails when the server does not
// start; the server is stopped in t.Cleanup.
func startWith(t testing.TB, dir string, pre, post []string, prepare func() error) *Server {
	t.Helper()
	s, err := start(dir, pre, post, prepare)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// start runs redis-server <pre...> <the harness's options> <post...> (a
// config file must come first, and later options win). The port is found
// free and then handed to redis-server, so another process may take it in
// between: it tries a few ports. prepare, if not nil, runs before each
// attempt. On error nothing it started is left running.
func start(dir string, pre, post []string, prepare func() error) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not on PATH (./test.sh installs it): %w", err)
	}
	s := &Server{bin: bin, dir: dir, pre: pre, post: post}
	for range 5 {
		if s.port, err = freePort(); err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		if prepare != nil {
			if err := prepare(); err != nil {
				return nil, fmt.Errorf("preparing redis-server in %s: %w", dir, err)
			}
		}
		if err = s.launch(); err == nil {
			return s, nil
		}
		s.Stop()
		if !s.portTaken() {
			break
		}
	}
	return nil, fmt.Errorf("starting redis-server in %s: %w", dir, err)
}

// URL is the server's address as a redis:// URL, database 0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// PID is the process id of the running server, 0 when it is stopped.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop kills the server and waits for it to exit. The port stays the
// server's: Start brings it back there. Stopping a stopped server does
// nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Start starts the stopped server again on the same port, with the same
// options and an empty dataset, and waits until it answers.
func (s *Server) Start() error {
	s.mu.Lock()
	running := s.cmd != nil
	s.mu.Unlock()
	if running {
		return fmt.Errorf("redis-server on %s is already running", s.Addr())
	}
	if err := s.launch(); err != nil {
		s.Stop()
		return fmt.Errorf("restarting redis-server on %s: %w", s.Addr(), err)
	}
	return nil
}

// Restart starts the stopped server again, as Start does, and fails t if it
// does not answer.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "redis.log") }

// launch starts redis-server on s.port and waits until it answers (and is
// the process answering) or exits. On error the process may still be
// running; the caller stops it.
func (s *Server) launch() error {
	s.foreign = false
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	args := append(append([]string{}, s.pre...),
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", s.dir,
	)
	cmd := exec.Command(s.bin, append(args, s.post...)...)
	cmd.Dir = s.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = diesWithOwner()
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(readyTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		// Dial first: go-redis logs every failed dial, INFO only once the
		// port accepts connections.
		c, err := net.DialTimeout("tcp", s.Addr(), 500*time.Millisecond)
		if err == nil {
			_ = c.Close()
			var pid string
			if pid, err = infoField(s.Addr(), "server", "process_id"); err == nil {
				if pid != strconv.Itoa(cmd.Process.Pid) {
					// Another server took the port before ours could.
					s.foreign = true
					return fmt.Errorf("%s is served by process %s, not our redis-server (%d)", s.Addr(), pid, cmd.Process.Pid)
				}
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer within %v: %v; log:\n%s", readyTimeout, err, s.log())
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server exited before answering; log:\n%s", s.log())
		case <-tick.C:
		}
	}
}

func (s *Server) log() string {
	b, _ := os.ReadFile(s.logPath())
	return string(b)
}

func (s *Server) portTaken() bool {
	return s.foreign || strings.Contains(s.log(), "Address already in use")
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
