//go:build !linux

package redistest

import "syscall"

// diesWithOwner is nil where the kernel cannot tie a child's life to its
// parent's: a server outlives an owner that dies without stopping it.
func diesWithOwner() *syscall.SysProcAttr { return nil }
