package ratelimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// A chain with an enforced rpm 10 on its key and a shadow rpm 3 on its org
// admits 10 of 12, of which the 4th to the 10th are marked as the shadow
// limit's refusals: in the outcome, the metric and the header. The same
// limit enforced refuses from the 4th.
func TestAShadowLimitCountsAndMarksWhatItWouldRefuseAndRefusesNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		site := func(shadow string) string {
			return limited(store, `
				scope key {http.request.header.X-Api-Key}
				scope org {http.request.header.X-Org} readable
				limit key * rpm 10
				limit org * rpm 3 `+shadow+`
				shadow_header on`)
		}
		gw := startGateway(t, up.URL, site("shadow"))
		key, org := redistest.UniqueID(t), redistest.UniqueID(t)
		refusals := `caddy_rolter_ratelimit_refusals_total{kind="requests",scope="org",shadow="true",window="minute"}`
		outcomes := `caddy_rolter_ratelimit_admissions_total{outcome="shadow_refused"}`
		before := scrape(t)
		statuses, marked := map[int]int{}, 0
		for i := range 12 {
			res, body := gw.do(t, "X-Api-Key: "+key, "X-Org: "+org)
			statuses[res.StatusCode]++
			h := res.Header.Get(shadowHeader)
			switch {
			case res.StatusCode != http.StatusOK:
				if !strings.Contains(body, "Rate limit reached for key") || h != "" {
					t.Errorf("request %d: %d %s %q, want the key's refusal and no shadow header", i+1, res.StatusCode, body, h)
				}
			case i < 3 && h != "":
				t.Errorf("request %d: %s %q within the shadow limit", i+1, shadowHeader, h)
			case i >= 3 && !strings.HasPrefix(h, "requests; scope=org; window=minute; retry-after="):
				t.Errorf("request %d: %s %q, want the shadow limit's refusal", i+1, shadowHeader, h)
			case i >= 3:
				marked++
			}
		}
		if statuses[http.StatusOK] != 10 || statuses[http.StatusTooManyRequests] != 2 || marked != 7 {
			t.Fatalf("statuses %v, %d marked; want 10 admitted, 7 of them marked, and 2 refused by the key's rpm 10", statuses, marked)
		}
		after := scrape(t)
		if got := after[refusals] - before[refusals]; got != 7 {
			t.Errorf("%s rose by %v, want 7", refusals, got)
		}
		if got := after[outcomes] - before[outcomes]; got != 7 {
			t.Errorf("%s rose by %v, want 7", outcomes, got)
		}
		enforced := startGateway(t, up.URL, site(""))
		key, org = redistest.UniqueID(t), redistest.UniqueID(t)
		for i := range 5 {
			res, _ := enforced.do(t, "X-Api-Key: "+key, "X-Org: "+org)
			if want := map[bool]int{true: 200, false: 429}[i < 3]; res.StatusCode != want {
				t.Fatalf("the same limit enforced, request %d: %d, want %d", i+1, res.StatusCode, want)
			}
		}
	})
}

