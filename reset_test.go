package ratelimit

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// Tests of the reset (reset.go): end to end on the admin endpoint of the
// in-process Caddy that the gateways of module_test.go run in, on both
// stores and on Redis Cluster; and of each store's reset and the refusal
// cache's forgetting.

// resetAt sends a reset to the admin endpoint on port admin, with query in
// the URL and form (url-encoded, "" for none) as the body, and reads the
// whole answer.
func resetAt(t *testing.T, admin int, method, query, form string) (*http.Response, []byte) {
	t.Helper()
	return adminAt(t, admin, method, ResetPath, query, form)
}

// postReset resets on this process's admin endpoint and fails unless the
// answer is 200 with JSON.
func postReset(t *testing.T, query, form string) (ResetAnswer, []byte) {
	t.Helper()
	res, body := resetAt(t, caddyAdmin(), http.MethodPost, query, form)
	return adminAnswer[ResetAnswer](t, "POST "+ResetPath+"?"+query, res, body), body
}

// clearedOf is what the answer's limits cleared and kept, one
// "<store> cleared [..] kept [..]" per limit.
func clearedOf(a ResetAnswer) string {
	var out []string
	for _, l := range a.Limits {
		out = append(out, fmt.Sprintf("%s cleared %v kept %v", l.Store, l.Cleared, l.Kept))
	}
	return strings.Join(out, "; ")
}

// statusesOf sends n chat completions with the header lines to gw and
// lists their statuses.
func statusesOf(t *testing.T, gw *gateway, n int, headers ...string) []int {
	t.Helper()
	var got []int
	for range n {
		res, _ := gw.do(t, headers...)
		got = append(got, res.StatusCode)
	}
	return got
}

