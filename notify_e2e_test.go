package ratelimit

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// thresholdSite is a gateway's routes whose teams have $1 a month, notified
// at 80%, 95% and 100%; a thresholdRequest reserves and costs exactly
// $0.05 (50000 output tokens at $1 per million, its input free), so that
// twenty fill a team's month exactly.
func thresholdSite(store string) string {
	return limited(flightStore(store), `
		scope team {http.request.header.X-Team} readable
		on_redis_error deny
		price m input 0 output 1
		limit team * budget_month 1 notify 80% 95% 100%
		`)
}

const (
	thresholdRequest = `{"model":"m","max_tokens":50000,"messages":[{"role":"user","content":"hi"}]}`
	thresholdAnswer  = `{"object":"chat.completion","usage":{"prompt_tokens":3,"completion_tokens":50000,"total_tokens":50003}}`
)

// pushTeam sends n thresholdRequests of team at once, spread over the
// gateways, and returns how many were admitted.
func pushTeam(t *testing.T, gateways []string, up *fakeUpstream, team string, n int) int {
	t.Helper()
	answer := up.json(thresholdAnswer)
	c := flightClient(t)
	var wg sync.WaitGroup
	answers := make([]flightAnswer, n)
	for i := range n {
		wg.Go(func() {
			answers[i] = postTo(c, gateways[i%len(gateways)], "/v1/chat/completions", thresholdRequest, "X-Team: "+team, answer)
		})
	}
	wg.Wait()
	admitted := 0
	for _, a := range answers {
		switch {
		case a.err != nil:
			t.Fatalf("a request got no answer: %v", a.err)
		case a.status == http.StatusOK:
			admitted++
		case a.status != http.StatusTooManyRequests:
			t.Fatalf("a request was answered %d %s", a.status, a.body)
		}
	}
	return admitted
}

// crossingLine is a "threshold crossed" line of a gateway's JSON log.
type crossingLine struct {
	Msg     string `json:"msg"`
	Scope   string `json:"scope"`
	ID      string `json:"id"`
	Cap     string `json:"cap"`
	Percent int    `json:"percent"`
	Value   string `json:"value"`
	Limit   string `json:"limit"`
	Period  string `json:"period"`
}

// crossingsLogged are the threshold crossed lines of the logs, of id.
func crossingsLogged(t *testing.T, id string, logs ...string) []crossingLine {
	t.Helper()
	var out []crossingLine
	for _, path := range logs {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		s := bufio.NewScanner(f)
		s.Buffer(nil, 1<<20)
		for s.Scan() {
			var l crossingLine
			if json.Unmarshal(s.Bytes(), &l) == nil && l.Msg == "threshold crossed" && l.ID == id {
				out = append(out, l)
			}
		}
		f.Close()
	}
	return out
}

// percentsOf are the percents of lines, sorted.
func percentsOf(lines []crossingLine) []int {
	out := make([]int, len(lines))
	for i, l := range lines {
		out[i] = l.Percent
	}
	slices.Sort(out)
	return out
}

