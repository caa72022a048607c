package limiter

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The top consumers: per scope, a tally of each of its ids in the current
// day and month (of a budget calendar), by what they were admitted,
// refused, charged in tokens and in spend, from which the admin API
// answers the ids with the most. The Redis store keeps a tally as a
// sorted set per scope, measure and period, which expires two days after
// its period ends; every gateway adds to it with ZINCRBY, atomic and
// commutative, so that the totals are exact across replicas. Additions
// are summed in the gateway and sent together every tallyLinger, off the
// request's path; a failed send loses its additions to the tally (the
// view is an operator's, never a cap), and counts as a failed Redis call.

// TopMeasure is what a tally counts of an id.
type TopMeasure uint8

const (
	TopRequests TopMeasure = iota // requests admitted
	TopRefusals                   // requests refused by a cap
	TopTokens                     // tokens charged (what tpm counts)
	TopSpend                      // nano-dollars charged
	NumTopMeasures
)

// String is the measure's name in the admin API and the keys.
func (m TopMeasure) String() string {
	return [...]string{"requests", "refusals", "tokens", "spend"}[m]
}

// TopMeasureNamed is the measure called name, if one is.
func TopMeasureNamed(name string) (TopMeasure, bool) {
	for m := range NumTopMeasures {
		if m.String() == name {
			return m, true
		}
	}
	return 0, false
}

// TopID is an id of a scope whose tally a request adds to.
type TopID struct{ Scope, ID string }

// TopEntry is an id and its tally.
type TopEntry struct {
	ID string
	N  int64
}

// TopTally is the ids of a tally with the most, and the first moment of
// its period (unix milliseconds).
type TopTally struct {
	Start int64
	Top   []TopEntry
}

// tallyLinger is how long a gateway sums additions before it sends them.
const tallyLinger = 50 * time.Millisecond

// tallyKey names a tally: its scope, measure and period.
type tallyKey struct {
	scope   string
	measure TopMeasure
	budget  BudgetPeriod
	span    periodSpan
}

// redisKey is the sorted set that holds the tally.
func (k tallyKey) redisKey() string {
	return "rolter:top:" + k.scope + ":" + k.measure.String() + ":" + k.budget.String() + ":" + k.span.name
}

// tallyKeys are the keys of the tallies of measure m of scope at now by
// calendar c: the day's and the month's.
func tallyKeys(c *Calendar, scope string, m TopMeasure, now moment) [NumBudgetPeriods]tallyKey {
	var keys [NumBudgetPeriods]tallyKey
	for p := range NumBudgetPeriods {
		keys[p] = tallyKey{scope: scope, measure: m, budget: p, span: c.SpanAt(p, now)}
	}
	return keys
}

// tallies are tallies as one process sums them: the in-process store's
// whole tallies, or what a Redis store has yet to send.
type tallies struct {
	mu sync.Mutex
	n  map[tallyKey]map[string]int64
}

// add adds n of measure m to each id of ids in the tallies of the periods
// holding now by calendar c.
func (t *tallies) add(c *Calendar, ids []TopID, m TopMeasure, n int64, now moment) {
	if n == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == nil {
		t.n = make(map[tallyKey]map[string]int64)
	}
	for _, id := range ids {
		for _, k := range tallyKeys(c, id.Scope, m, now) {
			ids := t.n[k]
			if ids == nil {
				ids = make(map[string]int64)
				t.n[k] = ids
			}
			ids[id.ID] += n
		}
	}
}

// top is the n ids of the tally k with the most, most first, and ties in
// descending order of id, as Redis's ZREVRANGE orders them.
func (t *tallies) top(k tallyKey, n int) []TopEntry {
	t.mu.Lock()
	out := make([]TopEntry, 0, len(t.n[k]))
	for id, v := range t.n[k] {
		out = append(out, TopEntry{ID: id, N: v})
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b TopEntry) int { return cmp.Or(cmp.Compare(b.N, a.N), strings.Compare(b.ID, a.ID)) })
	return out[:min(n, len(out))]
}

// sweep drops the tallies whose period ended before now.
func (t *tallies) sweep(now int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.n {
		if k.span.End <= now {
			delete(t.n, k)
		}
	}
}

// take empties the tallies and returns what they held.
func (t *tallies) take() map[tallyKey]map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	held := t.n
	t.n = nil
	return held
}

// Tally adds n of measure m to each id of ids, in the current day and
// month of calendar c.
func (s *MemoryStore) Tally(c *Calendar, ids []TopID, m TopMeasure, n int64) {
	s.tallies.add(c, ids, m, n, s.clock())
}

// Top is the n ids of scope with the most of measure m in its period p
// holding now by calendar c, most first.
func (s *MemoryStore) Top(_ context.Context, c *Calendar, scope string, m TopMeasure, p BudgetPeriod, n int) (TopTally, error) {
	k := tallyKeys(c, scope, m, s.clock())[p]
	return TopTally{Start: k.span.Start, Top: s.tallies.top(k, n)}, nil
}

// Tally adds as the in-process store does, and sends what it summed
// within tallyLinger of its first addition.
func (s *RedisStore) Tally(c *Calendar, ids []TopID, m TopMeasure, n int64) {
	s.tallies.add(c, ids, m, n, s.gatewayMoment())
	s.tallySend.Do(func() { time.AfterFunc(tallyLinger, s.sendTallies) })
}

// sendTallies sends what the store summed, as one pipeline of ZINCRBY and
// the expiry of each set: two days past its period's end.
func (s *RedisStore) sendTallies() {
	s.tallySend.Reset()
	held := s.tallies.take()
	if len(held) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	start := time.Now()
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, ids := range held {
			key := k.redisKey()
			for id, n := range ids {
				p.ZIncrBy(ctx, key, float64(n), id)
			}
			p.ExpireAt(ctx, key, time.UnixMilli(k.span.End).Add(tallyAfterPeriod))
		}
		return nil
	})
	watch.RedisCall("tally", time.Since(start), err)
}

// tallyAfterPeriod is how long a tally lives past its period's end.
const tallyAfterPeriod = 48 * time.Hour

// Top sends what this store summed, then reads the n ids with the most.
func (s *RedisStore) Top(ctx context.Context, c *Calendar, scope string, m TopMeasure, p BudgetPeriod, n int) (TopTally, error) {
	s.sendTallies()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	start := time.Now()
	k := tallyKeys(c, scope, m, s.gatewayMoment())[p]
	z, err := s.client.ZRevRangeWithScores(ctx, k.redisKey(), 0, int64(n)-1).Result()
	watch.RedisCall("top", time.Since(start), err)
	if err != nil {
		return TopTally{}, err
	}
	t := TopTally{Start: k.span.Start, Top: make([]TopEntry, len(z))}
	for i, e := range z {
		id, _ := e.Member.(string)
		t.Top[i] = TopEntry{ID: id, N: int64(e.Score)}
	}
	return t, nil
}

// resettableOnce is a sync.Once that a sender resets once it has taken
// what it sends: the next addition schedules the next send.
type resettableOnce struct {
	mu   sync.Mutex
	done bool
}

func (o *resettableOnce) Do(f func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.done {
		o.done = true
		f()
	}
}

func (o *resettableOnce) Reset() {
	o.mu.Lock()
	o.done = false
	o.mu.Unlock()
}
