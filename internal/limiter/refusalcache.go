package limiter

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// refusalCache answers, without a Redis call, the requests of a limit that
// Redis has refused, until the moment Redis would admit that limit again: a
// key far over its cap that keeps hammering the gateway then costs Redis
// nothing.
//
// It is exact, not a heuristic. A refusal by admit.lua carries Redis's clock
// and the counters of every limit of the chain as the script read them; from
// those refusalOf computes each refusing limit's release, the first
// millisecond at which it would admit absent traffic. Traffic only makes a
// limit's request counters and bucket deficit grow, so Redis refuses that
// limit, and with it every chain that holds it, at every moment before its
// release. Token counters and budgets are another matter: a settlement
// gives back what a reservation did not use, from any replica, so a tokens
// or budget refusal may be lifted before its release, and a request in
// flight may end at any moment and free its slot; the cache leaves token
// windows, budgets and concurrency caps to Redis and caches only what
// refuses on requests or a bucket. Refusals are therefore cached per limit, not
// per chain (one org refusal answers for every key of the org), keyed by the
// limit's counters and caps (a limit whose caps a reload changed misses at
// once), and an admission is never cached.
//
// The gateway never reads Redis's clock; it bounds it. The script ran after
// the admission was sent, so at a later moment Redis's clock, in the whole
// milliseconds the script reads, is at most the refusal's reading plus the
// time elapsed since the send rounded up, measured on this process's
// monotonic clock. The cache refuses only while that bound is before the
// release. It assumes that Redis keeps its counters and that its clock runs
// forward at the rate of ours: a failover to a node whose clock is ahead, or
// one that lost recent writes, makes Redis admit earlier, and the cache then
// refuses for at most the clock jump or until the release it knew. Clock
// rate differences (parts per million) are ignored. A store error makes the
// gateway forget every cached refusal, so that a Redis that comes back
// without its counters is believed at once.
type refusalCache struct {
	seed   maphash.Seed
	shards [refusalShards]refusalShard
	// resets counts the resets of limits (forgetLimit): a refusal of an
	// admission sent before one is not recorded (record).
	resets atomic.Uint64
}

// The cache holds at most refusalShards × refusalsPerShard limits, some
// 57,000 in about 13 MB: 896 entries fill one table of a Go map (1024 slots,
// at most 7/8 full). A shard that is full drops its expired refusals first,
// then any: a refusal dropped early only costs one Redis call.
const (
	refusalShards    = 64
	refusalsPerShard = 896
)

type refusalShard struct {
	mu      sync.RWMutex
	byLimit map[refusalKey]cachedRefusal
}

// refusalKey is a limit's counters (its prefix holds the hash tag, the scope
// and the id as stored) and its caps.
type refusalKey struct {
	prefix string
	caps   Caps
}

// cachedRefusal is one limit's refusal by the store.
type cachedRefusal struct {
	sent    time.Time // just before the admission was sent, with a monotonic reading
	at      int64     // the store's clock when it refused, unix milliseconds
	release int64     // when the limit would admit again, by the store's clock
	counts  Counts    // the limit's counters as the store read them
}

func newRefusalCache() *refusalCache {
	c := &refusalCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].byLimit = make(map[refusalKey]cachedRefusal)
	}
	return c
}

func (c *refusalCache) shard(prefix string) *refusalShard {
	return &c.shards[maphash.String(c.seed, prefix)%refusalShards]
}

// resetsSoFar is how many limits the cache has been told were reset
// (forgetLimit), read before an admission is sent, for record.
func (c *refusalCache) resetsSoFar() uint64 { return c.resets.Load() }

// record caches every limit of chain that refuses in d, the store's refusal
// of an admission sent at sent, when the cache had been told of resets
// resets. Limits that fit are not cached, nor is anything once the cache
// has been told of another reset since: Redis may have decided the
// admission before the reset's DEL, on the counters the reset cleared, and
// its answer arrive after the reset forgot the limit's refusals, which it
// would then bring back. (A reset of any limit skips the refusals in
// flight of all of them, which cost a Redis call each: resets are rare.)
func (c *refusalCache) record(chain []Limit, d Decision, sent time.Time, resets uint64) {
	for i, l := range chain {
		ref := RefusalOf([]Limit{cachedCaps(l)}, Decision{Now: d.Now, Counts: d.Counts[i : i+1]})
		if ref.First < 0 {
			continue
		}
		c.put(refusalKey{l.Prefix, *l.Caps}, cachedRefusal{
			sent: sent, at: d.Now.UnixMillis, release: d.Now.UnixMillis + ref.WaitMillis, counts: d.Counts[i],
		}, resets)
	}
}

// put caches r, unless the cache has been told of a reset since resets,
// which is checked under the shard's lock, which forgetLimit holds as it
// counts one: either r is put before the reset forgets it, or not at all.
func (c *refusalCache) put(k refusalKey, r cachedRefusal, resets uint64) {
	sh := c.shard(k.prefix)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if c.resets.Load() != resets {
		return
	}
	if _, ok := sh.byLimit[k]; !ok && len(sh.byLimit) >= refusalsPerShard {
		sh.makeRoom(r.sent) // what expired by the send has expired now
	}
	sh.byLimit[k] = r
}

