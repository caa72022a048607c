package redistest

import (
	"errors"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// diesWithOwner makes the kernel kill a server when the process that
// started it dies, so that a test binary killed mid-test (go test's
// -timeout, a signal) leaves no redis-server behind: its t.Cleanup never
// runs then. The kernel sends the signal when the thread that started the
// server ends, and Go ends a thread only when a goroutine locked to it
// exits, which no caller here is.
func diesWithOwner() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// Hang stops the server's process (SIGSTOP) and returns once the kernel
// reports it stopped, with what continues it (SIGCONT). Meanwhile the kernel
// still accepts connections on its port, and nothing answers on them: a
// Redis that hangs. A hung server can be stopped (Stop) without being
// continued.
func (s *Server) Hang(t testing.TB) (resume func()) {
	t.Helper()
	pid := s.PID()
	if pid == 0 {
		t.Fatalf("redis-server on %s is not running", s.Addr())
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("stopping redis-server %d: %v", pid, err)
	}
	// WNOWAIT leaves the report for whoever else waits on the process
	// (exec.Cmd's Wait only looks for its exit).
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, pid, &info, unix.WSTOPPED|unix.WNOWAIT, nil)
	for errors.Is(err, unix.EINTR) {
		err = unix.Waitid(unix.P_PID, pid, &info, unix.WSTOPPED|unix.WNOWAIT, nil)
	}
	if err != nil {
		t.Fatalf("waiting for redis-server %d to stop: %v", pid, err)
	}
	return func() {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Errorf("continuing redis-server %d: %v", pid, err)
		}
	}
}
