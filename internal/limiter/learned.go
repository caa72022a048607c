package limiter

import (
	"math"
	"slices"
)

// The design of learned quotas is in the package doc, section "The
// provider's own quota".

// NumLearned is how many of a provider's quotas a limit learns: its
// requests, tokens, input tokens and output tokens (the last two
// Anthropic's), by learnedKinds.
const NumLearned = 4

// learnedKinds are what each learned quota counts of an admission: one
// request, or the part of its reservation of that kind.
var learnedKinds = [NumLearned]kind{Requests, Tokens, InputTokens, OutputTokens}

// MaxLearned bounds the limit of a learned quota, so that its count in
// millionths stays exact in Lua's doubles: a quota above it is not learned
// (10^9 requests or tokens, more than any provider grants one key).
const MaxLearned = 1_000_000_000

// Report is what a provider's answer said of its own quota, as a store
// learns it: each quota's limit, what remained of it and how long until it
// is full again (0 limit: not reported), and whether the provider refused
// the request, with its wait. At is when the answer came, in unix
// milliseconds of the store's clock: a report older than the one a quota
// holds never overwrites it.
type Report struct {
	At       int64
	Quotas   [NumLearned]ReportedQuota
	Refused  bool
	Wait     int64 // milliseconds
	WaitFrom int64 // where the wait came from: the caller's code, kept for the live view
}

// ReportedQuota is one quota of a report; From is where it came from,
// the caller's code, kept for the live view.
type ReportedQuota struct{ Limit, Remaining, ResetMillis, From int64 }

// LearnedQuota is one of a provider's quotas as a limit learned it: a
// bucket of Limit that the last report left Deficit millionths below full
// as of At, which refills evenly at Rate millionths a millisecond (what was
// missing then over the time the provider said it takes to be full again)
// until Until, from which on it holds nothing back. Reported is the
// report's moment, From where it came from.
type LearnedQuota struct {
	Limit, Deficit, At    int64
	Rate                  float64
	Until, Reported, From int64
}

// Learned is what a limit learned of the provider's quota: each quota, and
// until when the provider's last refusal keeps requests from it, and
// where its wait came from.
type Learned struct {
	PausedUntil, PausedFrom int64
	Quotas                  [NumLearned]LearnedQuota
}

// learn is l after the report r. A quota takes the report's deficit, or
// what it holds taken now if that is more (what the report cannot count
// yet), refilling at the report's rate until it is full again; a quota
// that r reports full, or full again at once, holds nothing back unless it
// holds something taken now. A limit whose pause and quotas all end by
// r.At forgets them (learn.lua deletes its key).
func (l Learned) learn(r Report) Learned {
	if r.Refused && r.At+r.Wait > l.PausedUntil {
		l.PausedUntil, l.PausedFrom = r.At+r.Wait, r.WaitFrom
	}
	for k, q := range r.Quotas {
		cur := l.Quotas[k]
		if q.Limit <= 0 || q.Limit > MaxLearned || r.At < cur.Reported {
			continue
		}
		// What the quota holds taken now, of the same limit: requests
		// admitted after this one may be on their way to the provider,
		// which the report does not count yet.
		var taken int64
		if cur.holds(r.At) && cur.Limit == q.Limit {
			taken = cur.refilled(r.At)
		}
		deficit := (q.Limit - min(max(q.Remaining, 0), q.Limit)) * MicroTokens
		switch {
		case (deficit == 0 || q.ResetMillis <= 0) && taken == 0:
			l.Quotas[k] = LearnedQuota{Reported: r.At, From: q.From}
		case deficit == 0 || q.ResetMillis <= 0:
			l.Quotas[k].Reported, l.Quotas[k].From = r.At, q.From
		default:
			rate := float64(deficit) / float64(q.ResetMillis)
			until := r.At + q.ResetMillis
			if taken > deficit {
				deficit, until = taken, r.At+int64(math.Ceil(float64(taken)/rate))
			}
			l.Quotas[k] = LearnedQuota{Limit: q.Limit, Deficit: deficit, At: r.At, Rate: rate, Until: until, Reported: r.At, From: q.From}
		}
	}
	if l.PausedUntil <= r.At && !slices.ContainsFunc(l.Quotas[:], func(q LearnedQuota) bool { return q.Until > r.At }) {
		return Learned{}
	}
	return l
}

