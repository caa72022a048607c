//go:build !linux

package redistest

import (
	"syscall"
	"testing"
)

// diesWithOwner is nil where the kernel cannot tie a child's life to its
// parent's: a server outlives an owner that dies without stopping it.
func diesWithOwner() *syscall.SysProcAttr { return nil }

// Hang skips the test: it waits for the server to stop with Linux's waitid.
func (s *Server) Hang(t testing.TB) (resume func()) {
	t.Helper()
	t.Skip("hanging a redis-server needs Linux here")
	return nil
}