func TestResetAdmitsAgainAKeyRefusedByItsRPMOrByItsTokenBucket(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			scope user {http.request.header.X-User} readable
			limit key * rpm 2
			limit user * rate 0.001 burst 2`))
		apiKey := "sk-" + redistest.UniqueID(t) + "-SECRET"
		user := redistest.UniqueID(t)
		clearOfMinuteEnd(t, 5*time.Second)

		// By the rpm: the third and fourth are refused (on Redis, the fourth by
		// the refusal cache, which the reset must make forget).
		cachedBefore := scrape(t)["caddy_rolter_ratelimit_refusals_cached_total"]
		if got := statusesOf(t, gw, 4, "X-Api-Key: "+apiKey); !slices.Equal(got, []int{200, 200, 429, 429}) {
			t.Fatalf("before the reset: %v, want 2 admitted of rpm 2, then refused", got)
		}
		if cached := scrape(t)["caddy_rolter_ratelimit_refusals_cached_total"] - cachedBefore; store != "" && cached < 1 {
			t.Fatalf("the refusal cache answered %v refusals, want the fourth: the test would not show that the reset makes it forget", cached)
		}
		a, _ := postReset(t, "scope=key", url.Values{"id": {apiKey}}.Encode())
		if got, want := clearedOf(a), storeKind(store)+" cleared [rpm] kept []"; got != want {
			t.Fatalf("the reset answered %q, want %q", got, want)
		}
		// Right after the reset the key has its whole rpm again, and no more.
		if got := statusesOf(t, gw, 3, "X-Api-Key: "+apiKey); !slices.Equal(got, []int{200, 200, 429}) {
			t.Fatalf("after the reset: %v, want 2 admitted of rpm 2 again, then refused", got)
		}

		// By the bucket: burst 2, refilled one token per 1000 s.
		if got := statusesOf(t, gw, 3, "X-User: "+user); !slices.Equal(got, []int{200, 200, 429}) {
			t.Fatalf("before the reset: %v, want a burst of 2, then refused", got)
		}
		a, _ = postReset(t, "scope=user&id="+user, "")
		if got, want := clearedOf(a), storeKind(store)+" cleared [bucket] kept []"; got != want {
			t.Fatalf("the reset answered %q, want %q", got, want)
		}
		if got := statusesOf(t, gw, 3, "X-User: "+user); !slices.Equal(got, []int{200, 200, 429}) {
			t.Fatalf("after the reset: %v, want the full bucket of 2 again, then refused", got)
		}
	})
}

func TestResetOnRedisClusterAdmitsAgainUnderTheGivenRoot(t *testing.T) {
	gw := clusterTeamGateway(t, 2)
	org, team := redistest.UniqueID(t), redistest.UniqueID(t)
	headers := []string{"X-Org: " + org, "X-Team: " + team}
	clearOfMinuteEnd(t, 5*time.Second)
	if got := statusesOf(t, gw, 4, headers...); !slices.Equal(got, []int{200, 200, 429, 429}) {
		t.Fatalf("before the reset: %v, want 2 admitted of rpm 2, then refused", got)
	}
	res, body := resetAt(t, caddyAdmin(), http.MethodPost, "scope=team&id="+team, "")
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(apiError(t, body), "e.g. root=org:acme") {
		t.Fatalf("without root on a cluster: %d %s, want 400 asking for it", res.StatusCode, body)
	}
	if got := statusesOf(t, gw, 1, headers...); !slices.Equal(got, []int{429}) {
		t.Fatalf("after a reset refused for want of its root: %v, want still refused", got)
	}
	a, body := postReset(t, "scope=team&id="+team+"&root=org:"+org, "")
	if got := clearedOf(a); got != "redis cleared [rpm] kept []" || a.Limits[0].ID != limiter.KeyID(false, team) {
		t.Fatalf("with root: %s", body)
	}
	if got := statusesOf(t, gw, 3, headers...); !slices.Equal(got, []int{200, 200, 429}) {
		t.Fatalf("after the reset: %v, want 2 admitted of rpm 2 again, then refused", got)
	}
}

func TestResetAnswersWhatItClearedAndKeptAndTheLiveViewShowsItsCountersAtZero(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t) // every response reports 3 input and 4 output tokens
		gw := startGateway(t, up.URL, limited(store, teamLines+`
			limit team * rpm 10 tpm 1000 rpd 100 rate 1 burst 5 concurrent 3 budget_day 1
			price m input 1 output 4`))
		team := redistest.UniqueID(t)
		clearOfMinuteEnd(t, 5*time.Second)
		call := openAICall("m", false)
		for range 2 {
			if res, body := call.send(t, gw, "X-Team: "+team); res.StatusCode != 200 {
				t.Fatalf("%d %s", res.StatusCode, body)
			}
		}
		// Two responses of 3 input tokens at $1 per million and 4 output at
		// $4: 19,000 n$ each.
		before := waitSettled(t, caddyAdmin(), team, 2*19_000)
		if before.RPM.Estimate != 2 || before.TPM.Estimate != 14 || before.RPD.Estimate != 2 || before.Bucket.Remaining != 3 {
			t.Fatalf("before the reset: %+v", before)
		}

		a, body := postReset(t, "scope=team&id="+team, "")
		if a.Scope != "team" || a.ID != team || len(a.Limits) != 1 || a.Note != "" {
			t.Fatalf("answer %s", body)
		}
		e := a.Limits[0]
		if e.Store != storeKind(store) || e.ID != team || e.Source != "default" || e.Handlers != 1 ||
			!slices.EqualFunc(e.Chains, [][]string{{"team"}}, slices.Equal) || e.Redis != strings.TrimPrefix(store, "redis ") {
			t.Errorf("limit %+v", e)
		}
		if got := clearedOf(a); got != storeKind(store)+" cleared [rpm tpm rpd bucket] kept [concurrent budget_day]" {
			t.Errorf("the reset answered %q: want every window, the bucket cleared; the slots, the budget kept", got)
		}
		var kept []string
		for _, k := range a.Kept {
			kept = append(kept, k.What)
			if k.Why == "" {
				t.Errorf("kept %q without a reason", k.What)
			}
		}
		if !slices.Equal(kept, []string{"concurrent", "budget_day"}) ||
			!strings.Contains(a.Kept[0].Why, "renewal") || !strings.Contains(a.Kept[1].Why, "raise it in the config") {
			t.Errorf("kept %s, want the slots and the budget, each with why", body)
		}
		wantOthers := map[string]string{"memory": "in-process store is this process's own", "redis": "other gateway processes on the same Redis keep theirs"}[storeKind(store)]
		if len(a.OtherProcesses) != 1 || !strings.Contains(a.OtherProcesses[0], wantOthers) {
			t.Errorf("other_processes %q, want it to say %q", a.OtherProcesses, wantOthers)
		}

		after := teamLimit(t, caddyAdmin(), team)
		for name, c := range map[string]*UsageCounter{"rpm": after.RPM, "tpm": after.TPM, "rpd": after.RPD} {
			if c.Estimate != 0 || c.Remaining != c.Limit || c.ResetMillis != 0 {
				t.Errorf("%s after the reset: %+v, want 0 and the whole cap remaining", name, c)
			}
		}
		if b := after.Bucket; b.Tokens != 5 || b.Remaining != 5 || b.FullMillis != 0 {
			t.Errorf("bucket after the reset: %+v, want full", b)
		}
		if after.BudgetDay.Spent != before.BudgetDay.Spent || nanoUSD(t, after.BudgetDay.Spent) != 2*19_000 || !after.Admits {
			t.Errorf("budget after the reset: %+v, want its spend kept", after.BudgetDay)
		}
	})
}

func TestResetKeepsTheSlotsOfRequestsInFlightAndABudgetsSpendAndReservations(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t) // reports 3 input and 4 output tokens: 19,000 n$ at these prices
		gw := flightGatewayTo(t, up.URL, store, teamLines+`
			limit team * rpm 100 concurrent 1 budget_day 1
			price m input 1 output 4`)
		c := flightClient(t)
		team := redistest.UniqueID(t)
		call := openAICall("m", false)
		send := func(more ...string) flightAnswer {
			return postTo(c, gw.url, call.path, call.body, append([]string{"X-Team: " + team}, more...)...)
		}
		if a := send("X-Upstream: " + upstreamFast); a.status != 200 {
			t.Fatalf("a first request: %d %s %v", a.status, a.body, a.err)
		}
		waitSettled(t, caddyAdmin(), team, 19_000)
		refused, finish := heldBurstOf(t, []string{gw.url}, up, 1, func(string) flightAnswer { return send("X-Upstream: " + upstreamHeld) })
		if len(refused) != 0 {
			t.Fatalf("the held request was answered: %+v", refused)
		}
		if a := send("X-Upstream: " + upstreamFast); a.status != 429 {
			t.Fatalf("with the slot held: %d %s, want 429", a.status, a.body)
		}
		before := teamLimit(t, caddyAdmin(), team)
		if before.Concurrent.InFlight != 1 || nanoUSD(t, before.BudgetDay.Reserved) == 0 {
			t.Fatalf("before the reset: %+v %+v", before.Concurrent, before.BudgetDay)
		}

		a, body := postReset(t, "scope=team&id="+team, "")
		if got := clearedOf(a); got != storeKind(store)+" cleared [rpm] kept [concurrent budget_day]" {
			t.Fatalf("the reset answered %q (%s)", got, body)
		}
		after := teamLimit(t, caddyAdmin(), team)
		if *after.Concurrent != *before.Concurrent || after.BudgetDay.Spent != before.BudgetDay.Spent ||
			after.BudgetDay.Reserved != before.BudgetDay.Reserved || after.RPM.Estimate != 0 {
			t.Fatalf("after the reset: %+v %+v rpm %+v, want the slot and the budget as before %+v %+v, and rpm 0",
				after.Concurrent, after.BudgetDay, after.RPM, before.Concurrent, before.BudgetDay)
		}
		if a := send("X-Upstream: " + upstreamFast); a.status != 429 {
			t.Fatalf("after the reset, with the slot still held: %d %s, want 429", a.status, a.body)
		}

		// The request in flight ends: its slot is freed and its reservation
		// settled as if there had been no reset.
		if answers := finish(); answers[0].status != 200 {
			t.Fatalf("the held request: %d %s %v", answers[0].status, answers[0].body, answers[0].err)
		}
		settled := waitSettled(t, caddyAdmin(), team, 2*19_000)
		if settled.Concurrent.InFlight != 0 {
			t.Fatalf("after the held request ended: %+v, want its slot free", settled.Concurrent)
		}
		if a := send("X-Upstream: " + upstreamFast); a.status != 200 {
			t.Fatalf("once the slot is free: %d %s", a.status, a.body)
		}
	})
}

func TestResetRefusesOtherMethodsAndBadParametersAndNeverEchoesTheID(t *testing.T) {
	logFile := t.TempDir() + "/caddy.log"
	up := newUpstream(t)
	secret := "sk-live-" + redistest.UniqueID(t) + "-SECRET"
	gw := startGatewayWith(t, up.URL, fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t\tlevel INFO\n\t}", logFile), `
	rolter_ratelimit {
		scope key {http.request.header.X-Api-Key}
		scope team {http.request.header.X-Team}
		limit key * rpm 5
	}
	reverse_proxy {upstream}`, 0)
	if res, body := gw.do(t, "X-Api-Key: "+secret); res.StatusCode != 200 {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	digest := limiter.KeyID(false, secret)
	var answers []string

	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		res, body := resetAt(t, caddyAdmin(), method, "scope=key&digest="+url.QueryEscape(digest), "")
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "POST" {
			t.Errorf("%s: %d (Allow %q) %s, want 405 with Allow: POST", method, res.StatusCode, res.Header.Get("Allow"), body)
		}
		apiError(t, body)
	}
	// GET of the reset's path is no live view either: the live view is
	// still its own path.
	if v, _ := getLiveView(t, "scope=key&digest="+url.QueryEscape(digest)); len(v.Limits) != 1 || v.Limits[0].RPM.Estimate != 1 {
		t.Fatalf("the live view after the refused resets: %+v, want the key's request counted", v)
	}

	for _, c := range []struct{ query, form, want string }{
		{"scope=key", "", "missing id parameter"},
		{"scope=key", "id=", "empty id parameter"},
		{"", url.Values{"id": {secret}}.Encode(), "missing scope parameter"},
		{"scope=nosuch", url.Values{"id": {secret}}.Encode(), `unknown scope "nosuch": no loaded rolter_ratelimit handler has a scope of that name (known scopes: key, team)`},
		{"scope=key&id=x", url.Values{"id": {secret}}.Encode(), "give the id parameter once"},
		{"scope=key", url.Values{"id": {secret}, "digest": {digest}}.Encode(), "give either the id parameter or the digest parameter"},
		{"scope=key", url.Values{"digest": {secret}}.Encode(), `the digest parameter must be "#" and 32`},
		{"scope=key&root=nocolon", url.Values{"id": {secret}}.Encode(), "the root parameter is <scope>:<id>"},
	} {
		res, body := resetAt(t, caddyAdmin(), http.MethodPost, c.query, c.form)
		answers = append(answers, string(body))
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("%s %s: %d %s, want 400", c.query, c.form, res.StatusCode, body)
			continue
		}
		if msg := apiError(t, body); !strings.HasPrefix(msg, c.want) {
			t.Errorf("%s: error %q, want it to start with %q", c.query, msg, c.want)
		}
	}

	// The id in a form body, out of the URI that Caddy logs, and by its
	// digest: both answer the digest, never the id.
	for _, r := range []struct{ query, form string }{
		{"scope=key", url.Values{"id": {secret}}.Encode()},
		{"scope=key&digest=" + url.QueryEscape(digest), ""},
	} {
		a, body := postReset(t, r.query, r.form)
		answers = append(answers, string(body))
		if a.ID != digest || len(a.Limits) != 1 || a.Limits[0].ID != digest || !slices.Equal(a.Limits[0].Cleared, []string{"rpm"}) {
			t.Errorf("%s: %s, want the digest %s and its rpm cleared", r.query, body, digest)
		}
	}

	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	resets := 0
	for line := range strings.Lines(string(logs)) {
		if strings.Contains(line, `"logger":"admin.api.rolter_ratelimit"`) && strings.Contains(line, `"msg":"rate limit counters reset"`) {
			resets++
			for _, want := range []string{`"scope":"key"`, `"id":"` + digest + `"`, `"store":"memory"`, `"cleared":["rpm"]`} {
				if !strings.Contains(line, want) {
					t.Errorf("log line %s lacks %s", line, want)
				}
			}
		}
	}
	if resets != 2 {
		t.Errorf("%d reset lines logged at info, want 2:\n%s", resets, logs)
	}
	answers = append(answers, string(logs)) // every line: Caddy's admin requests too, whose URIs held no id
	for _, a := range answers {
		for _, s := range []string{secret, "SECRET", "sk-live"} {
			if strings.Contains(a, s) {
				t.Errorf("%q appears in %s", s, a)
			}
		}
	}
}

func TestResetOfAnIDNoHandlerLimitsAnswers200WithNothingClearedAndANote(t *testing.T) {
	up := newUpstream(t)
	org := redistest.UniqueID(t)
	startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit {
		scope org {http.request.header.X-Org}
		scope team {http.request.header.X-Team}
		limit org %s rpm 5
	}
	reverse_proxy {upstream}`, org))
	for _, q := range []string{"scope=org&id=someone-else", "scope=team&id=" + org} {
		a, body := postReset(t, q, "")
		if a.Limits == nil || len(a.Limits) != 0 || !strings.Contains(string(body), `"limits":[]`) || !strings.Contains(string(body), `"kept":[]`) ||
			!strings.Contains(a.Note, "nothing to reset") || len(a.OtherProcesses) != 0 {
			t.Errorf("%s: %s, want 200 with an empty list and a note", q, body)
		}
	}
}

