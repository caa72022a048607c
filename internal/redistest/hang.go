package redistest

import (
	"slices"
	"testing"
	"time"
)

// The hang tests' Redis timeout, and what an admission may take beyond it:
// the bound those tests prove. On a loaded 2-core machine under -race, the
// runtime's timers fire up to some 90 ms late, and more now and then; an
// admission that waited for a call in flight and then made its own, which
// this bound is to exclude, takes twice the timeout (400 ms), still past
// the bound.
const (
	HungTimeout = 200 * time.Millisecond
	HungMargin  = 150 * time.Millisecond
)

// CheckWithinTimeout fails the test if one of what took longer than the
// timeout and the margin, and logs the p99 and the longest.
func CheckWithinTimeout(t testing.TB, what string, took []time.Duration) {
	t.Helper()
	slices.Sort(took)
	p99, longest := took[(len(took)*99+99)/100-1], took[len(took)-1]
	t.Logf("%d %s while Redis hangs, timeout %v: p99 %v, max %v", len(took), what, HungTimeout, p99, longest)
	if longest > HungTimeout+HungMargin {
		t.Errorf("one of the %s took %v, want at most the timeout, %v (+%v)", what, longest, HungTimeout, HungMargin)
	}
}
