package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/poll"
)

// answers reports whether something accepts connections on addr.
func answers(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

func TestServerIsOurProcessOnLoopbackWithoutPersistenceInItsDir(t *testing.T) {
	s := NewServer(t)
	if host, _, _ := net.SplitHostPort(s.Addr()); host != "127.0.0.1" {
		t.Fatalf("Addr = %s, want a 127.0.0.1 address", s.Addr())
	}
	if want := "redis://" + s.Addr() + "/0"; s.URL() != want {
		t.Fatalf("URL = %s, want %s", s.URL(), want)
	}
	pid, err := infoField(s.Addr(), "server", "process_id")
	if err != nil || pid != strconv.Itoa(s.PID()) {
		t.Fatalf("INFO server process_id = %q (%v), want our process %d", pid, err, s.PID())
	}
	c := Client(s.Addr(), cmdTimeout)
	defer c.Close()
	for param, want := range map[string]string{"bind": "127.0.0.1", "save": "", "appendonly": "no", "dir": s.dir} {
		got, err := c.ConfigGet(context.Background(), param).Result()
		if err != nil || got[param] != want {
			t.Errorf("CONFIG GET %s = %v (%v), want %q", param, got, err, want)
		}
	}
}

func TestStoppedServerStartsAgainOnItsPortWithAnEmptyDataset(t *testing.T) {
	s := NewServer(t)
	addr, pid := s.Addr(), s.PID()
	if _, err := do(addr, "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if answers(addr) || s.PID() != 0 {
		t.Fatalf("after Stop: %s answers: %v, PID %d; want no answer and PID 0", addr, answers(addr), s.PID())
	}
	s.Stop() // a stopped server stops again without complaint
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr || s.PID() == pid || s.PID() == 0 {
		t.Fatalf("after Start: %s, PID %d; want %s and a new process (was %d)", s.Addr(), s.PID(), addr, pid)
	}
	if n, err := do(addr, "DBSIZE"); err != nil || n != int64(0) {
		t.Fatalf("DBSIZE after Start = %v (%v), want 0", n, err)
	}
	if err := s.Start(); err == nil {
		t.Fatal("Start of a running server succeeded, want an error")
	}
}

func TestHungServerAcceptsConnectionsButAnswersNothingUntilItResumes(t *testing.T) {
	s := NewServer(t)
	resume := s.Hang(t)
	if !answers(s.Addr()) {
		t.Fatalf("hung server on %s refuses connections, want the kernel to accept them", s.Addr())
	}
	c := Client(s.Addr(), 100*time.Millisecond)
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("hung server answered PING")
	}
	resume()
	if _, err := do(s.Addr(), "PING"); err != nil {
		t.Fatalf("PING after resume: %v", err)
	}
}

func TestLaunchOnAPortAnotherServerHoldsFailsAndSeesThePortTaken(t *testing.T) {
	other := NewServer(t)
	s := &Server{bin: other.bin, dir: t.TempDir(), port: other.port}
	t.Cleanup(s.Stop)
	err := s.launch()
	if err == nil {
		t.Fatalf("launch on %s, held by process %d, succeeded", other.Addr(), other.PID())
	}
	if !s.portTaken() {
		t.Fatalf("launch on a port held by another server: %v; portTaken is false, so start would not try another port", err)
	}
}

// fakeTB records what EnvURL asks of a test instead of doing it.
type fakeTB struct {
	testing.TB
	skipped, failed bool
}

func (f *fakeTB) Skipf(string, ...any)  { f.skipped = true }
func (f *fakeTB) Fatalf(string, ...any) { f.failed = true }

func TestEnvURLSkipsWithoutRedisButFailsInCI(t *testing.T) {
	for _, tc := range []struct {
		url, ci      string
		skip, fail   bool
		wantReturned string
	}{
		{url: "redis://127.0.0.1:1/0", ci: "true", wantReturned: "redis://127.0.0.1:1/0"},
		{url: "redis://127.0.0.1:1/0", wantReturned: "redis://127.0.0.1:1/0"},
		{skip: true},
		{ci: "false", skip: true},
		{ci: "true", fail: true},
		{ci: "1", fail: true},
	} {
		t.Setenv(URLEnv, tc.url)
		t.Setenv("CI", tc.ci)
		f := &fakeTB{TB: t}
		got := EnvURL(f)
		if got != tc.wantReturned || f.skipped != tc.skip || f.failed != tc.fail {
			t.Errorf("%s=%q CI=%q: EnvURL = %q, skipped %v, failed %v; want %q, %v, %v",
				URLEnv, tc.url, tc.ci, got, f.skipped, f.failed, tc.wantReturned, tc.skip, tc.fail)
		}
	}
}

// ownerDirEnv makes TestServerDiesWithTheProcessThatStartedIt's binary the
// owner: it starts a server in that dir, prints its address and waits.
const ownerDirEnv = "REDISTEST_OWNER_DIR"

func TestServerDiesWithTheProcessThatStartedIt(t *testing.T) {
	if dir := os.Getenv(ownerDirEnv); dir != "" {
		s, err := Start(dir)
		if err != nil {
			t.Fatal(err)
		}
		os.Stdout.WriteString(s.Addr() + "\n")
		time.Sleep(time.Minute) // killed long before
		return
	}
	if diesWithOwner() == nil {
		t.Skip("the kernel cannot tie a server's life to its owner's here")
	}
	EnvURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	owner := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+t.Name()+"$")
	owner.Env = append(os.Environ(), ownerDirEnv+"="+t.TempDir())
	out, err := owner.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	addr := strings.TrimSpace(line)
	if err != nil || !answers(addr) {
		_ = owner.Process.Kill()
		_ = owner.Wait()
		t.Fatalf("the owner printed %q (%v), not the address of a server that answers", line, err)
	}
	_ = owner.Process.Kill()
	_ = owner.Wait()
	if err := poll.Until(5*time.Second, pollEvery, func() error {
		if answers(addr) {
			return fmt.Errorf("%s still answers", addr)
		}
		return nil
	}); err != nil {
		t.Fatalf("5 s after its owner was killed: %v", err)
	}
}