// Three gateway processes on one Redis, or on a Redis Cluster, and one in
// process, push a team's month budget through 80%, 95% and 100% at once:
// each crossing is reported exactly once in all their logs together, with
// the level that reached it, and a second team's crossings are its own.
func TestThreeGatewaysPushingABudgetThroughItsFractionsLogEachCrossingOnce(t *testing.T) {
	check := func(t *testing.T, gateways []string, up *fakeUpstream, logs []string) {
		for _, team := range []string{"t-" + redistest.UniqueID(t), "u-" + redistest.UniqueID(t)} {
			if admitted := pushTeam(t, gateways, up, team, 30); admitted != 20 {
				t.Fatalf("team %s: %d of 30 requests of $0.05 admitted under $1, want 20", team, admitted)
			}
			lines := crossingsLogged(t, team, logs...)
			if got := percentsOf(lines); !slices.Equal(got, []int{80, 95, 100}) {
				t.Fatalf("team %s: crossings logged %v, want 80, 95 and 100 once each: %+v", team, got, lines)
			}
			month := time.Now().UTC()
			period := time.Date(month.Year(), month.Month(), 1, 0, 0, 0, 0, time.UTC).Format(time.RFC3339)
			for _, l := range lines {
				// Each admission adds $0.05: the one that reaches a
				// fraction of $1 reaches it exactly.
				if value := fmt.Sprintf("%d.%02d", l.Percent/100, l.Percent%100); l.Scope != "team" || l.Cap != "budget_month" || l.Limit != "1.00" || l.Period != period || l.Value != value {
					t.Errorf("crossing logged %+v: want team's budget_month of 1.00 in the period from %s, at %s", l, period, value)
				}
			}
		}
	}
	t.Run("memory", func(t *testing.T) {
		up := newUpstream(t)
		log := t.TempDir() + "/caddy.log"
		gw := startGatewayWith(t, up.URL, fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t\tlevel INFO\n\t}", log), thresholdSite(""), 0)
		check(t, []string{gw.url}, up, []string{log})
	})
	t.Run("redis", func(t *testing.T) {
		up := newUpstream(t)
		gws := startCaddyProcesses(t, 3, up, thresholdSite(redisLine(t)))
		check(t, urlsOf(gws), up, logsOf(gws))
	})
	t.Run("cluster", func(t *testing.T) {
		c := sharedCluster(t)
		up := newUpstream(t)
		gws := startCaddyProcesses(t, 3, up, thresholdSite("redis cluster "+strings.Join(c.URLs(), " ")))
		check(t, urlsOf(gws), up, logsOf(gws))
	})
}

// thresholdEvents are the rolter_ratelimit.threshold events the test
// subscriber (eventRecorder) got.
var thresholdEvents = make(chan caddy.Event, 64)

// eventRecorder is an event handler module, as any subscriber of Caddy's
// events app is: it records each event it gets.
type eventRecorder struct{}

func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "events.handlers.rolter_test_record", New: func() caddy.Module { return new(eventRecorder) }}
}

func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	thresholdEvents <- e
	return nil
}

func init() { caddy.RegisterModule(eventRecorder{}) }

// A crossing is a Caddy event that any event handler subscribed to
// rolter_ratelimit.threshold gets, with the scope, the id as stored, the
// cap, the fraction, the period and the value; and a count by scope, cap
// and percent.
func TestACrossingIsACaddyEventThatASubscriberGetsAndACount(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, thresholdSite(store))
		subscribe := `{"subscriptions":[{"events":["` + ThresholdEvent + `"],"handlers":[{"handler":"rolter_test_record"}]}]}`
		req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://localhost:%d/config/apps/events", caddyAdmin()), strings.NewReader(subscribe))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if res, body := mustDo(t, http.DefaultClient, req); res.StatusCode != http.StatusOK {
			t.Fatalf("subscribing: %d %s", res.StatusCode, body)
		}
		metric := func(percent string) string {
			return `caddy_rolter_ratelimit_thresholds_crossed_total{cap="budget_month",percent="` + percent + `",scope="team"}`
		}
		before := scrape(t)
		team := "t-" + redistest.UniqueID(t)
		if admitted := pushTeam(t, []string{gw.url}, up, team, 16); admitted != 16 {
			t.Fatalf("%d of 16 admitted, want all", admitted)
		}
		var e caddy.Event
		select {
		case e = <-thresholdEvents:
		case <-time.After(waitBound):
			t.Fatal("the subscriber got no event")
		}
		month := time.Now().UTC()
		want := map[string]any{"scope": "team", "id": team, "cap": "budget_month", "percent": 80, "fraction": 0.8,
			"value": "0.80", "limit": "1.00", "unit": "usd", "period": time.Date(month.Year(), month.Month(), 1, 0, 0, 0, 0, time.UTC).Format(time.RFC3339)}
		if e.Name() != ThresholdEvent || fmt.Sprint(e.Data) != fmt.Sprint(want) {
			t.Fatalf("event %s %v, want %s %v", e.Name(), e.Data, ThresholdEvent, want)
		}
		select {
		case e := <-thresholdEvents:
			t.Fatalf("a second event %v before the next fraction", e.Data)
		default:
		}
		after := scrape(t)
		if got := after[metric("80")] - before[metric("80")]; got != 1 {
			t.Errorf("%s counted %v, want 1", metric("80"), got)
		}
		if got := after[metric("95")] - before[metric("95")]; got != 0 {
			t.Errorf("%s counted %v before 95%%, want 0", metric("95"), got)
		}
	})
}