func TestResetAnswers503WhenTheStoreCannotBeWritten(t *testing.T) {
	org, dead := startGatewayOnDeadRedis(t)
	res, body := resetAt(t, caddyAdmin(), http.MethodPost, "scope=org&id="+org, "")
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("with Redis stopped: %d %s, want 503", res.StatusCode, body)
	}
	if msg := apiError(t, body); !strings.Contains(msg, "cannot be written") || !strings.Contains(msg, dead) {
		t.Fatalf("error %q: want it to say which store cannot be written", msg)
	}
}

// Through Caddy: a request in flight across a reset is charged the tokens
// its response reports, as the reset's answer promises.
func TestAResetDuringARequestKeepsTheTokensItsResponseReports(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t) // reports 3 input and 4 output tokens: 19,000 n$ at these prices
		gw := flightGatewayTo(t, up.URL, store, teamLines+`
			limit team * tpm 100000 budget_day 1
			price m input 1 output 4`)
		c := flightClient(t)
		team := redistest.UniqueID(t)
		call := openAICall("m", false)
		clearOfMinuteEnd(t, 5*time.Second)
		_, finish := heldBurstOf(t, []string{gw.url}, up, 1, func(url string) flightAnswer {
			return postTo(c, url, call.path, call.body, "X-Team: "+team, "X-Upstream: "+upstreamHeld)
		})
		if before := teamLimit(t, caddyAdmin(), team); before.TPM.Estimate == 0 {
			t.Fatalf("before the reset: tpm %+v, want the request's reservation", before.TPM)
		}
		if a, body := postReset(t, "scope=team&id="+team, ""); clearedOf(a) != storeKind(store)+" cleared [tpm] kept [budget_day]" {
			t.Fatalf("the reset answered %s", body)
		}
		if after := teamLimit(t, caddyAdmin(), team); after.TPM.Estimate != 0 {
			t.Fatalf("right after the reset: tpm %+v, want 0", after.TPM)
		}
		if answers := finish(); answers[0].status != 200 {
			t.Fatalf("the request in flight: %d %s %v", answers[0].status, answers[0].body, answers[0].err)
		}
		if settled := waitSettled(t, caddyAdmin(), team, 19_000); settled.TPM.Estimate != 7 {
			t.Fatalf("once the request in flight across the reset was settled: tpm %+v, want the 7 tokens its response reported", settled.TPM)
		}
	})
}