// holds reports whether q holds anything back at now.
func (q LearnedQuota) holds(now int64) bool { return q.Limit > 0 && now < q.Until }

// refilled is q's deficit at now. (admit.lua computes the same, in the
// same order of the same double operations.)
func (q LearnedQuota) refilled(now int64) int64 {
	if elapsed := now - q.At; elapsed > 0 {
		return max(q.Deficit-int64(math.Floor(q.Rate*float64(elapsed))), 0)
	}
	return q.Deficit
}

// counts is what an admission at now reads of l.
func (l Learned) counts(now int64) LearnedCounts {
	c := LearnedCounts{PausedUntil: l.PausedUntil, PausedFrom: l.PausedFrom}
	for k, q := range l.Quotas {
		if q.holds(now) {
			c.Quotas[k] = LearnedCount{Limit: q.Limit, Deficit: q.refilled(now), RatePico: int64(math.Floor(q.Rate * 1e6)), Until: q.Until, Reported: q.Reported, From: q.From}
		}
	}
	return c
}

// LearnedCounts are a limit's learned quotas as an admission read them:
// until when a refusal keeps requests from the provider, and each quota
// that holds anything back then (Limit 0: none), its deficit refilled to
// the admission's moment, its rate in millionths of a millionth a
// millisecond, its end, and its report's moment and where from.
type LearnedCounts struct {
	PausedUntil, PausedFrom int64
	Quotas                  [NumLearned]LearnedCount
}

// learnedRefusal is whether the learned quotas c refuse the admission d,
// beside what the floors f hold of them, with the limit of the first quota
// that refuses (0 for a pause), the wait until every one admits it (the
// pause's end, and each quota's refill, at most until it holds nothing
// back), and the class whose floor holds what the first refused, if it
// fits without the floors.
func learnedRefusal(c LearnedCounts, f *FloorCounts, d Decision) (capacity, wait int64, floor uint8, refuses bool) {
	now := d.Now.UnixMillis
	if c.PausedUntil > now {
		refuses, wait = true, c.PausedUntil-now
	}
	for k, q := range c.Quotas {
		size, share := d.size(learnedKinds[k]), LearnedShare(k)
		beside := q
		beside.Deficit += f.Held[share]
		if beside.fits(size) {
			continue
		}
		quotaWait := q.releaseIn(now, size)
		if f.Held[share] > 0 {
			quotaWait = f.wait(quotaWait, beside.releaseIn(now, size), d.Now)
		}
		if !refuses {
			capacity = q.Limit
			if f.Held[share] > 0 && q.fits(size) {
				floor = f.By[share]
			}
		}
		refuses, wait = true, max(wait, quotaWait)
	}
	return capacity, wait, floor, refuses
}

// LearnedCount is one quota of LearnedCounts.
type LearnedCount struct{ Limit, Deficit, RatePico, Until, Reported, From int64 }

// fits reports whether an admission of size (of the quota's kind) fits q:
// size fits within what it holds, or, for nothing of its kind, it is not
// empty. A quota of Limit 0 holds nothing back.
func (q LearnedCount) fits(size int64) bool {
	if q.Limit == 0 {
		return true
	}
	room := q.Limit*MicroTokens - q.Deficit
	if size == 0 {
		return room > 0
	}
	return room >= size*MicroTokens
}

// releaseIn is how long from now until an admission of size fits q, at
// most until q holds nothing back.
func (q LearnedCount) releaseIn(now, size int64) int64 {
	need := q.Deficit - q.Limit*MicroTokens + max(size*MicroTokens, 1)
	if need <= 0 || q.Limit == 0 {
		return 0
	}
	return min(int64(math.Ceil(float64(need)*1e6/float64(q.RatePico))), q.Until-now)
}
