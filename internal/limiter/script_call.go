package limiter

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// scriptCall is what one call of admit.lua decides and charges: the distinct
// limits of its admissions, and each admission's chain as positions among
// them, so that a limit shared by the chains of a batch (their org, say) is
// read, decided and charged once per call; the token charges of finished
// responses, summed per limit; and the slots that ended requests free.
type scriptCall struct {
	limits   []Limit
	chains   []string       // per admission: the 1-based positions of its limits, a byte each
	reserves []TokenCounts  // per admission: the tokens it reserves on its token windows
	position map[string]int // limit prefix → index in limits, once there are two admissions
	charges  chargeCall
	frees    slotFrees

	// decode's room, kept for the next call of a reused batch: the counts
	// of the call's limits, and its decisions, which the caller reads
	// before the batch is reused
	state     []Counts
	decisions []Decision
}

// reset empties c for another call, keeping its room: nothing a call
// answered refers to it (decode copies what each admission read).
func (c *scriptCall) reset() {
	clear(c.limits)
	clear(c.chains)
	clear(c.position)
	clear(c.decisions)
	c.limits, c.chains, c.reserves = c.limits[:0], c.chains[:0], c.reserves[:0]
	c.charges.reset()
	c.frees.reset()
}

// slotFrees is what a call frees: the chains whose slots it frees, one
// slot of each concurrency cap, and the same summed per limit (the frees of
// a batch often share their org's).
type slotFrees struct {
	chains [][]Limit
	limits []Limit
	slots  []int64 // per limit
}

func (f *slotFrees) reset() {
	clear(f.chains)
	clear(f.limits)
	f.chains, f.limits, f.slots = f.chains[:0], f.limits[:0], f.slots[:0]
}

func (f *slotFrees) add(chain []Limit) {
	f.chains = append(f.chains, chain)
	for _, l := range chain {
		if l.Concurrent.Max == 0 {
			continue
		}
		if i := slices.IndexFunc(f.limits, func(m Limit) bool { return m.Prefix == l.Prefix }); i >= 0 {
			f.slots[i]++
		} else {
			f.limits, f.slots = append(f.limits, l), append(f.slots, 1)
		}
	}
}

// touchesSlots reports whether the call takes or frees slots: it then
// runs under the store's slot lock, which a renewal takes alone.
func (c *scriptCall) touchesSlots() bool {
	return len(c.frees.chains) > 0 || slices.ContainsFunc(c.limits, func(l Limit) bool { return l.Concurrent.Max > 0 })
}

// maxCallLimits is how many distinct limits a byte can point at.
const MaxCallLimits = 255

// add appends an admission, unless that would make the call ambiguous or too
// large: a limit whose counters are in the call already under other caps
// (two handlers sharing counters), or for another class of its floors
// (what the floors hold for the others is then one number per share), must
// be decided in another call. A call of one admission needs no index of
// its limits.
func (c *scriptCall) add(chain []Limit, reserve TokenCounts) bool {
	if len(c.chains) == 1 && c.position == nil {
		c.position = make(map[string]int, 4*len(c.limits))
		for i, l := range c.limits {
			c.position[l.Prefix] = i
		}
	}
	fresh := 0
	for _, l := range chain {
		i, ok := c.position[l.Prefix]
		if ok && (*c.limits[i].Caps != *l.Caps || c.limits[i].Class != l.Class) {
			return false
		}
		if !ok {
			fresh++
		}
	}
	if len(c.limits)+fresh > MaxCallLimits {
		return false
	}
	positions := make([]byte, len(chain))
	for x, l := range chain {
		i, ok := c.position[l.Prefix]
		if !ok {
			i = len(c.limits)
			c.limits = append(c.limits, l)
			if c.position != nil {
				c.position[l.Prefix] = i
			}
		}
		positions[x] = byte(i + 1)
	}
	c.chains = append(c.chains, string(positions))
	c.reserves = append(c.reserves, reserve)
	return true
}

