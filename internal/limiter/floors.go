package limiter

import (
	"math"
	"slices"
)

// The design of priority floors is in the package doc, section "Priority
// floors".

// MaxFloors bounds the floors of one limit: a request's class on it is
// 1 to MaxFloors, in a byte (0: none).
const MaxFloors = 8

// FloorAskingMillis is how long a class keeps asking after one of its
// requests came to an admission of the limit: while it asks, what its
// floor still has is held for it.
const FloorAskingMillis = 10_000

// FloorShares are what floors divide of a limit: each window, the bucket,
// and each learned quota; a share's index is its window's WindowKind,
// BucketShare, or LearnedShare(k).
const (
	BucketShare = int(NumWindows)
	FloorShares = BucketShare + 1 + NumLearned
)

// LearnedShare is the share of learned quota k.
func LearnedShare(k int) int { return BucketShare + 1 + k }

// deficitShares are the shares counted as deficits, whose classes' parts
// a floor's state keeps: the bucket, then each learned quota.
const deficitShares = 1 + NumLearned

// FloorCounts are what an admission of a class reads of a limit's floors:
// per share, what the floors of the other classes that ask hold of it, in
// the share's units (a window's count times its length, a deficit's
// millionths), and the class that holds the most of it (0: none); and
// until when the classes that hold anything ask, absent more requests.
type FloorCounts struct {
	Held  [FloorShares]int64
	By    [FloorShares]uint8
	Until int64
}

// NumFloors is how many floors c has: classes 1 to NumFloors.
func (c *Caps) NumFloors() int {
	n := 0
	for n < MaxFloors && c.Floors[n] > 0 {
		n++
	}
	return n
}

// floorState is what a limit's floors hold, as the in-process store keeps
// it and admit.lua's floors key spells it: when each class last asked;
// each deficit share's total as the state was last written (its basis),
// and each class's part of it then. A class's part shrinks as the share
// refills, in proportion (scaledDeficit); a report that raises a learned
// quota's deficit leaves it, the rest being someone else's. Each class's
// windows count what the class was admitted in them, beside the limit's.
type floorState struct {
	asked    [MaxFloors]int64
	basis    [deficitShares]int64
	deficits [MaxFloors][deficitShares]int64
	windows  [MaxFloors][NumWindows][2]periodCount
}

// scaledDeficit is a class's part d of a deficit share whose total was
// basis, now that the total is total: in proportion when the total fell,
// as it is otherwise. (admit.lua computes the same, in the same double
// operations.)
func scaledDeficit(d, total, basis int64) int64 {
	if total >= basis {
		return d
	}
	return int64(math.Floor(float64(d) * (float64(total) / float64(basis))))
}

// asking reports whether a class that last asked at asked asks at now.
func asking(asked, now int64) bool { return asked > 0 && now < asked+FloorAskingMillis }

// floorHeld is what the floors of the classes other than class that ask at
// now hold of a share whose capacity is capacity (counted in units of
// scale each): each floor's percent of it, whole, less what its class uses
// of it (usage), if that is less; and the class that holds the most.
// admit.lua's floor_held is the same.
func floorHeld(percents *[MaxFloors]uint8, asked *[MaxFloors]int64, class uint8, capacity, scale, now int64, usage func(int) int64) (held int64, by uint8) {
	var most int64
	for i := range MaxFloors {
		if percents[i] == 0 {
			break
		}
		if uint8(i+1) == class || !asking(asked[i], now) {
			continue
		}
		if h := int64(percents[i])*capacity/100*scale - usage(i); h > 0 {
			held += h
			if h > most {
				most, by = h, uint8(i+1)
			}
		}
	}
	return held, by
}

// until is when the classes that hold anything of f stop asking, absent
// more requests.
func (f *floorState) until(held *FloorCounts, now int64) int64 {
	var until int64
	for i, by := range held.By {
		if by > 0 && held.Held[i] > 0 {
			until = max(until, f.asked[by-1]+FloorAskingMillis)
		}
	}
	return max(until, now)
}

