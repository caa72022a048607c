package redistest

import "syscall"

// diesWithOwner makes the kernel kill a server when the process that
// started it dies, so that a test binary killed mid-test (go test's
// -timeout, a signal) leaves no redis-server behind: its t.Cleanup never
// runs then. The kernel sends the signal when the thread that started the
// server ends, and Go ends a thread only when a goroutine locked to it
// exits, which no caller here is.
func diesWithOwner() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
