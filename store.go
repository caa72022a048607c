package ratelimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rolter/caddy-ratelimit/internal/pricing"
)

// store keeps the counters. Both implementations (Redis and in-process) pass
// the same conformance suite (store_test.go).
type store interface {
	// admit decides one request against every limit of chain in one atomic
	// step: admitted only if every window of every limit fits (a token
	// window fits while its estimate plus the part of reserve it counts is
	// within it; without a reservation, while the estimate is below it),
	// every bucket, every concurrency cap has a slot free, and every budget
	// has room for reserve's cost (budget.go); then charged one request on
	// every request window, its cost on every bucket, reserve on every
	// token window (its total on tpm and tpd, its input on itpm and itpd,
	// its output on otpm and otpd), one slot of every concurrency cap, which
	// free gives back, and reserve's cost on what every budget holds
	// reserved; refused and charged nothing otherwise. A refusal says why, and may come from the store's own
	// record of what it refused (the Redis store's refusal cache) without
	// asking its backend.
	admit(ctx context.Context, chain []limit, reserve tokenCounts) (admission, error)
	// free gives back the slots an admitted request of chain took, once,
	// when it ends, without making its caller wait. A free that fails is
	// not retried: the store's next renewal of its slots mends it
	// (slots.go).
	free(chain []limit)
	// refusedUnread answers a refusal of chain that no request body can
	// change (by a request window, a bucket or a concurrency cap) when the
	// store knows it without its backend, so that the body of a request
	// already refused is never read; it charges nothing.
	refusedUnread(chain []limit) (admission, bool)
	// peek reads the chain's counters as admit would, and charges nothing.
	peek(ctx context.Context, chain []limit) (decision, error)
	// charge charges c to every token window and budget of chain, without
	// making its caller wait: done gets the outcome, once, from another goroutine or
	// before charge returns. It is never replayed: a double charge would
	// outlive the failure.
	charge(chain []limit, c charge, done func(error))
	// reset clears l's window counters and its token bucket, and keeps its
	// slots and budgets (reset.go); it answers what it cleared by name.
	reset(ctx context.Context, l limit) (cleared []string, err error)
	// describe says what the store is, for the admin API's live view.
	describe() storeDescription
	// hold keeps the store usable, even after the last config that uses it
	// is unloaded, until the matching release: a response or session
	// admitted under an old config still charges its tokens.
	hold()
	release()
}

// storeDescription is what a store is: stores that describe alike share
// their counters.
type storeDescription struct {
	kind  string // "memory" or "redis"
	where string // a Redis store's servers; "" in process
	// tagged: every key of a chain carries its root's hash tag (Redis
	// Cluster), so that counters are read under a root.
	tagged bool
}

// charge is tokens added to the token windows after a response, and its
// cost to the budgets: a reactive charge in the current periods, or a
// settlement, which replaces a reservation by the usage reported and goes
// in the periods the reservation was made in: tokens are then the
// difference, and may be negative, and the reserved cost is taken back
// from the budgets' reservations (unreserve) as the cost is added to what
// they hold spent. A settlement never takes a counter below zero, and
// changes nothing in a window whose period it is out of (older than the
// previous minute, or the previous day), nor in a budget period that has
// ended. A reset of a limit after the reservation's admission took the
// reservation from its windows (reset.go): a settlement then adds its
// reservation back to them with the difference, which charges what the
// request used (windowTokens).
type charge struct {
	tokens    tokenCounts // tokens.cost is added to what the budgets hold spent
	unreserve int64       // nano-dollars the budgets hold reserved for the request
	minute    int64       // the reservation's minute period (unix_seconds / 60), and its day; 0: the current ones
	// A settlement's reservation: when it was admitted (unix milliseconds,
	// by the store's clock), and what it reserved on the token windows.
	admitted int64
	reserved tokenCounts
}

// settling is c as the settlement of the reservation that the admission d
// made: in its periods, giving back its reserved cost.
func (c charge) settling(d decision) charge {
	c.minute, c.admitted, c.reserved, c.unreserve = d.now.minute, d.now.unixMillis, d.reserve, d.reserve.cost
	return c
}

// settles reports whether c may change a counter of window k at now: it
// has tokens of k's kind, or reserved some, and its period is still in k's
// window.
func (c charge) settles(k windowKind, now moment) bool {
	if c.tokens.of(k.kind()) == 0 && c.reserved.of(k.kind()) == 0 {
		return false
	}
	return c.minute == 0 || c.periodIn(k.span()) >= now.in(k.span()).period-1
}

// windowTokens is what c adds to a window that counts k, whose limit was
// last reset at resetAt (unix milliseconds; 0: never): the difference, and
// what the reservation held if the reset came after its admission. A
// request admitted in the very millisecond of the reset, before it, is
// taken as admitted after it: its settlement charges only what it used
// beyond its reservation, and never anything twice.
func (c charge) windowTokens(k kind, resetAt int64) int64 {
	n := c.tokens.of(k)
	if resetAt > c.admitted {
		n += c.reserved.of(k)
	}
	return n
}