// A budget's crossings are reported again in its next period: the stores'
// clocks are moved to the last seconds of a month, a team pushed through
// its fractions, then moved into the next month, on the in-process store,
// on Redis and on a Redis Cluster.
func TestABudgetsCrossingsAreReportedAgainInItsNextPeriod(t *testing.T) {
	var offset atomic.Int64 // milliseconds added to this machine's clock
	moved := func() time.Time { return time.Now().Add(time.Duration(offset.Load()) * time.Millisecond) }
	moveClocks(t, func() int64 { return moved().UnixMilli() },
		limiter.RedisClock{Gateway: moved, Script: func(at time.Time) string { return limiter.HexArg(at.UnixMilli()) }})
	moveTo := func(at time.Time) { offset.Store(time.Until(at).Milliseconds()) }
	stores := map[string]string{"memory": ""}
	if redistest.Enabled() {
		stores["redis"] = redisLine(t)
		stores["cluster"] = "redis cluster " + strings.Join(sharedCluster(t).URLs(), " ")
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			up := newUpstream(t)
			log := t.TempDir() + "/caddy.log"
			gw := startGatewayWith(t, up.URL, fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t\tlevel INFO\n\t}", log), thresholdSite(store), 0)
			team := "t-" + redistest.UniqueID(t)
			for _, month := range []time.Time{time.Date(2027, time.January, 31, 23, 59, 55, 0, time.UTC), time.Date(2027, time.February, 1, 0, 0, 1, 0, time.UTC)} {
				moveTo(month)
				before := len(crossingsLogged(t, team, log))
				if admitted := pushTeam(t, []string{gw.url}, up, team, 24); admitted != 20 {
					t.Fatalf("%s: %d of 24 admitted, want 20", month.Format(time.DateTime), admitted)
				}
				lines := crossingsLogged(t, team, log)[before:]
				period := time.Date(month.Year(), month.Month(), 1, 0, 0, 0, 0, time.UTC).Format(time.RFC3339)
				if got := percentsOf(lines); !slices.Equal(got, []int{80, 95, 100}) || lines[0].Period != period {
					t.Fatalf("%s: crossings logged %+v, want 80, 95 and 100 once each, in the period from %s", month.Format(time.DateTime), lines, period)
				}
			}
		})
	}
}

// A crossing's event waits in a bounded queue for the goroutine that emits
// it: when the queue is full (a slow subscriber, or made-up ids crossing
// fractions by the thousand) the event is dropped with a warning, and its
// log line still says it.
func TestACrossingsEventBeyondTheQueueIsDroppedWithAWarningAndStillLogged(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	h := &Handler{logger: zap.New(core), eventsWarn: new(warnLimiter), crossingEvents: make(chan map[string]any, 1)}
	c, err := limiter.CalendarOf("UTC")
	if err != nil {
		t.Fatal(err)
	}
	caps := limiter.Caps{Budgets: limiter.BudgetCaps{Max: [limiter.NumBudgetPeriods]int64{limiter.BudgetDay: 100}, Calendar: c}, Notify: [limiter.MaxNotify]uint8{50, 100}}
	chain := []limiter.Limit{limiter.NewLimit("", "team", "t", caps)}
	spent := limiter.Counts{Spent: [limiter.NumBudgetPeriods]int64{limiter.BudgetDay: 100}}
	h.reportCrossings(chain, limiter.Admission{Decision: limiter.Decision{Now: limiter.MomentAt(time.Now().UnixMilli()), Counts: []limiter.Counts{spent}}})
	if queued := len(h.crossingEvents); queued != 1 {
		t.Fatalf("%d events queued, want the one the queue holds", queued)
	}
	crossed, warned := 0, 0
	for _, e := range logs.All() {
		switch {
		case e.Message == "threshold crossed":
			crossed++
		case e.Level == zap.WarnLevel && strings.Contains(e.Message, "threshold events are dropped"):
			warned++
		}
	}
	if crossed != 2 || warned != 1 {
		t.Fatalf("%d crossings logged and %d warnings, want both crossings (50%% and 100%%) and one warning", crossed, warned)
	}
}