// keys declares every key admit.lua touches: per limit, the keys of each
// of its parts (writeKeys); then the key of each charge, by charge class:
// the current period, or a settlement's own; then the reset key of each
// limit whose windows a settlement may restore; then the slots key of each
// limit freed. They are written into one buffer and cut from one
// string: two allocations for a call's keys, not one each.
func (c *scriptCall) keys(atMinute int64) []string {
	var keys cutText
	keys.grow(4*len(c.limits)+c.charges.count()+len(c.charges.resets)+len(c.frees.limits), 64)
	for _, l := range c.limits {
		for p := range l.parts().All {
			writeKeys(&keys, l, p, atMinute)
		}
	}
	current := [...]int64{Minute: atMinute, Day: DayOf(atMinute)}
	for _, classKeys := range c.charges.keys {
		for _, k := range classKeys {
			if k.calendar != nil {
				k.calendar.Span(k.budget, cmp.Or(k.period, atMinute)).writeKey(&keys.text, k.prefix, k.budget, k.reserved)
			} else {
				writePeriodKey(&keys.text, k.prefix, k.window, cmp.Or(k.period, current[k.window.Span()]))
			}
			keys.end()
		}
	}
	for _, prefix := range c.charges.resets {
		writeResetKey(&keys.text, prefix)
		keys.end()
	}
	for _, l := range c.frees.limits {
		writeSlotsKey(&keys.text, l)
		keys.end()
	}
	return keys.strings()
}

// cutText is strings written one after another, then cut from the one
// string they make.
type cutText struct {
	text strings.Builder
	ends []int // of each string in text
}

// grow makes room for n strings of about size bytes each.
func (t *cutText) grow(n, size int) {
	t.text.Grow(n * size)
	t.ends = make([]int, 0, n)
}

// end ends a string, which text now ends with.
func (t *cutText) end() { t.ends = append(t.ends, t.text.Len()) }

// strings are the strings, cut from one.
func (t *cutText) strings() []string {
	all, start := t.text.String(), 0
	out := make([]string, len(t.ends))
	for i, end := range t.ends {
		out[i], start = all[start:end], end
	}
	return out
}

// reserving reports whether an admission of the call reserves tokens.
func (c *scriptCall) reserving() bool {
	return slices.ContainsFunc(c.reserves, func(r TokenCounts) bool { return !r.IsZero() })
}

// args are the call's arguments of admit.lua, whose clock argument is
// clock, whose keys name the minute period, and whose slots are holder's.
func (c *scriptCall) args(clock string, atMinute int64, peek bool, holder string) []any {
	mode, reserving, split := "a", !peek && c.reserving(), false
	switch {
	case peek:
		mode = "p"
	case reserving:
		// Input and output sizes only when a part of the call counts them.
		var parts partSet
		for _, l := range c.limits {
			parts |= l.parts()
		}
		mode, split = "r", parts&splitParts != 0
		if split {
			mode = "s"
		}
	}
	caps, capsOf := c.distinctCaps()
	costs := reserving && slices.ContainsFunc(caps, func(l Caps) bool { return l.Budgets.Max != [NumBudgetPeriods]int64{} })
	var a callArgs
	restores := c.charges.restoreArgs()
	a.grow(14+c.charges.count()+restores+len(c.frees.slots)+7*len(caps)+5*len(c.chains), c.charges.count()+restores+len(c.chains)+2*len(caps))
	a.args = append(a.args, clock)
	a.hex(atMinute)
	a.args = append(a.args, mode)
	a.hex(int64(len(c.limits)))
	for _, classKeys := range c.charges.keys {
		a.hex(int64(len(classKeys)))
	}
	a.hex(int64(len(caps)))
	a.hex(int64(len(c.frees.slots)))
	a.args = append(a.args, holder)
	a.hex(int64(len(c.charges.resets)))
	a.hex(int64(restores))
	for _, classAmounts := range c.charges.amounts {
		for _, n := range classAmounts {
			a.decimal(n)
		}
	}
	c.charges.writeRestores(&a)
	for _, n := range c.frees.slots {
		a.hex(n)
	}
	for _, l := range caps {
		a.args = append(a.args, flagArg(l.Shadow), l.partsArg())
		for p := range l.parts().All {
			l.writeArgs(&a, p, atMinute)
		}
	}
	a.args = append(a.args, capsOf, c.classes())
	for m, chain := range c.chains {
		switch r := c.reserves[m]; {
		case split:
			a.hex(r.Total)
			a.hex(r.Input)
			a.hex(r.Output)
		case reserving:
			a.hex(r.Total)
		}
		if costs {
			a.hex(c.reserves[m].Cost)
		}
		a.args = append(a.args, chain)
	}
	return a.done()
}

