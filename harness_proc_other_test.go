//go:build !linux

package ratelimit

import "syscall"

// diesWithTheTest: only Linux can tie a child's life to its parent's; the
// gateway processes are killed in t.Cleanup.
func diesWithTheTest() *syscall.SysProcAttr { return nil }
