package ratelimit

import "syscall"

// diesWithTheTest makes the kernel kill a gateway process when the test
// binary dies, so that a binary killed mid-test (go test's -timeout, a
// signal), whose t.Cleanup never runs, leaves no Caddy behind.
func diesWithTheTest() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
