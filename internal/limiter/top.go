package limiter

import (
	"cmp"
	"context"
	"maps"
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

// redisTallyKey is the sorted set that holds the tally of measure m of
// scope in period p, whose span is s.
func redisTallyKey(scope string, m TopMeasure, p BudgetPeriod, s periodSpan) string {
	return "rolter:top:" + scope + ":" + m.String() + ":" + p.String() + ":" + s.name
}

// spansAt are the day and the month of calendar c that hold now.
func spansAt(c *Calendar, now moment) (spans [NumBudgetPeriods]periodSpan) {
	for p := range NumBudgetPeriods {
		spans[p] = c.SpanAt(p, now)
	}
	return spans
}

// tallies are tallies as one process sums them: the in-process store's
// whole tallies, or what a Redis store has yet to send. Each measure of
// each scope of each calendar has a tally of its ids in a day and a
// month: an id's two counts in one entry, found once per addition.
type tallies struct {
	// carry: the in-process store's, whose tally keeps its month's counts
	// into the next day; a Redis store's additions of an ended period are
	// sent under that period's keys.
	carry bool
	// most is how many ids a tally keeps (0: mostTallied): ids a client
	// makes up (a new API key per request) must not grow it for a month.
	most    int
	mu      sync.Mutex
	scopes  map[tallyScope]*scopeTally
	retired []*scopeTally // a Redis store's, of periods that ended, not yet sent
}

type tallyScope struct {
	calendar *Calendar
	scope    string
	measure  TopMeasure
}

// scopeTally is a tally's counts per id in the day and month of spans.
type scopeTally struct {
	key   tallyScope
	spans [NumBudgetPeriods]periodSpan
	ids   map[string]*[NumBudgetPeriods]int64
}

// add adds n of measure m to each id of ids in the tallies of the periods
// holding now by calendar c.
func (t *tallies) add(c *Calendar, ids []TopID, m TopMeasure, n int64, now moment) {
	if n == 0 {
		return
	}
	spans := spansAt(c, now)
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		st := t.current(tallyScope{c, id.Scope, m}, spans)
		v := st.ids[id.ID]
		if v == nil {
			if t.carry && len(st.ids) >= t.keeps() {
				st.prune(t.keeps() / 2)
			}
			v = new([NumBudgetPeriods]int64)
			st.ids[id.ID] = v
		}
		for p := range v {
			v[p] += n
		}
	}
}

// mostTallied is how many ids a tally keeps by default: those with the
// most in its month (on Redis, in each of its sets), so that made-up ids
// cannot grow it without bound. An id dropped restarts from zero if it
// comes back.
const mostTallied = 100_000

// keeps is how many ids a tally keeps.
func (t *tallies) keeps() int { return cmp.Or(t.most, mostTallied) }

// prune keeps the n ids of st with the most in its month: dropping half at
// once, a tally full of made-up ids sorts itself once per n of them.
func (st *scopeTally) prune(n int) {
	ids := slices.Collect(maps.Keys(st.ids))
	slices.SortFunc(ids, func(a, b string) int {
		return cmp.Or(cmp.Compare(st.ids[b][BudgetMonth], st.ids[a][BudgetMonth]), strings.Compare(b, a))
	})
	for _, id := range ids[min(n, len(ids)):] {
		delete(st.ids, id)
	}
}

