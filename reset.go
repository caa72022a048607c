package ratelimit

// A reset clears a limit's window counters and its token bucket, and keeps
// its slots and budgets.

// resetNames is what a reset of l clears, by name: each window it caps,
// then "bucket" for its token bucket.
func resetNames(l limit) []string {
	names := make([]string, 0, numWindows+1)
	for k := range l.each {
		names = append(names, k.String())
	}
	if l.bucket.rate > 0 {
		names = append(names, "bucket")
	}
	return names
}
