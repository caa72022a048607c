package limiter

import (
	"cmp"
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// MemoryStore keeps the counters in this process, with the Redis store's
// semantics: an admission locks the counters of its chain (in one global
// order, so that chains never deadlock), decides, charges and unlocks. There
// is no global lock: the index of counters is sharded, and admissions read it
// without locking. Counters whose periods can no longer be read are dropped
// by a sweep, so memory is bounded by the active limits.
type MemoryStore struct {
	now      func() int64 // the clock, in unix milliseconds: this machine's, or one a test pins
	seed     maphash.Seed
	shards   [memoryShards]memoryShard
	seq      atomic.Uint64 // lock order of new counters
	counters atomic.Int64  // held in the shards
	held     *heldSlots    // the slots its admissions hold, renewed while they do
	tallies  tallies       // the top consumers (top.go)
	stop     chan struct{}
	done     sync.WaitGroup // the sweep, and the renewal once started
}

const memoryShards = 64

// stackChain is the longest chain whose counters an admission keeps on the
// stack; a longer one allocates.
const stackChain = 8

// memoryShard is a hash table of linked lists of counters, which admissions
// walk without a lock: taking a lock, even a shared one, is a write, and the
// cores would take turns at the shards' cache lines. Only insertions, growth
// and the sweep take mu. A walk that races them may miss a counter, and then
// looks again under mu, or find one that the sweep just removed, which is
// dead.
type memoryShard struct {
	mu    sync.Mutex
	table atomic.Pointer[counterTable]
	n     int // counters in the table, under mu
}

// counterTable holds the heads of the lists; their number is a power of two.
type counterTable []atomic.Pointer[memoryCounter]

// memoryCounter holds every window of one limit: the count of its current
// and previous period of each, at index period%2; the token bucket; the
// slots of its requests in flight; and its budgets' current periods. The
// windows most limits cap, rpm and tpm, are in the counter; the others,
// and the budgets, are allocated when a limit first caps one, which keeps
// a counter of those two at the size it had before there were others, as
// is the moment of a reset, which few counters see.
type memoryCounter struct {
	prefix  string // the limit's: what the counter is looked up by
	hash    uint64 // of prefix: its low bits pick the shard, the next ones the list
	next    atomic.Pointer[memoryCounter]
	mu      sync.Mutex
	order   uint64            // lock order
	dead    bool              // swept: look it up again
	minute  [2][2]periodCount // rpm, tpm
	others  *otherCounts      // itpm, otpm, the day windows, and the last reset
	bkt     bucketState
	slots   slotHolding                             // the requests in flight it holds (slots.go)
	budgets *[NumBudgetPeriods][2]budgetPeriodCount // by budgetPeriod: the latest period written, and the one before it
}

// otherCounts are the parts of a counter that fewer limits use.
type otherCounts struct {
	windows [NumWindows - 2][2]periodCount // itpm, otpm, then the day windows
	// resetAt is when the counter's windows were last reset (by the admin API), in
	// unix milliseconds: a settlement of a reservation admitted before it
	// finds the reservation gone (charge.windowTokens).
	resetAt  int64
	learned  Learned     // what the limit learned of the provider's quota
	floors   *floorState // what its floors' classes asked and used
	notified [LearnedPart]NotifyState
}

// floors is c's floors' state, under c.mu, made on first use.
func (c *memoryCounter) floors() *floorState {
	o := c.other()
	if o.floors == nil {
		o.floors = new(floorState)
	}
	return o.floors
}

// learned is what c learned of the provider's quota, under c.mu.
func (c *memoryCounter) learned() Learned {
	if c.others == nil {
		return Learned{}
	}
	return c.others.learned
}

// other is c's other counts, under c.mu, made on first use.
func (c *memoryCounter) other() *otherCounts {
	if c.others == nil {
		c.others = new(otherCounts)
	}
	return c.others
}

// resetAt is when c's windows were last reset, under c.mu; 0: never.
func (c *memoryCounter) resetAt() int64 {
	if c.others == nil {
		return 0
	}
	return c.others.resetAt
}

// budgetPeriodCount is what a budget holds spent and reserved in one of
// its periods.
type budgetPeriodCount struct {
	span            periodSpan
	spent, reserved int64
}

// budget is what budget p holds in the period s, under c.mu: nothing in a
// period it has not written.
func (c *memoryCounter) budget(p BudgetPeriod, s periodSpan) budgetPeriodCount {
	if c.budgets != nil {
		for _, b := range c.budgets[p] {
			if b.span == s {
				return b
			}
		}
	}
	return budgetPeriodCount{span: s}
}

// addBudget adds spent and reserved to what budget p holds in the period
// s, under c.mu, never taking either below zero: in the latest period
// written or the one before it (a settlement of a response that outlived
// its period), or in a later one, which becomes the latest. An older
// period is read by nothing: it is left alone.
func (c *memoryCounter) addBudget(p BudgetPeriod, s periodSpan, spent, reserved int64) {
	if c.budgets == nil {
		c.budgets = new([NumBudgetPeriods][2]budgetPeriodCount)
	}
	periods := &c.budgets[p]
	b := &periods[0]
	switch {
	case b.span == s:
	case periods[1].span == s:
		b = &periods[1]
	case b.span.Start < s.Start:
		periods[1] = budgetPeriodCount{}
		if b.span.End == s.Start {
			periods[1] = *b
		}
		*b = budgetPeriodCount{span: s}
	default:
		return
	}
	b.spent, b.reserved = max(b.spent+spent, 0), max(b.reserved+reserved, 0)
}

// bucketState is a token bucket's deficit as of the moment at; it is full
// again at fullAt, absent traffic.
type bucketState struct{ deficit, at, fullAt int64 }

// periodCount is a window's count in one period.
type periodCount struct{ period, n int64 }

// window reads the two periods that an estimate in period b needs.
func readWindow(periods *[2]periodCount, b int64) Window {
	return Window{Cur: periods[b&1].count(b), Prev: periods[(b-1)&1].count(b - 1)}
}

func (s periodCount) count(b int64) int64 {
	if s.period != b {
		return 0
	}
	return s.n
}

// add charges n to period b. A period older than the one at its index is no
// longer read by anything, so a charge to it (a pinned clock going back) is
// dropped.
func add(periods *[2]periodCount, b, n int64) {
	s := &periods[b&1]
	switch {
	case s.period == b:
		s.n += n
	case s.period < b:
		*s = periodCount{period: b, n: n}
	}
	s.n = max(s.n, 0) // a settlement gives back at most what is there
}

// periods are the periods of window k, under c.mu.
func (c *memoryCounter) periods(k WindowKind) *[2]periodCount {
	if k < ITPM {
		return &c.minute[k]
	}
	return &c.other().windows[k-ITPM]
}

// readAt reports whether an admission at now may still read a period of
// the counter's windows or budgets, under c.mu.
func (c *memoryCounter) readAt(now moment) bool {
	if l := c.learned(); l.PausedUntil > now.UnixMillis || slices.ContainsFunc(l.Quotas[:], func(q LearnedQuota) bool { return q.Until > now.UnixMillis }) {
		return true
	}
	if c.others != nil && c.others.floors != nil && slices.ContainsFunc(c.others.floors.asked[:], func(asked int64) bool { return asking(asked, now.UnixMillis) }) {
		return true
	}
	if c.budgets != nil {
		for _, b := range c.budgets {
			if b[0].span.End > now.UnixMillis {
				return true
			}
		}
	}
	for k := range NumWindows {
		if k >= ITPM && c.others == nil {
			break
		}
		oldest := now.In(k.Span()).Period - 1
		if s := c.periods(k); s[0].period >= oldest || s[1].period >= oldest {
			return true
		}
	}
	return false
}

// NewMemoryStore is a store that reads the time from now, and sweeps every
// sweepEvery.
func NewMemoryStore(sweepEvery time.Duration, now func() int64) *MemoryStore {
	s := &MemoryStore{now: now, seed: maphash.MakeSeed(), held: newHeldSlots(), stop: make(chan struct{})}
	s.tallies.carry = true
	for i := range s.shards {
		s.shards[i].table.Store(&counterTable{{}})
	}
	s.done.Go(func() { s.sweepLoop(sweepEvery) })
	return s
}

// StartRenewal renews the slots the store holds while it holds any, until
// Destruct.
func (s *MemoryStore) StartRenewal() {
	s.done.Go(func() { s.held.renewEvery(s.renew, s.stop) })
}

// Destruct stops the sweep and the renewal once no loaded config uses the
// store.
func (s *MemoryStore) Destruct() error {
	close(s.stop)
	s.done.Wait()
	return nil
}

func (s *MemoryStore) clock() moment { return MomentAt(s.now()) }

// SystemUnixMillis is this machine's clock, the in-process store's.
func SystemUnixMillis() int64 { return time.Now().UnixMilli() }

// counter is the counter of prefix, made on first use.
func (s *MemoryStore) counter(prefix string) *memoryCounter {
	h := maphash.String(s.seed, prefix)
	sh := &s.shards[h%memoryShards]
	if c := sh.find(prefix, h); c != nil {
		return c
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if c := sh.find(prefix, h); c != nil {
		return c
	}
	c := &memoryCounter{prefix: prefix, hash: h, order: s.seq.Add(1)}
	sh.insert(c)
	s.counters.Add(1)
	return c
}

// head is the head of the list of a counter with hash h, whose low bits
// picked the shard.
func (t counterTable) head(h uint64) *atomic.Pointer[memoryCounter] {
	return &t[h/memoryShards&uint64(len(t)-1)]
}

func (sh *memoryShard) find(prefix string, h uint64) *memoryCounter {
	for c := sh.table.Load().head(h).Load(); c != nil; c = c.next.Load() {
		if c.hash == h && c.prefix == prefix {
			return c
		}
	}
	return nil
}

// insert adds c at the head of its list, under sh.mu, doubling the table
// first when it holds as many counters as lists.
func (sh *memoryShard) insert(c *memoryCounter) {
	t := *sh.table.Load()
	if sh.n >= len(t) {
		t = sh.grow(t)
	}
	head := t.head(c.hash)
	c.next.Store(head.Load())
	head.Store(c)
	sh.n++
}

// grow relinks every counter into a table twice as large, under sh.mu. A
// walk of the old table meanwhile may stray into a list of the new one, and
// miss, but never loop: a counter not yet relinked leads only to others not
// yet relinked, and a relinked one only to relinked ones.
func (sh *memoryShard) grow(old counterTable) counterTable {
	t := make(counterTable, 2*len(old))
	for i := range old {
		for c := old[i].Load(); c != nil; {
			next := c.next.Load()
			head := t.head(c.hash)
			c.next.Store(head.Load())
			head.Store(c)
			c = next
		}
	}
	sh.table.Store(&t)
	return t
}

// lock locks the counters of chain in their global order, so that chains
// never deadlock. It appends them to byLimit in chain order, and to locked,
// without duplicates, in lock order for unlockAll: a caller that passes empty
// slices of stack arrays keeps a short chain off the heap. A counter swept
// meanwhile is looked up again.
func (s *MemoryStore) lock(chain []Limit, byLimit, locked []*memoryCounter) ([]*memoryCounter, []*memoryCounter) {
	for {
		byLimit, locked = byLimit[:0], locked[:0]
		for _, l := range chain {
			c := s.counter(l.Prefix)
			byLimit = append(byLimit, c)
			locked = insertInOrder(locked, c)
		}
		dead := false
		for _, c := range locked {
			c.mu.Lock()
			dead = dead || c.dead
		}
		if !dead {
			return byLimit, locked
		}
		unlockAll(locked)
	}
}

// insertInOrder inserts c into cs, which is sorted by lock order, unless it
// is there already: an insertion sort, as chains are a few limits long.
func insertInOrder(cs []*memoryCounter, c *memoryCounter) []*memoryCounter {
	if slices.Contains(cs, c) {
		return cs
	}
	cs = append(cs, c)
	for i := len(cs) - 1; i > 0 && cs[i-1].order > c.order; i-- {
		cs[i], cs[i-1] = cs[i-1], cs[i]
	}
	return cs
}

func unlockAll(cs []*memoryCounter) {
	for _, c := range cs {
		c.mu.Unlock()
	}
}

func (s *MemoryStore) Admit(_ context.Context, chain []Limit, reserve TokenCounts) (Admission, error) {
	return admissionOf(chain, s.decide(chain, reserve, true, nil))
}

// refusedUnread peeks: the in-process store knows every refusal without a
// round trip (a concurrency cap's too, which no body changes either). The peek's counts stay on the stack unless it refuses.
func (s *MemoryStore) RefusedUnread(chain []Limit) (Admission, bool) {
	if writesWhenRefused(chain) {
		return Admission{}, false
	}
	var buf [stackChain]Counts
	peeked := s.decide(chain, TokenCounts{}, false, buf[:0])
	if peeked.Admitted {
		return Admission{}, false
	}
	a, err := admissionOf(chain, Decision{Now: peeked.Now, Counts: slices.Clone(peeked.Counts)})
	return a, err == nil && (a.Refusal.Kind == Requests || a.Refusal.Kind == Burst || a.Refusal.Kind == Concurrency)
}

func (s *MemoryStore) Peek(_ context.Context, chain []Limit) (Decision, error) {
	return s.decide(chain, TokenCounts{}, false, nil), nil
}

func (s *MemoryStore) Describe() storeDescription { return storeDescription{Kind: "memory"} }

// reset zeroes, under the counter's lock, every period it holds of each
// window l caps, and l's token bucket, which is then full; it keeps the
// slots and the budgets (the admin API's reset). An admission after it finds the
// windows empty, whatever period the clock is in. A settlement of a
// response admitted before it still lands, in a period the counter keeps
// while it may: it charges what the request used, as the reset took its
// reservation (resetAt).
func (s *MemoryStore) Reset(_ context.Context, l Limit) ([]string, error) {
	c := s.lockedCounter(l.Prefix)
	defer c.mu.Unlock()
	for p := range l.parts().All {
		if k, ok := p.Window(); ok {
			periods := c.periods(k)
			periods[0].n, periods[1].n = 0, 0
		} else if p == BucketPart {
			c.bkt = bucketState{}
		}
	}
	if l.capsTokens() {
		c.other().resetAt = s.now()
	}
	return resetNames(l), nil
}

// The process store stays usable after it is unloaded: only its sweep stops.
func (s *MemoryStore) Hold()    {}
func (s *MemoryStore) Release() {}

// decide is one admission, which charges only when charge is set; its
// counts are appended to buf, which may be a caller's stack array.
func (s *MemoryStore) decide(chain []Limit, reserve TokenCounts, charge bool, buf []Counts) Decision {
	now := s.clock()
	at := [...]Position{now.In(Minute), now.In(Day)}
	var byLimitBuf, lockedBuf [stackChain]*memoryCounter
	cs, locked := s.lock(chain, byLimitBuf[:0], lockedBuf[:0])
	defer unlockAll(locked)
	if cap(buf) < len(chain) {
		buf = make([]Counts, len(chain))
	}
	buf = buf[:len(chain)]
	clear(buf)
	d := Decision{Now: now, Counts: buf, Reserve: reserve}
	for i, l := range chain {
		for p := range l.parts().All {
			cs[i].read(&d.Counts[i], l, p, at, now)
		}
	}
	// What admit.lua decides, from the same counts: refusalOf is the
	// script's comparisons in Go, and leaves out shadow limits as it does.
	d.Admitted = RefusalOf(chain, d).First < 0
	if !charge {
		return d
	}
	for i, l := range chain {
		after := d.Counts[i]
		if d.Admitted {
			d.AddTo(l, &after)
			cs[i].write(l, at, &d.Counts[i], &after, now)
		}
		if l.Floors[0] > 0 { // a class asks whether admitted or not
			cs[i].floors().admitted(l.Caps, l.Class, &d.Counts[i], &after, at, now.UnixMillis)
		}
		if l.Notify[0] > 0 { // a refused admission reports a level it read too
			cs[i].other().notified = after.noticed(l, now)
		}
	}
	if d.Admitted {
		s.held.take(chain, 1) // under the counters' locks, which the renewal takes too
	}
	return d
}

// read reads into counts what c holds of l's part p at now (at: its
// position in each span), under c.mu: a window's current and previous
// period, the bucket's deficit refilled to now, the slots whose lease has
// not ended, a budget's current period.
func (c *memoryCounter) read(counts *Counts, l Limit, p Part, at [2]Position, now moment) {
	if k, ok := p.Window(); ok {
		counts.Window[k] = readWindow(c.periods(k), at[k.Span()].Period)
		return
	}
	switch p {
	case BucketPart:
		counts.Deficit = l.Bucket.refilled(c.bkt.deficit, c.bkt.at, now.UnixMillis)
	case SlotsPart:
		counts.Slots = c.slots.at(now.UnixMillis)
	case LearnedPart:
		counts.fillExtra().Learned = c.learned().counts(now.UnixMillis)
	case FloorsPart:
		f := &floorState{}
		if c.others != nil && c.others.floors != nil {
			f = c.others.floors
		}
		counts.fillExtra().Floors = f.counts(l.Caps, l.Class, counts, at, now.UnixMillis)
	case NotifyPart:
		notified := &counts.fillExtra().Notified
		if c.others != nil {
			*notified = c.others.notified
		}
	default:
		b := c.budget(p.Budget(), l.Budgets.Calendar.SpanAt(p.Budget(), now))
		counts.Spent[p.Budget()], counts.Reserved[p.Budget()] = b.spent, b.reserved
	}
}

// write stores after, the counts of l that an admission at read as before
// and charged, under c.mu: the windows' current periods by what the charge
// added (a window it left alone keeps no period alive for the sweep), the
// bucket's deficit as of now, the slots, and the budgets' reservations.
func (c *memoryCounter) write(l Limit, at [2]Position, before, after *Counts, now moment) {
	for p := range l.parts().All {
		if k, ok := p.Window(); ok {
			if n := after.Window[k].Cur - before.Window[k].Cur; n != 0 {
				add(c.periods(k), at[k.Span()].Period, n)
			}
			continue
		}
		switch p {
		case BucketPart:
			since := max(c.bkt.at, now.UnixMillis)
			c.bkt = bucketState{deficit: after.Deficit, at: since, fullAt: since + CeilDiv(after.Deficit, l.Bucket.Rate)}
		case SlotsPart:
			if after.Slots > before.Slots {
				c.slots = c.slots.taken(after.Slots, now.UnixMillis, l.Concurrent.LeaseMillis)
			}
		case LearnedPart:
			for k, q := range after.Extra().Learned.Quotas {
				if q.Limit > 0 && q.Deficit != before.Extra().Learned.Quotas[k].Deficit {
					learned := &c.other().learned.Quotas[k]
					learned.Deficit, learned.At = q.Deficit, max(learned.At, now.UnixMillis)
				}
			}
		case FloorsPart, NotifyPart: // decide writes them, whether admitted or not
		default:
			b := p.Budget()
			if n := after.Reserved[b] - before.Reserved[b]; n != 0 {
				c.addBudget(b, l.Budgets.Calendar.SpanAt(b, now), 0, n)
			}
		}
	}
}

// free gives back the slots an admission of chain took.
func (s *MemoryStore) Free(chain []Limit) {
	now := s.now()
	var byLimitBuf, lockedBuf [stackChain]*memoryCounter
	cs, locked := s.lock(chain, byLimitBuf[:0], lockedBuf[:0])
	defer unlockAll(locked)
	for i, l := range chain {
		if l.Concurrent.Max > 0 {
			cs[i].slots = cs[i].slots.freed(now)
		}
	}
	s.held.take(chain, -1)
}

// renew writes each limit's slots as the ledger holds them, with a lease
// from now: a lease that lapsed (the renewal stalled) holds them again.
func (s *MemoryStore) renew() {
	now := s.now()
	for _, l := range s.held.limits() {
		c := s.lockedCounter(l.Prefix)
		// Read under the counter's lock, which every admission and free of
		// it holds while it changes the ledger.
		r := s.held.renewed(l)
		c.slots = slotHolding{n: r.n, expiry: now + r.leaseMillis}
		c.mu.Unlock()
	}
}

// lockedCounter is the counter of prefix, locked; one swept meanwhile is
// looked up again.
func (s *MemoryStore) lockedCounter(prefix string) *memoryCounter {
	for {
		c := s.counter(prefix)
		c.mu.Lock()
		if !c.dead {
			return c
		}
		c.mu.Unlock()
	}
}

// Learn learns r on every limit of chain that learns, at once.
func (s *MemoryStore) Learn(chain []Limit, r Report, done func(error)) {
	for _, l := range chain {
		if l.Learn {
			c := s.lockedCounter(l.Prefix)
			c.other().learned = c.other().learned.learn(r)
			c.mu.Unlock()
		}
	}
	done(nil)
}

// charge charges at once: the in-process store has no round trip to
// spare the caller.
func (s *MemoryStore) Charge(chain []Limit, c Charge, done func(error)) {
	s.add(chain, c)
	done(nil)
}

// add adds c to the token windows and budgets of chain.
func (s *MemoryStore) add(chain []Limit, ch Charge) {
	now := s.clock()
	for _, l := range chain {
		if !l.Meters() {
			continue
		}
		c := s.lockedCounter(l.Prefix)
		for k := range l.Each {
			if k.Kind() != Requests && ch.settles(k, now) {
				b := ch.periodIn(k.Span())
				if b == 0 {
					b = now.In(k.Span()).Period
				}
				add(c.periods(k), b, ch.windowTokens(k.Kind(), c.resetAt()))
				if l.Class > 0 && l.Floors[0] > 0 { // and to its class's window, which no reset clears
					add(&c.floors().windows[l.Class-1][k], b, ch.Tokens.Of(k.Kind()))
				}
			}
		}
		for p := range l.EachBudget {
			if ch.settlesBudget(l.Budgets.Calendar, p, now) {
				c.addBudget(p, l.Budgets.Calendar.Span(p, cmp.Or(ch.Minute, now.Minute)), ch.Tokens.Cost, -ch.Unreserve)
			}
		}
		c.mu.Unlock()
	}
}

func (s *MemoryStore) sweepLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep()
		}
	}
}

// sweep drops the counters that no admission reads any more: those whose
// periods are all older than the previous one of their span now, and whose
// token bucket is full again (a missing one is full). It reads the clock
// itself, so that idle counters go whether or not requests still come.
func (s *MemoryStore) sweep() {
	now := s.clock()
	latest := now.UnixMillis
	s.tallies.sweep(latest)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		t := *sh.table.Load()
		for j := range t {
			link := &t[j]
			for c := link.Load(); c != nil; c = link.Load() {
				c.mu.Lock()
				if !c.readAt(now) && c.bkt.fullAt <= latest && c.slots.at(latest) == 0 {
					c.dead = true
					link.Store(c.next.Load()) // a walk that is on c goes on from c.next
					sh.n--
					s.counters.Add(-1)
				} else {
					link = &c.next
				}
				c.mu.Unlock()
			}
		}
		sh.mu.Unlock()
	}
}

// Counters is how many counters the store holds, one per limited scope id.
func (s *MemoryStore) Counters() int64 { return s.counters.Load() }

// Interface guards
var _ Store = (*MemoryStore)(nil)