// makeRoom keeps the refusals that still hold at now, up to seven eighths
// of the shard, so that a shard full of them is swept once per so many
// inserts, not at each. It builds a new map: Go's maps never shrink, and
// deletions alone would let a shard's table grow with the churn.
func (sh *refusalShard) makeRoom(now time.Time) {
	kept := make(map[refusalKey]cachedRefusal, refusalsPerShard)
	for k, r := range sh.byLimit {
		if len(kept) < refusalsPerShard*7/8 && r.refusesAt(now) {
			kept[k] = r
		}
	}
	sh.byLimit = kept
}

// refusedLocally is the refusal of chain that the cache can answer at now,
// if any (ok false: the store must decide). Its limits are those of chain
// whose cached refusals still hold, its decision carries their counters to
// the latest moment the store's clock can read (the earliest of their
// bounds), and its refusal names the first of them and waits for the last
// release.
//
// A chain whose admission writes even when refused (writesWhenRefused) is
// left to the store.
func (c *refusalCache) refusedLocally(chain []Limit, now time.Time) (a Admission, ok bool) {
	if writesWhenRefused(chain) {
		return Admission{}, false
	}
	var sub []Limit
	var found []cachedRefusal
	for _, l := range chain {
		if r, ok := c.lookup(l, now); ok {
			sub, found = append(sub, l), append(found, r)
		}
	}
	if len(found) == 0 {
		return Admission{}, false
	}
	latest := found[0].storeClockBound(now)
	for _, r := range found[1:] {
		latest = min(latest, r.storeClockBound(now))
	}
	d := Decision{Now: MomentAt(latest), Counts: make([]Counts, len(found))}
	for i, r := range found {
		if latest < r.at {
			// The store's clock went back between two refusals: no bound
			// holds for sure.
			return Admission{}, false
		}
		d.Counts[i] = r.countsAt(sub[i], d.Now)
	}
	cached := make([]Limit, len(sub))
	for i, l := range sub {
		cached[i] = cachedCaps(l)
	}
	return Admission{Decision: d, Limits: sub, Refusal: RefusalOf(cached, d)}, true
}

// cachedCaps is l as the cache decides it: with only the parts whose
// refusals it keeps (Part.cachedRefusal).
func cachedCaps(l Limit) Limit {
	caps := *l.Caps
	for p := range caps.parts().All {
		if !p.cachedRefusal() {
			caps.Without(p)
		}
	}
	l.Caps = &caps
	return l
}

// lookup is l's cached refusal if it still holds at now; one that no longer
// does is deleted.
func (c *refusalCache) lookup(l Limit, now time.Time) (cachedRefusal, bool) {
	k := refusalKey{l.Prefix, *l.Caps}
	sh := c.shard(l.Prefix)
	sh.mu.RLock()
	r, ok := sh.byLimit[k]
	sh.mu.RUnlock()
	if !ok || r.refusesAt(now) {
		return r, ok
	}
	sh.mu.Lock()
	if r, ok := sh.byLimit[k]; ok && !r.refusesAt(now) {
		delete(sh.byLimit, k)
	}
	sh.mu.Unlock()
	return cachedRefusal{}, false
}

// forget drops every cached refusal.
func (c *refusalCache) forget() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.byLimit)
		sh.mu.Unlock()
	}
}

// forgetLimit drops the cached refusals of the limit whose counters are
// prefix's, under every caps (a reset of its counters by the admin API), and
// counts a reset: refusals of admissions sent before it are not recorded.
// Every entry of a prefix is in the prefix's shard.
func (c *refusalCache) forgetLimit(prefix string) {
	sh := c.shard(prefix)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c.resets.Add(1)
	for k := range sh.byLimit {
		if k.prefix == prefix {
			delete(sh.byLimit, k)
		}
	}
}

// storeClockBound is the latest the store's clock can read at now, in whole
// milliseconds: the script read ⌊R⌋ at a moment R after the send, and
// ⌊R + e⌋ ≤ ⌊R⌋ + ⌈e⌉.
func (r cachedRefusal) storeClockBound(now time.Time) int64 {
	e := max(now.Sub(r.sent), 0)
	ms := int64(e / time.Millisecond)
	if e%time.Millisecond != 0 {
		ms++
	}
	return r.at + ms
}

// refusesAt reports whether the store refuses the limit at now, whatever
// traffic it has seen since.
func (r cachedRefusal) refusesAt(now time.Time) bool {
	return r.storeClockBound(now) < r.release
}

// countsAt is the limit's cached counters carried to the store's clock t,
// absent traffic: its windows slide into later periods and its token bucket
// refills.
func (r cachedRefusal) countsAt(l Limit, t moment) Counts {
	c := r.counts
	at := MomentAt(r.at)
	for k := range c.Window {
		s := WindowKind(k).Span()
		c.Window[k] = slid(c.Window[k], t.In(s).Period-at.In(s).Period)
	}
	if l.Bucket.Rate > 0 {
		c.Deficit = l.Bucket.refilled(c.Deficit, r.at, t.UnixMillis)
	}
	return c
}

// slid is w as read the given number of periods later.
func slid(w Window, periods int64) Window {
	switch periods {
	case 0:
		return w
	case 1:
		return Window{Prev: w.Cur}
	}
	return Window{}
}