// changes reports whether c changes a counter of chain at now.
func (c charge) changes(chain []limit, now moment) bool {
	for _, l := range chain {
		for k := range l.each {
			if k.kind() != requests && c.settles(k, now) {
				return true
			}
		}
		for p := range l.eachBudget {
			if c.settlesBudget(l.budgets.calendar, p, now) {
				return true
			}
		}
	}
	return false
}

// periodIn is c's period in span s; 0 is the current one.
func (c charge) periodIn(s span) int64 {
	if s == day && c.minute != 0 {
		return dayOf(c.minute)
	}
	return c.minute
}

// admission is a store's answer to a request.
type admission struct {
	decision
	// limits are the limits whose counters decision holds, in chain order:
	// the chain, or, for a refusal answered by the refusal cache, the
	// chain's limits that the cache refuses.
	limits []limit
	// refusal says why a refused request is refused; first is -1 for an
	// admitted one.
	refusal refusal
}

// admissionOf is the answer that the decision d of the store's backend on
// chain gives. A refusal that no limit's counts explain is a bad reply.
func admissionOf(chain []limit, d decision) (admission, error) {
	a := admission{decision: d, limits: chain, refusal: refusal{first: -1}}
	if !d.admitted {
		if a.refusal = refusalOf(chain, d); a.refusal.first < 0 {
			return admission{}, errBadReply
		}
	}
	return a, nil
}

// lifetime closes a store once it is both unloaded and released by every
// holder.
type lifetime struct {
	holders  atomic.Int64
	unloaded atomic.Bool
	once     sync.Once
}

func (l *lifetime) hold() { l.holders.Add(1) }

func (l *lifetime) release(close func()) {
	if l.holders.Add(-1) == 0 && l.unloaded.Load() {
		l.once.Do(close)
	}
}

// unload is called when no loaded config uses the store any more.
func (l *lifetime) unload(close func()) {
	l.unloaded.Store(true)
	if l.holders.Load() == 0 {
		l.once.Do(close)
	}
}

// limit is one configured cap applied to one scope id of a request.
type limit struct {
	scope  string // the scope's name, for messages and logs
	id     string // the id as it appears in keys: digested unless its scope is readable
	prefix string // "rolter:rl:<scope>:<id>:", to which the store appends "<window>:<period>" (periodKey), "bkt" (writeBucketKey), "slots" (slotsKey) or a budget's (periodSpan.writeKey)
	// The caps, shared by every limit of one line and never changed once
	// a limit has them: a chain is copied and walked many times a request,
	// and the caps are most of a limit's size.
	*limitCaps
}

// limitCaps are what one limit caps.
type limitCaps struct {
	windows    windowCaps
	capped     uint8 // bit k: windows[k] is capped
	bucket     tokenBucket
	concurrent concurrencyCap
	budgets    budgetCaps
	// shadow: the limit is counted as the others are, in the same atomic
	// step, but never refuses (shadow.go).
	shadow bool
}

// windowLimitCaps are the caps of windows w, without a bucket.
func windowLimitCaps(w windowCaps) limitCaps { return limitCaps{windows: w, capped: w.mask()} }

// meters reports whether a token window or a budget is capped: the
// request's usage is then metered.
func (c *limitCaps) meters() bool {
	return c.capsTokens() || c.budgets.max != [numBudgetPeriods]int64{}
}

// capsTokens reports whether a token window is capped.
func (c *limitCaps) capsTokens() bool { return c.capped&^(1<<rpm|1<<rpd) != 0 }

// each yields the windows the limit caps, in windowKind order, with their
// caps: most limits cap two of the eight, and a request walks them a few
// times.
func (c *limitCaps) each(yield func(windowKind, int64) bool) {
	for m := c.capped; m != 0; m &= m - 1 {
		k := windowKind(bits.TrailingZeros8(m))
		if !yield(k, c.windows[k]) {
			return
		}
	}
}

// describe is the caps after name, for the log.
func (c limitCaps) describe(name string) string {
	var s strings.Builder
	s.WriteString(name)
	for k, n := range c.windows {
		if n > 0 {
			fmt.Fprintf(&s, " %s %d", windowKind(k), n)
		}
	}
	if c.bucket.rate > 0 {
		fmt.Fprintf(&s, " rate %s burst %d cost %d", c.bucket.rateText, c.bucket.burst, c.bucket.cost)
	}
	if c.concurrent.max > 0 {
		fmt.Fprintf(&s, " concurrent %d", c.concurrent.max)
	}
	for p, budget := range c.eachBudget {
		fmt.Fprintf(&s, " %s %s", p.capName(), pricing.FormatUSD(budget))
	}
	if c.budgets.calendar != nil {
		fmt.Fprintf(&s, " (%s)", c.budgets.calendar.name)
	}
	if c.shadow {
		s.WriteString(" shadow")
	}
	return s.String()
}