// callArgs builds a call's arguments. Its numbers are hexadecimal (token
// charges decimal, as INCRBY takes them); the small ones are boxed once,
// and the others written into one buffer, cut from one string once every
// argument is in and passed by pointer (go-redis writes a *string as its
// string): a few allocations for a call's numbers rather than two each.
type callArgs struct {
	args    []any
	numbers cutText
	at      []int // of each of numbers in args
}

// grow makes room for n arguments, of which about numbers are written.
func (a *callArgs) grow(n, numbers int) {
	a.args, a.at = make([]any, 0, n), make([]int, 0, numbers)
	a.numbers.grow(numbers, 8)
}

// hex appends n in hexadecimal.
func (a *callArgs) hex(n int64) {
	if n >= 0 && n < int64(len(smallHexArgs)) {
		a.args = append(a.args, smallHexArgs[n])
		return
	}
	a.written(n, 16)
}

// decimal appends n in decimal.
func (a *callArgs) decimal(n int64) { a.written(n, 10) }

// written writes n in base and appends it, in its place.
func (a *callArgs) written(n int64, base int) {
	writeInt(&a.numbers.text, n, base)
	a.numbers.end()
	a.at = append(a.at, len(a.args))
	a.args = append(a.args, nil)
}

// done puts the written numbers in their places and returns the arguments.
func (a *callArgs) done() []any {
	numbers := a.numbers.strings()
	for i := range numbers {
		a.args[a.at[i]] = &numbers[i]
	}
	return a.args
}

// distinctCaps lists the distinct caps of the call's limits, and for each
// limit the position (1-based) of its caps among them, a byte each: the
// limits of a call share a handful of caps (every key of one "limit key *"
// line has the same), and each number the script reads costs it a string.
// A call has at most maxCallLimits limits, which bounds the search.
func (c *scriptCall) distinctCaps() ([]Caps, string) {
	var caps []Caps
	of := make([]byte, len(c.limits))
	for i, l := range c.limits {
		at := slices.Index(caps, *l.Caps)
		if at < 0 {
			at = len(caps)
			caps = append(caps, *l.Caps)
		}
		of[i] = byte(at + 1)
	}
	return caps, string(of)
}

// classes is each limit's class on its floors, a byte each, or "" when
// no limit of the call has floors.
func (c *scriptCall) classes() string {
	if !hasFloors(c.limits) {
		return ""
	}
	classes := make([]byte, len(c.limits))
	for i, l := range c.limits {
		classes[i] = l.Class
	}
	return string(classes)
}

// decode reads the reply into one decision per admission. The reply has the
// counts as the call found them; each admission read them as charged by the
// admissions before it in the call, which decode replays.
func (c *scriptCall) decode(reply []int64, charged bool) ([]Decision, error) {
	k, n := len(c.chains), len(c.limits)
	if len(reply) != c.replyLen() || reply[0] != 1 {
		return nil, fmt.Errorf("%w: admission reply of %d values for %d admissions of %d limits", ErrBadReply, len(reply), k, n)
	}
	now := MomentAt(reply[1])
	c.state = slices.Grow(c.state[:0], n)[:n]
	state := c.state
	clear(state)
	r := reply[2:]
	for i, l := range c.limits {
		for p := range l.parts().All {
			r = state[i].read(l.Caps, p, r)
		}
	}
	c.decisions = slices.Grow(c.decisions[:0], k)[:k]
	ds := c.decisions
	for m, chain := range c.chains {
		flag := r[m]
		if flag != 0 && flag != 1 {
			return nil, fmt.Errorf("%w: admission flag %d", ErrBadReply, flag)
		}
		d := Decision{Admitted: flag == 1, Now: now, Counts: make([]Counts, len(chain)), Reserve: c.reserves[m]}
		for x := range len(chain) {
			d.Counts[x] = state[chain[x]-1]
		}
		if charged {
			for x := range len(chain) {
				i := chain[x] - 1
				if d.Admitted {
					d.AddTo(c.limits[i], &state[i])
				}
				if c.limits[i].Notify[0] > 0 { // as admit.lua notices, admitted or not
					noticed := state[i].noticed(c.limits[i], now)
					state[i].ownExtra().Notified = noticed
				}
			}
		}
		ds[m] = d
	}
	return ds, nil
}