// shadow on makes every limit of the handler a shadow limit: nothing is
// refused, and what would have been is marked.
func TestShadowOnTriesEveryLimitOfTheHandler(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw := startGateway(t, newUpstream(t).URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rpm 2
			shadow on
			shadow_header on`))
		key := redistest.UniqueID(t)
		for i := range 4 {
			res, body := gw.do(t, "X-Api-Key: "+key)
			if marked := res.Header.Get(shadowHeader) != ""; res.StatusCode != http.StatusOK || marked != (i >= 2) {
				t.Fatalf("request %d: %d %s, shadow header %q", i+1, res.StatusCode, body, res.Header.Get(shadowHeader))
			}
		}
	})
}

// A shadow refusal is logged at info, at most once per interval, with the
// scope's name and the id as stored, never as the request gave it.
func TestAShadowRefusalIsLoggedAtInfoWithTheStoredID(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	h := &Handler{logger: zap.New(core), shadowLog: new(warnLimiter)}
	caps := limiter.CapsOfWindows(limiter.WindowCaps{limiter.RPM: 1})
	caps.Shadow = true
	chain := []limiter.Limit{limiter.NewLimit("", "key", limiter.KeyID(false, "sk-secret"), caps)}
	d := limiter.Decision{Now: limiter.MomentAt(time.Now().UnixMilli()), Counts: []limiter.Counts{{Window: [limiter.NumWindows]limiter.Window{limiter.RPM: {Cur: 1}}}}}
	for range 2 {
		r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		req := &request{Request: r, repl: caddy.NewReplacer()}
		if !h.shadowRefused(httptest.NewRecorder(), req, chain, d) {
			t.Fatal("a shadow rpm 1 with 1 request counted did not mark the next")
		}
		if out, _ := req.repl.GetString(placeholderOutcome); out != outcomeShadowRefused {
			t.Fatalf("outcome %q", out)
		}
	}
	entries := logs.All()
	if len(entries) != 1 || entries[0].Level != zap.InfoLevel {
		t.Fatalf("%d entries (%v), want 1 at info", len(entries), entries)
	}
	fields := entries[0].ContextMap()
	if fields["scope"] != "key" || fields["id"] != limiter.KeyID(false, "sk-secret") || strings.Contains(fmt.Sprint(fields), "sk-secret") {
		t.Fatalf("fields %v: want the scope and the stored id only", fields)
	}
}

// A shadow limit never refuses, whatever its caps are made of: caps that
// come with the request (given, at their fallback, or not given validly
// and without one), and budgets, which an enforced limit would refuse an
// unpriced model and a request too large for with. Every request passes,
// marked as the limit would refuse it; the same lines enforced refuse.
func TestAShadowLimitNeverRefusesWhateverItsCapsAreMadeOf(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		// send sends n requests, each of which must pass, and returns
		// their shadow headers.
		send := func(gw *gateway, n int, body string, headers ...string) []string {
			t.Helper()
			marks := make([]string, n)
			for i := range n {
				res, got := gw.send(t, "POST", "/v1/chat/completions", body, headers...)
				if res.StatusCode != http.StatusOK {
					t.Fatalf("request %d (%s): %d %s, want 200: a shadow limit refused it", i+1, body, res.StatusCode, got)
				}
				marks[i] = res.Header.Get(shadowHeader)
			}
			return marks
		}
		requests := "requests; scope=key; window=minute; retry-after="
		for _, shadow := range []string{"shadow_header on\nlimit key * rpm {http.request.header.X-Plan-Rpm} else 2 shadow", "shadow_header on\nshadow on\nlimit key * rpm {http.request.header.X-Plan-Rpm} else 2"} {
			gw := startGateway(t, up.URL, limited(store, "scope key {http.request.header.X-Api-Key}\n"+shadow))
			marks := send(gw, 4, `{"model":"m"}`, "X-Api-Key: "+redistest.UniqueID(t))
			if marks[1] != "" || !strings.HasPrefix(marks[2], requests) || !strings.HasPrefix(marks[3], requests) {
				t.Errorf("%q at its fallback of 2: marks %q, want the 3rd and 4th marked", shadow, marks)
			}
			marks = send(gw, 2, `{"model":"m"}`, "X-Api-Key: "+redistest.UniqueID(t), "X-Plan-Rpm: 1")
			if marks[0] != "" || !strings.HasPrefix(marks[1], requests) {
				t.Errorf("%q with a plan of 1: marks %q, want the 2nd marked", shadow, marks)
			}
		}

		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rpm {http.request.header.X-Plan-Rpm} shadow
			shadow_header on`))
		const unreadable = `caddy_rolter_ratelimit_refusals_total{kind="unreadable",scope="key",shadow="true",window=""}`
		before := scrape(t)[unreadable]
		if marks := send(gw, 2, `{"model":"m"}`, "X-Api-Key: "+redistest.UniqueID(t), "X-Plan-Rpm: none"); marks[0] != "unreadable; scope=key" || marks[1] != marks[0] {
			t.Errorf("a plan not valid, and no fallback: marks %q, want each marked unreadable", marks)
		}
		if got := scrape(t)[unreadable] - before; got != 2 {
			t.Errorf("%s rose by %v, want 2", unreadable, got)
		}

		budget := func(shadow string) *gateway {
			return startGateway(t, up.URL, limited(store, `
				scope key {http.request.header.X-Api-Key}
				limit key * budget_day {http.request.header.X-Budget} else 0.000001 `+shadow+`
				price priced input 1 output 2
				shadow_header on`))
		}
		gw = budget("shadow")
		if marks := send(gw, 1, `{"model":"unpriced"}`, "X-Api-Key: "+redistest.UniqueID(t)); marks[0] != "" {
			t.Errorf("an unpriced model under a shadow budget: marked %q, want passed unmarked (it cannot be counted)", marks)
		}
		if marks := send(gw, 1, `{"model":"priced"}`, "X-Api-Key: "+redistest.UniqueID(t)); !strings.HasPrefix(marks[0], "budget; scope=key; window=day") {
			t.Errorf("a request too large for a shadow budget of $0.000001: marked %q, want the budget's refusal", marks)
		}
		gw = budget("")
		for body, want := range map[string]int{`{"model":"unpriced"}`: http.StatusBadRequest, `{"model":"priced"}`: http.StatusTooManyRequests} {
			if res, got := gw.send(t, "POST", "/v1/chat/completions", body, "X-Api-Key: "+redistest.UniqueID(t)); res.StatusCode != want {
				t.Errorf("the budget enforced, %s: %d %s, want %d", body, res.StatusCode, got, want)
			}
		}
	})
}
