package ratelimit

import (
	"os"
	"testing"
)

// TestMain removes the Caddy binary that the tests of gateway processes
// built (caddyBinary).
func TestMain(m *testing.M) {
	code := m.Run()
	if caddyBuild.dir != "" {
		os.RemoveAll(caddyBuild.dir)
	}
	os.Exit(code)
}
