package limiter

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

func runTopConformance(t *testing.T, kit storeKit) {
	t.Run("ReplicasAddingAtOnceTallyExactTotalsAndAnswerTheTopInOrder", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		c, err := CalendarOf("Europe/Paris")
		if err != nil {
			t.Fatal(err)
		}
		scope := "team" + redistest.UniqueID(t)
		// Ties come in descending order of id, as Redis's ZREVRANGE has them.
		want := []TopEntry{{"c", 300 * 7}, {"b", 200 * 7}, {"d", 100 * 7}, {"a", 100 * 7}}
		var wg sync.WaitGroup
		for i, e := range want {
			for j := range e.N / 7 {
				s := stores[(i+int(j))%len(stores)]
				wg.Go(func() {
					s.Tally(c, []TopID{{scope, e.ID}, {"other" + scope, e.ID}}, TopTokens, 7)
					s.Tally(c, []TopID{{scope, e.ID}}, TopRequests, 1)
				})
			}
		}
		wg.Wait()
		// A replica asked sends what it summed first: once each was asked,
		// the tallies hold every replica's.
		for _, s := range stores {
			if _, err := s.Top(context.Background(), c, scope, TopTokens, BudgetDay, 1); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []BudgetPeriod{BudgetDay, BudgetMonth} {
			got, err := stores[0].Top(context.Background(), c, scope, TopTokens, p, 10)
			if err != nil {
				t.Fatal(err)
			}
			if got.Start != c.SpanAt(p, MomentAt(time.Now().UnixMilli())).Start || !slices.Equal(got.Top, want) {
				t.Fatalf("%s tokens top %v, want %v", p, got, want)
			}
			got, err = stores[1].Top(context.Background(), c, scope, TopRequests, p, 2)
			if err != nil {
				t.Fatal(err)
			}
			if want := []TopEntry{{"c", 300}, {"b", 200}}; !slices.Equal(got.Top, want) { // and no more than asked
				t.Fatalf("%s requests top 2 %v, want %v", p, got, want)
			}
		}
		got, err := stores[2].Top(context.Background(), c, scope, TopSpend, BudgetMonth, 10)
		if err != nil || len(got.Top) != 0 {
			t.Fatalf("spend top %v %v, want none", got, err)
		}
	})

	t.Run("ATallyKeepsItsIDsWithTheMostAndNoMoreThanItsBound", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		switch s := s.(type) {
		case *MemoryStore:
			s.tallies.most = 4
		case *RedisStore:
			s.tallies.most = 4
		}
		c, err := CalendarOf("UTC")
		if err != nil {
			t.Fatal(err)
		}
		scope := "team" + redistest.UniqueID(t)
		// Six ids, each with more than the one before, as made-up keys
		// come one after another.
		for i, id := range []string{"a", "b", "c", "d", "e", "f"} {
			s.Tally(c, []TopID{{scope, id}}, TopRequests, int64(i+1))
		}
		for _, p := range []BudgetPeriod{BudgetDay, BudgetMonth} {
			got, err := s.Top(context.Background(), c, scope, TopRequests, p, 10)
			if err != nil {
				t.Fatal(err)
			}
			if want := []TopEntry{{"f", 6}, {"e", 5}, {"d", 4}, {"c", 3}}; !slices.Equal(got.Top, want) {
				t.Errorf("the %s's top of a tally keeping 4: %v, want %v", p, got.Top, want)
			}
		}
	})

	t.Run("ADaysTallyStartsAfreshWhileItsMonthKeepsCounting", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		c, err := CalendarOf("UTC")
		if err != nil {
			t.Fatal(err)
		}
		scope := "team" + redistest.UniqueID(t)
		month := time.Now().UTC()
		at := time.Date(month.Year(), month.Month()+1, 1, 1, 0, 0, 0, time.UTC).UnixMilli() // its first two days
		for day, ids := range [][]string{{"a", "a", "b"}, {"b"}} {
			now := at + int64(day)*dayMinutes*MinuteMillis
			for _, id := range ids {
				pinned(s, now).Tally(c, []TopID{{scope, id}}, TopRequests, 1)
			}
		}
		now := at + dayMinutes*MinuteMillis
		for p, want := range map[BudgetPeriod][]TopEntry{BudgetDay: {{"b", 1}}, BudgetMonth: {{"b", 2}, {"a", 2}}} {
			got, err := pinned(s, now).Top(context.Background(), c, scope, TopRequests, p, 10)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Top, want) || got.Start != c.SpanAt(p, MomentAt(now)).Start {
				t.Errorf("the %s's top the next day: %+v, want %v", p, got, want)
			}
		}
	})
}

// A tally in Redis lives until two days past the end of its period.
func TestATallyExpiresTwoDaysAfterItsPeriodEnds(t *testing.T) {
	url := redistest.EnvURL(t)
	s := newTestRedisStore(t, url)
	c, err := CalendarOf("UTC")
	if err != nil {
		t.Fatal(err)
	}
	scope := "team" + redistest.UniqueID(t)
	s.Tally(c, []TopID{{scope, "a"}}, TopSpend, 5)
	if _, err := s.Top(context.Background(), c, scope, TopSpend, BudgetMonth, 1); err != nil {
		t.Fatal(err)
	}
	for p, span := range spansAt(c, s.gatewayMoment()) {
		at, err := redistest.TestClient(t, url).ExpireTime(context.Background(), redisTallyKey(scope, TopSpend, BudgetPeriod(p), span)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if want := time.UnixMilli(span.End).Add(48 * time.Hour); at != time.Duration(want.Unix())*time.Second {
			t.Errorf("the %s tally expires at %v, want %v", BudgetPeriod(p), time.Unix(int64(at/time.Second), 0).UTC(), want.UTC())
		}
	}
}