// replyLen is how many numbers admit.lua answers the call: 1 and the
// moment, the counts of each limit's parts, and a flag per admission.
func (c *scriptCall) replyLen() int {
	n := 2 + len(c.chains)
	for _, l := range c.limits {
		for p := range l.parts().All {
			n += l.replies(p)
		}
	}
	return n
}

// hexArg is a number argument of admit.lua.
func HexArg(n int64) string { return strconv.FormatInt(n, 16) }

// smallHexArgs are the small numbers, most of a call's (its counts, most
// caps' absent parts), as arguments of a call: each boxed once, here,
// rather than formatted and boxed at each call.
var smallHexArgs = func() (args [256]any) {
	for n := range args {
		args[n] = HexArg(int64(n))
	}
	return args
}()

// flagArg is a flag as admit.lua reads it: whether caps are a shadow
// limit's, or a report a refusal.
func flagArg(flag bool) any {
	if flag {
		return "1"
	}
	return "0"
}

// chargeCall is what one call charges: tokens per period of a token window,
// and nano-dollars per period of a budget, spent or reserved, summed over
// the charges of a batch. A sum of settlements that is negative gives back
// at most what the period holds. Before them, the script adds back what
// settlements reserved to each window whose limit was reset after their
// admission (restores: charge.windowTokens).
type chargeCall struct {
	keys     [numChargeClasses][]chargeKey // the script takes them class by class
	amounts  [numChargeClasses][]int64
	position map[chargeKey]int // index in keys[its class]

	// What a reset may have taken from the windows each settlement of a
	// reservation charges: the settlements, each with the windows it may
	// restore (restored, in order), and the limits whose reset keys they
	// read, each once: the script reads those keys, and the settlements
	// only when a limit was reset after the earliest of their admissions,
	// which is rare (a restore per settlement and window, each with two
	// keys and a read of its own, was a fifth of Redis's time per request).
	settlements []restoringSettlement
	restored    []restoredWindow
	resets      []string       // prefixes
	resetOf     map[string]int // prefix → index in resets
}

// restoringSettlement is the settlements of reservations admitted at one
// moment, which a reset since may have taken from their windows: when they
// were admitted (unix milliseconds), and how many of the call's restored
// windows are theirs.
type restoringSettlement struct {
	admitted int64
	windows  int
}

// restoredWindow is a window a settlement restores if its limit was reset
// after the settlement's admission: its charged key (the reservation's
// period), its limit's reset key (an index in resets), and what the
// reservations held of it.
type restoredWindow struct {
	key      chargeKey
	reset    int
	reserved int64
}

// chargeClass is what a charged key counts, which decides how long it
// lives: the period of a minute window or of a day window, or a budget's
// day or month.
type chargeClass uint8

const (
	minuteWindowCharge chargeClass = iota
	dayWindowCharge
	dayBudgetCharge
	monthBudgetCharge
	numChargeClasses
)

// chargeKey is a counter a call charges: the period of a limit's token
// window, or, with a calendar, of a budget's spent or reserved count.
// Period 0 is the call's current one; a budget's period is named by any
// minute period in it.
type chargeKey struct {
	prefix   string
	window   WindowKind
	calendar *Calendar
	budget   BudgetPeriod
	reserved bool
	period   int64
}

func (k chargeKey) class() chargeClass {
	if k.calendar != nil {
		return dayBudgetCharge + chargeClass(k.budget)
	}
	return chargeClass(k.window.Span())
}

// add adds what ch changes in chain's windows and budgets at now, by the
// gateway's clock (when Redis's clock is already further, the script
// writes a period that no admission reads any more, and which expires).
func (c *chargeCall) add(chain []Limit, ch Charge, now moment) {
	for _, l := range chain {
		for k := range l.Each {
			if k.Kind() == Requests || !ch.settles(k, now) {
				continue
			}
			key := chargeKey{prefix: l.Prefix, window: k, period: ch.periodIn(k.Span())}
			if n := ch.Tokens.Of(k.Kind()); n != 0 {
				c.addTo(key, n)
				if l.Class > 0 && l.Floors[0] > 0 { // and to its class's window, which no reset clears
					c.addTo(chargeKey{prefix: l.ofClass(l.Class).Prefix, window: k, period: key.period}, n)
				}
			}
			if n := ch.reserved.Of(k.Kind()); n != 0 {
				c.addTo(key, 0) // the key it restores is declared as charged
				c.restore(ch.admitted, key, c.resetIndex(l.Prefix), n)
			}
		}
		for p := range l.EachBudget {
			if !ch.settlesBudget(l.Budgets.Calendar, p, now) {
				continue
			}
			key := chargeKey{prefix: l.Prefix, calendar: l.Budgets.Calendar, budget: p}
			if ch.Minute != 0 { // named by its first minute, so that settlements of a period are summed
				key.period = FloorDiv(l.Budgets.Calendar.Span(p, ch.Minute).Start, MinuteMillis)
			}
			if ch.Tokens.Cost != 0 {
				c.addTo(key, ch.Tokens.Cost)
			}
			if key.reserved = true; ch.Unreserve != 0 {
				c.addTo(key, -ch.Unreserve)
			}
		}
	}
}

