package poll

import (
	"errors"
	"testing"
	"time"
)

func TestUntilReturnsOnceCheckFindsNothingWrong(t *testing.T) {
	calls := 0
	err := Until(time.Minute, time.Millisecond, func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Until returned %v after %d calls, want nil after 3", err, calls)
	}
}

func TestUntilReturnsChecksLastComplaintOnceTheBoundHasPassed(t *testing.T) {
	calls := 0
	err := Until(0, time.Millisecond, func() error {
		calls++
		return errors.New("never")
	})
	if err == nil || err.Error() != "never" || calls != 1 {
		t.Fatalf("Until returned %v after %d calls, want the check's complaint after its one call", err, calls)
	}
}