// newTaggedLimit is a limit whose keys carry a Redis Cluster hash tag,
// "{<root-scope>:<root-id>}:", so that every key of a chain is in one slot;
// tag is "" elsewhere.
func newTaggedLimit(tag, scope, id string, caps limitCaps) limit {
	l := []limit{{scope: scope, id: id, limitCaps: &caps}}
	tagPrefixes(tag, l)
	return l[0]
}

// keysPrefix starts every key of the store.
const keysPrefix = "rolter:rl:"

// writePrefix writes the prefix of l's keys with tag:
// "rolter:rl:<tag><scope>:<id>:".
func writePrefix(b *strings.Builder, tag string, l limit) {
	b.WriteString(keysPrefix)
	b.WriteString(tag)
	b.WriteString(l.scope)
	b.WriteByte(':')
	b.WriteString(l.id)
	b.WriteByte(':')
}

// prefixLen is the length of what writePrefix writes.
func prefixLen(tag string, l limit) int {
	return len(keysPrefix) + len(tag) + len(l.scope) + len(l.id) + 2
}

// tagPrefixes gives each limit of chain the prefix of its keys with tag, cut
// from one string: one allocation for the chain, not one per limit.
func tagPrefixes(tag string, chain []limit) {
	n := 0
	for _, l := range chain {
		n += prefixLen(tag, l)
	}
	var b strings.Builder
	b.Grow(n)
	for _, l := range chain {
		writePrefix(&b, tag, l)
	}
	all, at := b.String(), 0
	for i := range chain {
		end := at + prefixLen(tag, chain[i])
		chain[i].prefix, at = all[at:end], end
	}
}

// chainTag is the hash tag of a chain rooted at the given scope id.
func chainTag(rootScope, rootID string) string {
	return "{" + rootScope + ":" + rootID + "}:"
}

// counts are a limit's counters as an admission read them, before the
// admitted request was charged.
type counts struct {
	w       [numWindows]window // by windowKind; only the capped ones are read
	deficit int64              // the bucket's, refilled to the store's clock
	slots   int64              // the concurrency cap's slots held, by every holder
	// spent and reserved are each budget's, in its current period, by
	// budgetPeriod.
	spent, reserved [numBudgetPeriods]int64
}

// decision is what a store answers to an admission.
type decision struct {
	admitted bool
	now      moment   // the store's clock (Redis TIME for the Redis store)
	counts   []counts // one per limit of the chain, in chain order
	// reserve is the tokens the admission reserves on the token windows of
	// its chain, in their current periods (its size against them).
	reserve tokenCounts
}

// size is what an admission of d adds to a counter of kind k (a budget's
// reservation: budget).
func (d decision) size(k kind) int64 { return d.reserve.of(k) }

// countsAfter is c, the counts of limit l that d read, as d's admission
// leaves them: its size added to the current period of each window l caps,
// l's cost to its bucket's deficit, a slot to its concurrency cap's, and
// the reserved cost to what its budgets hold reserved. The in-process
// store writes them, a call of admit.lua replays them for the admissions
// after, and the headers of an admitted request count it in them.
func (d decision) countsAfter(l limit, c counts) counts {
	for k := range l.each {
		c.w[k].cur += d.size(k.kind())
	}
	if l.bucket.rate > 0 {
		c.deficit += l.bucket.cost * microTokens
	}
	if l.concurrent.max > 0 {
		c.slots++
	}
	for p := range l.eachBudget {
		c.reserved[p] += d.reserve.cost
	}
	return c
}

// errBadReply marks a store answer of the wrong shape; it is handled like an
// outage.
var errBadReply = errors.New("rolter_ratelimit: unexpected reply from the store")

// keyID is how a scope id appears in store keys, logs, metrics, the admin
// API's answers and error bodies. Every id is "#" and the first 32 hex digits
// of its SHA-256, so that no API key, bearer token, email or customer id is
// ever written out, whatever its scope is called; only a scope declared
// readable keeps a short plain id as it is.
func keyID(readable bool, id string) string {
	if readable && isPlainID(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	var digest [33]byte
	digest[0] = '#'
	hex.Encode(digest[1:], sum[:16])
	return string(digest[:])
}

// prefixKeyID is how the pool of every id of a scope that starts with prefix
// appears: the prefix and "*" in a readable scope, when the prefix is a
// short plain token, else the digest of that.
func prefixKeyID(readable bool, prefix string) string {
	if readable && isPlainID(prefix) {
		return prefix + "*"
	}
	return keyID(false, prefix+"*")
}

func isPlainID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		plain := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
		if !plain {
			return false
		}
	}
	return true
}
