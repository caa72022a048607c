package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// addrOf is the host:port of a redis://host:port/0 URL.
func addrOf(t *testing.T, url string) string {
	t.Helper()
	m := regexp.MustCompile(`^redis://(127\.0\.0\.1:\d+)/0$`).FindStringSubmatch(url)
	if m == nil {
		t.Fatalf("%q is not a redis://127.0.0.1:PORT/0 URL", url)
	}
	return m[1]
}

// pingErr is the error of one PING to addr, nil when a server answers.
func pingErr(addr string) error {
	c := redistest.Client(addr, 2*time.Second)
	defer c.Close()
	return c.Ping(context.Background()).Err()
}

func ping(t *testing.T, addr string) {
	t.Helper()
	if err := pingErr(addr); err != nil {
		t.Fatalf("PING %s: %v", addr, err)
	}
}

func noServerAt(t *testing.T, addr string) {
	t.Helper()
	if pingErr(addr) == nil {
		t.Fatalf("%s still answers PING after withredis returned", addr)
	}
}

func TestCommandRunsWithTheServersURLAndTheServerStopsWithIt(t *testing.T) {
	redistest.EnvURL(t)
	// The command prints its URL and runs until the test, having pinged
	// the server, creates done.
	done := filepath.Join(t.TempDir(), "done")
	script := `echo "$` + redistest.URLEnv + `"; while [ ! -e "$1" ]; do sleep 0.02; done`
	pr, pw := io.Pipe()
	codes := make(chan int, 1)
	go func() {
		codes <- run([]string{"sh", "-c", script, "sh", done}, nil, pw, io.Discard)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("first line %q: %v", line, err)
	}
	go io.Copy(io.Discard, pr)
	addr := addrOf(t, strings.TrimSpace(line))
	ping(t, addr)
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := waitCode(t, codes); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	noServerAt(t, addr)
}

// waitCode is run's exit status, which it waits 10 s for at most.
func waitCode(t *testing.T, codes <-chan int) int {
	t.Helper()
	select {
	case code := <-codes:
		return code
	case <-time.After(10 * time.Second):
		t.Fatal("withredis did not return within 10 s")
		return 0
	}
}

func TestExitStatusIsTheCommands(t *testing.T) {
	redistest.EnvURL(t)
	for _, tc := range []struct {
		script string
		want   int
	}{
		{"exit 0", 0},
		{"exit 3", 3},
		{"kill -TERM $$", 128 + int(syscall.SIGTERM)},
	} {
		var errs bytes.Buffer
		if got := run([]string{"sh", "-c", tc.script}, nil, io.Discard, &errs); got != tc.want {
			t.Errorf("sh -c %q: exit %d, want %d; stderr:\n%s", tc.script, got, tc.want, errs.String())
		}
	}
	if got := run([]string{filepath.Join(t.TempDir(), "missing")}, nil, io.Discard, io.Discard); got != 127 {
		t.Errorf("a command that does not exist: exit %d, want 127", got)
	}
}

func TestASignalIsPassedOnToTheCommand(t *testing.T) {
	redistest.EnvURL(t)
	sigs := make(chan os.Signal, 1)
	pr, pw := io.Pipe()
	codes := make(chan int, 1)
	go func() {
		codes <- run([]string{"sh", "-c", `trap 'exit 7' TERM; echo ready; while :; do sleep 0.05; done`}, sigs, pw, io.Discard)
		pw.Close()
	}()
	if line, err := bufio.NewReader(pr).ReadString('\n'); line != "ready\n" {
		t.Fatalf("the command printed %q (%v), want ready", line, err)
	}
	go io.Copy(io.Discard, pr)
	sigs <- syscall.SIGTERM
	if code := waitCode(t, codes); code != 7 {
		t.Fatalf("exit %d, want 7 (the command's SIGTERM trap)", code)
	}
}

func TestWithoutACommandItPrintsTheURLAndServesUntilASignal(t *testing.T) {
	redistest.EnvURL(t)
	dir := filepath.Join(t.TempDir(), "redis")
	sigs := make(chan os.Signal, 1)
	pr, pw := io.Pipe()
	codes := make(chan int, 1)
	go func() {
		codes <- run([]string{"-dir", dir}, sigs, pw, io.Discard)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("first line %q: %v", line, err)
	}
	addr := addrOf(t, strings.TrimSpace(line))
	ping(t, addr)
	sigs <- syscall.SIGTERM
	if code := waitCode(t, codes); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0", code)
	}
	noServerAt(t, addr)
	if _, err := os.Stat(filepath.Join(dir, "redis.log")); err != nil {
		t.Fatalf("-dir %s: the server's log is not kept: %v", dir, err)
	}
}