// addTo adds n to what the call adds to key.
func (c *chargeCall) addTo(key chargeKey, n int64) {
	keys, amounts := &c.keys[key.class()], &c.amounts[key.class()]
	i, ok := c.position[key]
	if !ok {
		if c.position == nil {
			c.position = make(map[chargeKey]int)
		}
		i = len(*keys)
		c.position[key] = i
		*keys, *amounts = append(*keys, key), append(*amounts, 0)
	}
	(*amounts)[i] += n
}

func (c *chargeCall) reset() {
	for class := range c.keys {
		clear(c.keys[class])
		c.keys[class], c.amounts[class] = c.keys[class][:0], c.amounts[class][:0]
	}
	clear(c.position)
	clear(c.restored)
	clear(c.resets)
	clear(c.resetOf)
	c.settlements, c.restored, c.resets = c.settlements[:0], c.restored[:0], c.resets[:0]
}

// restore adds a window that a settlement admitted at admitted restores,
// which reserved n tokens. The settlements of one moment's admissions
// (often those of one call) are one: what they restore to a window is
// summed.
func (c *chargeCall) restore(admitted int64, key chargeKey, reset int, n int64) {
	if len(c.settlements) == 0 || c.settlements[len(c.settlements)-1].admitted != admitted {
		c.settlements = append(c.settlements, restoringSettlement{admitted: admitted})
	}
	s := &c.settlements[len(c.settlements)-1]
	windows := c.restored[len(c.restored)-s.windows:]
	if w := slices.IndexFunc(windows, func(w restoredWindow) bool { return w.key == key }); w >= 0 {
		windows[w].reserved += n
		return
	}
	c.restored, s.windows = append(c.restored, restoredWindow{key: key, reset: reset, reserved: n}), s.windows+1
}

// sizesOf appends to sizes the distinct sizes that windows reserved, in
// order: most often one or two (each limit's tpm the requests' tokens, the
// shared limits' the sum of them), which the script's arguments name once.
func sizesOf(sizes []int64, windows []restoredWindow) []int64 {
	for _, w := range windows {
		if !slices.Contains(sizes, w.reserved) {
			sizes = append(sizes, w.reserved)
		}
	}
	return sizes
}

// resetIndex is the index of the reset key of the limit with prefix among
// those the call reads.
func (c *chargeCall) resetIndex(prefix string) int {
	i, ok := c.resetOf[prefix]
	if !ok {
		if c.resetOf == nil {
			c.resetOf = make(map[string]int)
		}
		i = len(c.resets)
		c.resetOf[prefix], c.resets = i, append(c.resets, prefix)
	}
	return i
}

// count is how many counters the call charges, or may restore (each is
// charged too): a call of them is never replayed.
func (c *chargeCall) count() int {
	n := 0
	for _, keys := range c.keys {
		n += len(keys)
	}
	return n
}

// restoreArgs is how many arguments the restores take (writeRestores).
func (c *chargeCall) restoreArgs() int {
	if len(c.settlements) == 0 {
		return 0
	}
	n, restored := 1+2*len(c.settlements), c.restored
	var sizes []int64
	for _, s := range c.settlements {
		sizes = sizesOf(sizes[:0], restored[:s.windows])
		n, restored = n+len(sizes), restored[s.windows:]
	}
	return n
}

