package limiter

import (
	"context"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// newLearningLimit is a limit that learns the provider's quota, with caps
// of its own.
func newLearningLimit(scope, id string, caps Caps) Limit {
	caps.Learn = true
	return NewLimit("", scope, id, caps)
}

// learnOrFail has s learn r for chain, and waits until it has.
func learnOrFail(t testing.TB, s Store, chain []Limit, r Report) {
	t.Helper()
	done := make(chan error, 1)
	s.Learn(chain, r, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// requestsReport reports a requests quota of limit with remaining left,
// full again in reset milliseconds.
func requestsReport(at, limit, remaining, reset int64) Report {
	r := Report{At: at}
	r.Quotas[0] = ReportedQuota{Limit: limit, Remaining: remaining, ResetMillis: reset}
	return r
}

// admitted is the admission of chain on s at the pinned time at,
// reserving reserve.
func admitted(t *testing.T, s Store, chain []Limit, at int64, reserve TokenCounts) Admission {
	t.Helper()
	a, err := pinned(s, at).Admit(context.Background(), chain, reserve)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func runLearnedConformance(t *testing.T, kit storeKit) {
	// A report is a bucket: it held what remained at the report, holds the
	// limit at the reset, and refills evenly between; once full again it
	// holds nothing back.
	t.Run("AReportedQuotaAdmitsWhatRemainsAndRefillsEvenlyUntilItsReset", func(t *testing.T) {
		stores := kit.replicas(t, 2)
		at := pinnedBase() + 1000
		chain := []Limit{newLearningLimit("provider", redistest.UniqueID(t), Caps{})}
		learnOrFail(t, stores[0], chain, requestsReport(at, 10, 2, 8000)) // 8 missing, one back each second
		for i, s := range stores {
			if a := admitted(t, s, chain, at+100, TokenCounts{}); !a.Admitted {
				t.Fatalf("replica %d: request %d of the 2 that remained refused", i, i+1)
			}
		}
		a := admitted(t, stores[1], chain, at+100, TokenCounts{})
		if a.Admitted || a.Refusal.Kind != Provider || a.Refusal.WaitMillis != 900 {
			t.Fatalf("a third request: admitted %v, kind %v, wait %d ms; want refused by the provider's quota for 900 ms", a.Admitted, a.Refusal.Kind, a.Refusal.WaitMillis)
		}
		if !admitted(t, stores[0], chain, at+1000, TokenCounts{}).Admitted {
			t.Fatal("a request refused a second after the report, when the quota had refilled one")
		}
		if admitted(t, stores[0], chain, at+1000, TokenCounts{}).Admitted {
			t.Fatal("two requests admitted where one had refilled")
		}
		for i := range 20 {
			if !admitted(t, stores[i%2], chain, at+8000, TokenCounts{}).Admitted {
				t.Fatalf("request %d refused at the reset, when the report holds nothing back any more", i)
			}
		}
	})
	t.Run("ConcurrentAdmissionsOnThreeReplicasTakeExactlyWhatTheReportLeft", func(t *testing.T) {
		stores := kit.replicas(t, 3)
		at := pinnedBase() + 1000
		chain := []Limit{newLearningLimit("provider", redistest.UniqueID(t), Caps{})}
		learnOrFail(t, stores[2], chain, requestsReport(at, 1000, 5, 60_000))
		if got := raceAdmissions(t, stores, chain, 48, at); got != 5 {
			t.Fatalf("admitted %d of 48 where the provider reported 5 remaining, want exactly 5", got)
		}
	})
	t.Run("AProviderRefusalPausesEveryReplicaUntilItsWait", func(t *testing.T) {
		stores := kit.replicas(t, 2)
		at := pinnedBase() + 1000
		chain := []Limit{newLearningLimit("provider", redistest.UniqueID(t), Caps{})}
		learnOrFail(t, stores[0], chain, Report{At: at, Refused: true, Wait: 1500})
		a := admitted(t, stores[1], chain, at+1499, TokenCounts{})
		if a.Admitted || a.Refusal.Kind != Provider || a.Refusal.WaitMillis != 1 {
			t.Fatalf("1 ms before the wait ends: admitted %v, kind %v, wait %d; want refused for 1 ms", a.Admitted, a.Refusal.Kind, a.Refusal.WaitMillis)
		}
		if !admitted(t, stores[1], chain, at+1500, TokenCounts{}).Admitted {
			t.Fatal("refused once the provider's wait ended")
		}
	})
	t.Run("AnOlderReportNeverOverwritesANewerOne", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []Limit{newLearningLimit("provider", redistest.UniqueID(t), Caps{})}
		learnOrFail(t, s, chain, requestsReport(at+100, 5, 0, 10_000))
		learnOrFail(t, s, chain, requestsReport(at+50, 5, 5, 10_000)) // answered earlier, learned later
		if a := admitted(t, s, chain, at+100, TokenCounts{}); a.Admitted {
			t.Fatal("an older report of a full quota overwrote the newer one of an empty quota")
		}
	})
	// The report of an answer cannot count the requests admitted after
	// its own, which may still be on their way to the provider: the quota
	// keeps what it holds taken when that is more than the report says.
	t.Run("AReportKeepsTheRequestsAdmittedAfterTheOneItAnswers", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []Limit{newLearningLimit("provider", redistest.UniqueID(t), Caps{})}
		learnOrFail(t, s, chain, requestsReport(at, 10, 5, 600_000)) // slow: one back a minute
		for range 3 {
			admitOrFail(t, s, chain, at)
		}
		learnOrFail(t, s, chain, requestsReport(at+10, 10, 4, 600_000)) // the provider saw one of the three
		admitted := 0
		for range 5 {
			if admitOrFail(t, s, chain, at+10).Admitted {
				admitted++
			}
		}
		if admitted != 2 {
			t.Fatalf("admitted %d after a report that saw one of three requests in flight, want the 2 that remain of 5", admitted)
		}
		learnOrFail(t, s, chain, requestsReport(at+20, 10, 0, 600_000)) // another client of the provider took more
		if admitOrFail(t, s, chain, at+20).Admitted {
			t.Fatal("admitted after a report of none remaining")
		}
	})
	t.Run("TokensAreTakenAsReservedAndReturnAsTheQuotaRefills", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []Limit{newLearningLimit("provider", redistest.UniqueID(t), Caps{})}
		r := Report{At: at}
		r.Quotas[1] = ReportedQuota{Limit: 1000, Remaining: 300, ResetMillis: 7000} // 0.1 token a millisecond
		learnOrFail(t, s, chain, r)
		if !admitted(t, s, chain, at, totalTokens(300)).Admitted {
			t.Fatal("a reservation of the 300 tokens that remained refused")
		}
		a := admitted(t, s, chain, at, totalTokens(100))
		if a.Admitted || a.Refusal.Kind != Provider || a.Refusal.WaitMillis != 1000 {
			t.Fatalf("100 tokens more: admitted %v, kind %v, wait %d; want refused until 100 tokens refill, 1000 ms", a.Admitted, a.Refusal.Kind, a.Refusal.WaitMillis)
		}
		if !admitted(t, s, chain, at+1000, totalTokens(100)).Admitted {
			t.Fatal("100 tokens refused once 100 had refilled")
		}
	})
	t.Run("ALearnedQuotaNeverRaisesAConfiguredCap", func(t *testing.T) {
		s := kit.replicas(t, 1)[0]
		at := pinnedBase() + 1000
		chain := []Limit{newLearningLimit("provider", redistest.UniqueID(t), CapsOfWindows(WindowCaps{RPM: 2}))}
		learnOrFail(t, s, chain, requestsReport(at, 1000, 999, 60_000))
		admitOrFail(t, s, chain, at)
		admitOrFail(t, s, chain, at)
		if a := admitted(t, s, chain, at, TokenCounts{}); a.Admitted || a.Refusal.Kind != Requests {
			t.Fatalf("a third request under rpm 2 with 997 left at the provider: admitted %v, kind %v", a.Admitted, a.Refusal.Kind)
		}
	})
}

// The reports that come while one is written on the same keys wait for
// it, merged: the newest's quotas and the longest pause, in one call. 200
// reports at once cost far fewer calls, and leave the state of the last.
func TestReportsThatComeWhileOneIsWrittenAreMergedIntoTheNext(t *testing.T) {
	srv := redistest.NewServer(t)
	s := newTestRedisStore(t, srv.URL())
	at := pinnedBase() + 1000
	chain := []Limit{newLearningLimit("provider", redistest.UniqueID(t), Caps{})}
	before := redistest.ScriptCalls(t, srv.URL())
	done := make(chan error, 200)
	for i := range int64(200) {
		r := requestsReport(at+i, 1000, 1000-i, 600_000) // each newer one with one less remaining
		if i == 50 {
			r.Refused, r.Wait = true, 5000 // the longest pause, in an older report
		}
		s.Learn(chain, r, func(err error) { done <- err })
	}
	for range 200 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	calls := redistest.ScriptCalls(t, srv.URL()) - before
	t.Logf("200 reports in %d calls", calls)
	if calls >= 100 {
		t.Errorf("200 reports at once took %d calls of learn.lua", calls)
	}
	a := admitted(t, s, chain, at+5000, TokenCounts{})
	if a.Admitted || a.Refusal.Kind != Provider || a.Counts[0].Extra().Learned.Quotas[0].Limit != 1000 {
		t.Fatalf("after the reports: admitted %v, kind %v, %+v; want the pause of the older report still on", a.Admitted, a.Refusal.Kind, a.Counts[0].Extra().Learned)
	}
	if d := a.Counts[0].Extra().Learned.Quotas[0].Deficit; d < 190*MicroTokens || d > 199*MicroTokens {
		t.Fatalf("the requests quota holds %d millionths taken, want the newest report's 199, refilled for about 5 s", d)
	}
}

// A learned key of another shape (written by hand, or by another version)
// holds nothing back and fails no admission, and the next report replaces
// it.
func TestALearnedKeyOfAnotherShapeHoldsNothingAndIsReplaced(t *testing.T) {
	url := redistest.EnvURL(t)
	s := newTestRedisStore(t, url)
	at := pinnedBase() + 1000
	chain := []Limit{newLearningLimit("provider", redistest.UniqueID(t), Caps{})}
	var key strings.Builder
	writeLearnedKey(&key, chain[0].Prefix)
	for _, junk := range []string{"junk", "1:2|x|y|z|w", "0:0|zz:1:2:3:4:5:6|0|0|0", ""} {
		if err := redistest.TestClient(t, url).Set(context.Background(), key.String(), junk, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if a := admitted(t, s, chain, at, TokenCounts{}); !a.Admitted {
			t.Fatalf("a learned key holding %q refused a request: %+v", junk, a.Refusal)
		}
		learnOrFail(t, s, chain, requestsReport(at, 10, 0, 60_000))
		if a := admitted(t, s, chain, at, TokenCounts{}); a.Admitted || a.Refusal.Kind != Provider {
			t.Fatalf("after a report of none remaining over a key that held %q: admitted %v, kind %v", junk, a.Admitted, a.Refusal.Kind)
		}
	}
}

// Copies of counts share their extra counts: adding an admission to a copy,
// as the headers of a request and the replay of a call's admissions do,
// leaves the counts the store read as they were.
func TestAddingAnAdmissionToACopyOfCountsLeavesTheCountsReadAlone(t *testing.T) {
	l := newLearningLimit("org", "o", Caps{})
	read := Counts{extra: &ExtraCounts{}}
	read.extra.Learned.Quotas[0] = LearnedCount{Limit: 100, Deficit: 5 * MicroTokens}
	d := Decision{Admitted: true, Now: MomentAt(pinnedBase()), Counts: []Counts{read}}
	want := *read.extra
	after := d.Counts[0]
	d.AddTo(l, &after)
	if got := after.Extra().Learned.Quotas[0].Deficit; got != 6*MicroTokens {
		t.Fatalf("the copy's requests quota holds %d after the admission, want %d", got, 6*MicroTokens)
	}
	if *d.Counts[0].Extra() != want {
		t.Fatalf("the counts read became %+v, want %+v", *d.Counts[0].Extra(), want)
	}
}
