package ratelimit

const (
	// bucketMillis is the length of one bucket.
	bucketMillis = 60_000
	// bucketTTLSeconds is how long a bucket key lives after its creation:
	// it is read until the end of the following minute, at most 120 s.
	bucketTTLSeconds = 120
)

// kind is what a limit counts: requests or tokens per minute, or a token
// bucket's tokens (bucket.go); and, for refusals, a request whose token
// reservation alone is over a tpm.
type kind uint8

const (
	requests kind = iota
	tokens
	burst
	tooLarge
)

// String is the kind's name in placeholders, metrics and logs.
func (k kind) String() string {
	switch k {
	case tokens:
		return "tokens"
	case burst:
		return "burst"
	case tooLarge:
		return "too_large"
	}
	return "requests"
}

// errorType is the kind in an OpenAI-style error body, whose types are
// "requests" and "tokens": a bucket meters requests.
func (k kind) errorType() string {
	if k == tokens || k == tooLarge {
		return "tokens"
	}
	return "requests"
}

// window holds the two buckets of one counter that an estimate reads: the
// sliding window of the package doc, in exact integer arithmetic, with the
// comparisons admit.lua makes.
type window struct {
	cur, prev int64
}

// moment is a store's clock reading split into bucket and offset.
type moment struct {
	unixMillis int64
	bucket     int64 // unix_seconds / 60
	into       int64 // milliseconds into the bucket, [0, bucketMillis)
}

func momentAt(unixMillis int64) moment {
	b := unixMillis / bucketMillis
	if unixMillis < 0 && unixMillis%bucketMillis != 0 {
		b-- // floor, for pinned test clocks before the epoch
	}
	return moment{unixMillis: unixMillis, bucket: b, into: unixMillis - b*bucketMillis}
}

// weighted is the estimate × bucketMillis at offset into.
func (w window) weighted(into int64) int64 {
	return w.cur*bucketMillis + w.prev*(bucketMillis-into)
}

// estimate is the trailing-minute estimate at offset into.
func (w window) estimate(into int64) float64 {
	return float64(w.weighted(into)) / bucketMillis
}

// fits reports whether an admission that adds size to the counter fits at
// offset into: while estimate + size ≤ capacity. A request has size 1; a
// token reservation its tokens. Size 0 is tokens not reserved, which exist
// only once a response reports them: they fit while estimate < capacity.
func fits(w window, capacity, size, into int64) bool {
	if size == 0 {
		return w.weighted(into) < capacity*bucketMillis
	}
	return w.weighted(into)+size*bucketMillis <= capacity*bucketMillis
}

// releaseIn is how many milliseconds after offset into a counter that refuses
// an admission of size would admit it, absent further traffic: the earliest
// whole millisecond at which fits holds. While the current bucket alone
// fits, what refuses is the previous bucket's weight, which falls during this
// bucket; otherwise the current bucket must first become the previous one.
// size is at most capacity.
func releaseIn(w window, capacity, size, into int64) int64 {
	// room is how much the weighted estimate may reach, strict or not.
	room, strict := (capacity-size)*bucketMillis, size == 0
	if w.cur*bucketMillis < room || !strict && w.cur*bucketMillis == room {
		// Admits at the earliest t in this bucket with prev × (60000 − t) within room − cur.
		at := bucketMillis - maxWeight(room-w.cur*bucketMillis, w.prev, strict)
		return max(at-into, 0)
	}
	// In the next bucket cur is the previous one and the new current is empty.
	at := bucketMillis + bucketMillis - maxWeight(room, w.cur, strict)
	return at - into
}

// maxWeight is the largest integer m ≤ bucketMillis with count × m ≤ room
// (or < room when strict).
func maxWeight(room, count int64, strict bool) int64 {
	if count <= 0 {
		return bucketMillis
	}
	q := room / count // room ≥ 0 and count > 0 here
	if strict && q*count == room {
		q--
	}
	return min(q, bucketMillis)
}

// remaining is what is left of capacity after the estimate at offset into,
// rounded down and never negative. For requests the caller counts the
// request itself in w.
func remaining(w window, capacity, into int64) int64 {
	left := capacity*bucketMillis - w.weighted(into)
	if left <= 0 {
		return 0
	}
	return left / bucketMillis
}

// resetIn is how many milliseconds after offset into the estimate is back to
// zero absent further traffic.
func resetIn(w window, into int64) int64 {
	switch {
	case w.cur > 0:
		return 2*bucketMillis - into
	case w.prev > 0:
		return bucketMillis - into
	}
	return 0
}