// writeRestores appends the restores' arguments: the earliest admission of
// the call's settlements, then per settlement its admission, one argument
// of 9 bytes per window it restores (the charge's position among the
// call's charges, its reset key's among the call's reset keys, and which
// of the settlement's sizes it reserved, each 1-based, in 3 bytes, most
// significant first), and those sizes, decimal, each named by a window.
func (c *chargeCall) writeRestores(a *callArgs) {
	if len(c.settlements) == 0 {
		return
	}
	var first [numChargeClasses]int // each class's first charge, 0-based
	for class := 1; class < int(numChargeClasses); class++ {
		first[class] = first[class-1] + len(c.keys[class-1])
	}
	earliest := c.settlements[0].admitted
	for _, s := range c.settlements {
		earliest = min(earliest, s.admitted)
	}
	a.hex(earliest)
	restored := c.restored
	var sizes []int64
	for _, s := range c.settlements {
		a.hex(s.admitted)
		sizes = sizesOf(sizes[:0], restored[:s.windows])
		windows := make([]byte, 0, 9*s.windows)
		for _, w := range restored[:s.windows] {
			charge, reset, size := first[w.key.class()]+c.position[w.key]+1, w.reset+1, slices.Index(sizes, w.reserved)+1
			windows = append(windows, byte(charge>>16), byte(charge>>8), byte(charge), byte(reset>>16), byte(reset>>8), byte(reset), byte(size>>16), byte(size>>8), byte(size))
		}
		a.args = append(a.args, string(windows))
		for _, n := range sizes {
			a.decimal(n)
		}
		restored = restored[s.windows:]
	}
}

// scriptItem is one request's part of a call of admit.lua: its admission
// (and its reservation); or, once it has ended, the token charge of its
// response or the free of its slots (done is set).
type scriptItem struct {
	chain   []Limit
	reserve TokenCounts
	charge  Charge
	free    bool              // the item frees chain's slots rather than charging
	answer  chan scriptAnswer // an admission's; buffered: a call never waits on it
	claim   atomic.Int32      // an admission's: whether its waiter still takes the answer (claims)
	done    func(error)       // a charge's or a free's outcome
}

// An admission's claim: the call that decides it and the waiter that gives
// up on it race to claim it, so that the slots of an admission nobody
// waits for any more are freed, never held by no one.
const (
	unclaimed int32 = iota
	answered
	abandoned
)

// scriptAnswer is an admission's decision, or a charge's outcome.
type scriptAnswer struct {
	d   Decision
	err error
}

// scriptBatch is one call of admit.lua made of the items the coalescer
// (internal/coalesce) found waiting: it charges the tokens of finished
// responses, summed per key, then decides the admissions in arrival order,
// each all-or-nothing as if sent alone, so that a limit several requests
// share (their org, say) is read, decided and charged once per call. A token
// charge rides in the next call that admits, and takes a call of its own only
// when none comes within chargeLinger.
//
// A call keeps the single request's guarantees: its admissions are replayed
// once on a dead connection (its token charges never are), and when a call
// fails, every item in it gets the error (for an admission, on_redis_error
// applies to each). An admission whose counters are in the call under other
// caps waits for the next call.
type scriptBatch struct {
	store  *RedisStore
	call   scriptCall
	items  []*scriptItem
	pooled bool // from store.batches, to which Send puts it back
}

func (b *scriptBatch) Add(item *scriptItem) bool {
	switch {
	case item.free:
		b.call.frees.add(item.chain)
	case item.done != nil:
		b.call.charges.add(item.chain, item.charge, b.store.gatewayMoment())
	case !b.call.add(item.chain, item.reserve):
		return false
	}
	b.items = append(b.items, item)
	return true
}

func (b *scriptBatch) Send() {
	ds, charged, err := b.store.call(context.Background(), &b.call, false)
	k := 0
	for _, item := range b.items {
		switch {
		case item.done != nil:
			item.done(charged)
		case err != nil:
			item.answer <- scriptAnswer{err: err}
		default:
			d := ds[k]
			k++
			if !item.claim.CompareAndSwap(unclaimed, answered) && d.Admitted && HoldsSlots(item.chain) {
				b.store.Free(item.chain) // its waiter gave up: it fails open, holding nothing
			}
			item.answer <- scriptAnswer{d: d}
		}
	}
	if b.pooled {
		b.reset()
		b.store.batches.Put(b)
	}
}

// reset empties b for another call, keeping its room.
func (b *scriptBatch) reset() {
	clear(b.items)
	b.items = b.items[:0]
	b.call.reset()
}
