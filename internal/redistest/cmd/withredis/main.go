// Command withredis runs a command with a throwaway redis-server
// (internal/redistest: a free loopback port, no persistence, a directory of
// its own): it starts the server, runs the command with
// ROLTER_TEST_REDIS_URL set to it, and stops the server when the command
// exits. SIGINT, SIGTERM and SIGHUP are passed on to the command, and the
// server outlives it only until then. It exits with the command's status
// (128 + the signal's number when a signal ended it).
//
//	withredis go test -race -count=1 ./...
//
// Without a command it prints the server's URL as its first line and
// serves until one of those signals. The server's directory, with its
// redis.log, is temporary and removed on exit, unless -dir names one to
// keep.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	os.Exit(run(os.Args[1:], sigs, os.Stdout, os.Stderr))
}

func run(args []string, sigs <-chan os.Signal, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("withredis", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: withredis [-dir DIR] [--] [command [args...]]")
		fs.PrintDefaults()
	}
	dir := fs.String("dir", "", "the server's directory, kept (default: a temporary one, removed on exit)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" {
		tmp, err := os.MkdirTemp("", "withredis-")
		if err != nil {
			fmt.Fprintln(stderr, "withredis:", err)
			return 1
		}
		defer os.RemoveAll(tmp)
		*dir = tmp
	} else if err := os.MkdirAll(*dir, 0o755); err != nil {
		fmt.Fprintln(stderr, "withredis:", err)
		return 1
	}
	srv, err := redistest.Start(*dir)
	if err != nil {
		fmt.Fprintln(stderr, "withredis:", err)
		return 1
	}
	defer srv.Stop()
	fmt.Fprintf(stderr, "withredis: redis-server %s (pid %d, dir %s)\n", srv.URL(), srv.PID(), *dir)

	if fs.NArg() == 0 {
		fmt.Fprintln(stdout, srv.URL())
		sig := <-sigs
		fmt.Fprintf(stderr, "withredis: %v: stopping redis-server\n", sig)
		return 0
	}
	cmd := exec.Command(fs.Arg(0), fs.Args()[1:]...)
	cmd.Env = append(os.Environ(), redistest.URLEnv+"="+srv.URL())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "withredis:", err)
		return 127
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			_ = cmd.Process.Signal(sig)
		case err := <-done:
			return status(cmd.ProcessState, err, stderr)
		}
	}
}

// status is the exit status that reports how the command ended.
func status(st *os.ProcessState, err error, stderr io.Writer) int {
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		fmt.Fprintln(stderr, "withredis:", err)
		return 1
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}