// counts are what an admission of class at now reads of the floors of a
// limit with caps c, whose other counts it read as counts: what each share
// holds for the other classes.
func (f *floorState) counts(c *Caps, class uint8, counts *Counts, at [2]Position, now int64) FloorCounts {
	var fc FloorCounts
	for k, capacity := range c.Each {
		p := at[k.Span()]
		length := Spans[p.span].Length
		fc.Held[k], fc.By[k] = floorHeld(&c.Floors, &f.asked, class, capacity, length, now, func(i int) int64 {
			return readWindow(&f.windows[i][k], p.Period).weighted(p.into, length)
		})
	}
	f.eachDeficit(c, counts, func(share, d int, capacity, total int64) {
		fc.Held[share], fc.By[share] = floorHeld(&c.Floors, &f.asked, class, capacity, MicroTokens, now, func(i int) int64 {
			return scaledDeficit(f.deficits[i][d], total, f.basis[d])
		})
	})
	fc.Until = f.until(&fc, now)
	return fc
}

// eachDeficit calls do for each deficit share of a limit with caps c that
// holds anything back, as counts read it: its share, its index among the
// deficit shares, its capacity in tokens or requests and its total now.
func (f *floorState) eachDeficit(c *Caps, counts *Counts, do func(share, d int, capacity, total int64)) {
	if c.Bucket.Rate > 0 {
		do(BucketShare, 0, c.Bucket.Burst, counts.Deficit)
	}
	if c.Learn {
		for k, q := range counts.Extra().Learned.Quotas {
			if q.Limit > 0 {
				do(LearnedShare(k), 1+k, q.Limit, q.Deficit)
			}
		}
	}
}

// admitted is f after an admission of class at now, which read before and
// left after: the class asks, what it was admitted counts in its windows
// (at: the admission's positions) and in its parts of the deficit shares,
// whose parts are scaled to now and whose basis is their total after it.
// A deficit share that holds nothing back holds no class's part either.
func (f *floorState) admitted(c *Caps, class uint8, before, after *Counts, at [2]Position, now int64) {
	var deficits [MaxFloors][deficitShares]int64
	var basis [deficitShares]int64
	f.eachDeficit(c, before, func(share, d int, _, total int64) {
		taken := after.Deficit - before.Deficit
		if share != BucketShare {
			k := share - LearnedShare(0)
			taken = after.Extra().Learned.Quotas[k].Deficit - before.Extra().Learned.Quotas[k].Deficit
		}
		basis[d] = total + taken
		for i := range c.NumFloors() {
			deficits[i][d] = scaledDeficit(f.deficits[i][d], total, f.basis[d])
			if uint8(i+1) == class {
				deficits[i][d] += taken
			}
		}
	})
	f.deficits, f.basis = deficits, basis
	if class == 0 {
		return
	}
	f.asked[class-1] = now
	for k := range c.Each {
		if n := after.Window[k].Cur - before.Window[k].Cur; n != 0 {
			add(&f.windows[class-1][k], at[k.Span()].Period, n)
		}
	}
}

// wait is the wait of a refusal by a share that floors hold some of: at
// least plain, the wait without them, and at most until the classes that
// hold it stop asking, beside, the wait if what they hold stayed held.
func (f *FloorCounts) wait(plain, beside int64, now moment) int64 {
	return max(plain, min(beside, f.Until-now.UnixMillis))
}

// windowReleaseBeside is releaseIn for a window whose capacity held (in
// units times length) takes from, rounded up to whole units; one that
// holds less than size then releases never (MaxInt64).
func windowReleaseBeside(w Window, capacity, size, held int64, p Position) int64 {
	reduced := capacity - CeilDiv(held, Spans[p.span].Length)
	if reduced < max(size, 1) {
		return math.MaxInt64
	}
	return releaseIn(w, reduced, size, p)
}

// hasFloors reports whether a limit of chain has floors.
func hasFloors(chain []Limit) bool {
	return slices.ContainsFunc(chain, func(l Limit) bool { return l.Floors[0] > 0 })
}

// writesWhenRefused reports whether an admission of chain writes to the
// store even when it is refused: a limit's floors note a class's asking
// (floors.go), and its notify part a level the refusal read (a budget
// that settlements took past a fraction: notify.go). Such a chain's
// refusals are the store's to make, never a refusal cache's.
func writesWhenRefused(chain []Limit) bool {
	return slices.ContainsFunc(chain, func(l Limit) bool { return l.Floors[0] > 0 || l.Notify[0] > 0 })
}
