// Package poll is the tests' one wait for what nothing signals: a state
// another goroutine or process reaches in its own time (a charge landed, a
// server ready, a replica promoted). Where something does signal (a
// channel, an answer), tests wait on that instead.
package poll

import "time"

// Until calls check every period until it finds nothing wrong (returns nil)
// or bound has passed, and returns check's last complaint: nil if it found
// nothing wrong.
func Until(bound, every time.Duration, check func() error) error {
	deadline := time.Now().Add(bound)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(every)
	}
}