// current is the tally of k in the periods spans, under t.mu: the one
// kept, moved into them if they are later (a day that ended drops its
// day's counts, or is set aside to be sent), or a new one. An addition
// whose periods are earlier than the tally's (its clock read before a
// concurrent one that moved the tally on) counts in the tally's.
func (t *tallies) current(k tallyScope, spans [NumBudgetPeriods]periodSpan) *scopeTally {
	st := t.scopes[k]
	switch {
	case st == nil:
	case st.spans == spans || spans[BudgetDay].Start < st.spans[BudgetDay].Start:
		return st
	case t.carry:
		for id, v := range st.ids {
			for p := range v {
				if st.spans[p] != spans[p] {
					v[p] = 0
				}
			}
			if *v == [NumBudgetPeriods]int64{} {
				delete(st.ids, id)
			}
		}
		st.spans = spans
		return st
	default:
		t.retired = append(t.retired, st)
	}
	if t.scopes == nil {
		t.scopes = make(map[tallyScope]*scopeTally)
	}
	st = &scopeTally{key: k, spans: spans, ids: make(map[string]*[NumBudgetPeriods]int64)}
	t.scopes[k] = st
	return st
}

// top is the n ids of the tally k with the most in its period p, whose
// span is s, most first, and ties in descending order of id, as Redis's
// ZREVRANGE orders them.
func (t *tallies) top(k tallyScope, p BudgetPeriod, s periodSpan, n int) []TopEntry {
	t.mu.Lock()
	var out []TopEntry
	if st := t.scopes[k]; st != nil && st.spans[p] == s {
		out = make([]TopEntry, 0, len(st.ids))
		for id, v := range st.ids {
			if v[p] != 0 {
				out = append(out, TopEntry{ID: id, N: v[p]})
			}
		}
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b TopEntry) int { return cmp.Or(cmp.Compare(b.N, a.N), strings.Compare(b.ID, a.ID)) })
	return out[:min(n, len(out))]
}

// sweep drops the tallies whose month ended before now.
func (t *tallies) sweep(now int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, st := range t.scopes {
		if st.spans[BudgetMonth].End <= now {
			delete(t.scopes, k)
		}
	}
}

// take empties the tallies and returns what they held.
func (t *tallies) take() []*scopeTally {
	t.mu.Lock()
	defer t.mu.Unlock()
	held := t.retired
	for _, st := range t.scopes {
		held = append(held, st)
	}
	t.scopes, t.retired = nil, nil
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
	span := c.SpanAt(p, s.clock())
	return TopTally{Start: span.Start, Top: s.tallies.top(tallyScope{c, scope, m}, p, span, n)}, nil
}

// Tally adds as the in-process store does, and sends what it summed
// within tallyLinger of its first addition.
func (s *RedisStore) Tally(c *Calendar, ids []TopID, m TopMeasure, n int64) {
	s.tallies.add(c, ids, m, n, s.gatewayMoment())
	if s.tallySent.CompareAndSwap(false, true) {
		time.AfterFunc(tallyLinger, s.sendTallies)
	}
}

// sendTallies sends what the store summed, as one pipeline of ZINCRBY and
// the expiry of each set: two days past its period's end.
func (s *RedisStore) sendTallies() {
	s.tallySent.Store(false) // an addition from now on sends again
	held := s.tallies.take()
	if len(held) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	start := time.Now()
	_, err := s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, st := range held {
			for p, span := range st.spans {
				key := redisTallyKey(st.key.scope, st.key.measure, BudgetPeriod(p), span)
				for id, v := range st.ids {
					pipe.ZIncrBy(ctx, key, float64(v[p]), id)
				}
				pipe.ZRemRangeByRank(ctx, key, 0, -int64(s.tallies.keeps())-1)
				pipe.ExpireAt(ctx, key, time.UnixMilli(span.End).Add(tallyAfterPeriod))
			}
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
	span := c.SpanAt(p, s.gatewayMoment())
	z, err := s.client.ZRevRangeWithScores(ctx, redisTallyKey(scope, m, p, span), 0, int64(n)-1).Result()
	watch.RedisCall("top", time.Since(start), err)
	if err != nil {
		return TopTally{}, err
	}
	t := TopTally{Start: span.Start, Top: make([]TopEntry, len(z))}
	for i, e := range z {
		id, _ := e.Member.(string)
		t.Top[i] = TopEntry{ID: id, N: int64(e.Score)}
	}
	return t, nil
}
