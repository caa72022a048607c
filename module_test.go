package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/poll"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// End-to-end tests: a real Caddy (harness_caddy_test.go) in front of a fake
// upstream (harness_upstream_test.go), over real HTTP.

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

func TestCaddyRefusesOverRPMWithOpenAIShaped429AndTheUpstreamNeverSeesIt(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		org := redistest.UniqueID(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.Authorization}
			scope org {http.request.header.X-Org}
			limit key * rpm 2
			limit org * rpm 100 tpm 100000`))
		auth := "Authorization: Bearer sk-secret-" + org
		for i := 0; i < 2; i++ {
			if res, body := gw.do(t, auth, "X-Org: "+org); res.StatusCode != 200 {
				t.Fatalf("request %d: %d %s", i+1, res.StatusCode, body)
			}
		}
		res, body := gw.do(t, auth, "X-Org: "+org)
		if res.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("third request: %d, want 429", res.StatusCode)
		}
		if up.hits.Load() != 2 {
			t.Fatalf("upstream saw %d requests, want 2: the refused one must not reach it", up.hits.Load())
		}
		if ct := res.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("Content-Type %q", ct)
		}
		var e openAIError
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		if e.Error.Type != "requests" || e.Error.Code != "rate_limit_exceeded" || e.Error.Param != nil || !strings.Contains(body, `"param":null`) {
			t.Fatalf("error body %s", body)
		}
		if !strings.Contains(e.Error.Message, "key") || !strings.Contains(e.Error.Message, "2") || strings.Contains(body, "sk-secret") {
			t.Fatalf("message %q must name the scope and the cap, never the id", e.Error.Message)
		}
		ra, err := strconv.Atoi(res.Header.Get("Retry-After"))
		if err != nil || ra < 1 || ra > 120 {
			t.Fatalf("Retry-After %q", res.Header.Get("Retry-After"))
		}
		ms, err := strconv.Atoi(res.Header.Get("Retry-After-Ms"))
		if err != nil || (ms+999)/1000 != ra {
			t.Fatalf("retry-after-ms %q does not round up to Retry-After %d", res.Header.Get("Retry-After-Ms"), ra)
		}
		if got := res.Header.Get("X-Ratelimit-Remaining-Requests"); got != "0" {
			t.Fatalf("x-ratelimit-remaining-requests on the refusal: %q", got)
		}
	})
}

func TestAdmittedResponsesCarryTheTightestLimitsHeadersInPlaceOfTheUpstreams(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		org := redistest.UniqueID(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.Authorization}
			scope org {http.request.header.X-Org}
			limit key * rpm 50
			limit org * rpm 10 tpm 5000
			reserve_tokens off`))
		res, body := gw.do(t, "Authorization: Bearer sk-"+org, "X-Org: "+org)
		if res.StatusCode != 200 || !strings.Contains(body, "chat.completion") {
			t.Fatalf("%d %s", res.StatusCode, body)
		}
		want := map[string]string{
			"X-Ratelimit-Limit-Requests":     "10", // the org has the least remaining
			"X-Ratelimit-Remaining-Requests": "9",
			"X-Ratelimit-Limit-Tokens":       "5000",
			"X-Ratelimit-Remaining-Tokens":   "5000",
			"X-Ratelimit-Reset-Tokens":       "0s",
		}
		for name, v := range want {
			if got := res.Header.Values(name); len(got) != 1 || got[0] != v {
				t.Errorf("%s: %q, want exactly %q", name, got, v)
			}
		}
		reset, err := time.ParseDuration(res.Header.Get("X-Ratelimit-Reset-Requests"))
		if err != nil || reset <= time.Minute || reset > 2*time.Minute {
			t.Errorf("x-ratelimit-reset-requests %q: want the time until the end of the next minute", res.Header.Get("X-Ratelimit-Reset-Requests"))
		}
	})
}

func TestIETFHeadersDescribeThePolicyAndItsState(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		org := redistest.UniqueID(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope org {http.request.header.X-Org}
			limit org * rpm 10 tpm 5000
			headers ietf
			reserve_tokens off`))
		res, _ := gw.do(t, "X-Org: "+org)
		if got := res.Header.Get("RateLimit-Policy"); got != `"requests";q=10;w=60, "tokens";q=5000;w=60` {
			t.Errorf("RateLimit-Policy %q", got)
		}
		if got := res.Header.Get("RateLimit"); !strings.HasPrefix(got, `"requests";r=9;t=`) || !strings.HasSuffix(got, `"tokens";r=5000;t=0`) {
			t.Errorf("RateLimit %q", got)
		}
		if got := res.Header.Values("X-Ratelimit-Limit-Requests"); len(got) != 1 || got[0] != "99999" {
			t.Errorf("the upstream's own x-ratelimit headers are not ours to touch with headers ietf: %q", got)
		}
	})
}

func TestOnRefusalErrorHandsThe429ToHandleErrorsWithPlaceholders(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		org := redistest.UniqueID(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope org {http.request.header.X-Org}
			limit org * rpm 1
			on_refusal error`, `
		handle_errors {
			respond "refused by {http.rolter_ratelimit.refused_scope} on {http.rolter_ratelimit.refused_kind}, cap {http.rolter_ratelimit.refused_limit}, retry in {http.rolter_ratelimit.retry_after}s" {err.status_code}
		}`))
		gw.do(t, "X-Org: "+org)
		res, body := gw.do(t, "X-Org: "+org)
		if res.StatusCode != 429 || !strings.HasPrefix(body, "refused by org on requests, cap 1, retry in ") {
			t.Fatalf("%d %q", res.StatusCode, body)
		}
		if res.Header.Get("Retry-After") == "" {
			t.Error("Retry-After missing from the handle_errors answer")
		}
	})
}

func TestInProcessStoreEnforcesWithoutRedis(t *testing.T) {
	up := newUpstream(t)
	key := redistest.UniqueID(t)
	gw := startGateway(t, up.URL, limited("", `
		scope key {http.request.header.Authorization}
		limit key * rpm 3`))
	statuses := make([]int, 5)
	for i := range statuses {
		res, _ := gw.do(t, "Authorization: Bearer "+key)
		statuses[i] = res.StatusCode
	}
	if fmt.Sprint(statuses) != "[200 200 200 429 429]" {
		t.Fatalf("statuses %v", statuses)
	}
}

func TestRedisOutageFailsOpenByDefaultAndClosedWithDenyThenEnforcementResumes(t *testing.T) {
	srv := redistest.NewServer(t)
	up := newUpstream(t)
	org := redistest.UniqueID(t)
	site := func(onError string) string {
		return fmt.Sprintf(`
	rolter_ratelimit /open* {
		redis %[1]s
		scope org {http.request.header.X-Org}
		limit org * rpm 1
	}
	rolter_ratelimit /closed* {
		redis %[1]s
		scope org {http.request.header.X-Org}
		limit org * rpm 1
		on_redis_error %[2]s
	}
	reverse_proxy {upstream}`, srv.URL(), onError)
	}
	gw := startGateway(t, up.URL, site("deny"))
	call := func(path, org string) (int, string) {
		res, body := gw.send(t, "GET", path, "", "X-Org: "+org)
		return res.StatusCode, string(body)
	}
	if code, _ := call("/open", org); code != 200 {
		t.Fatalf("first request %d", code)
	}
	if code, _ := call("/open", org); code != 429 {
		t.Fatalf("second request %d, want 429 while Redis is up", code)
	}
	srv.Stop()
	// The refusal is cached until Redis would admit the org (internal/limiter/refusalcache.go):
	// it holds until the gateway meets the outage, which makes it forget.
	if code, _ := call("/open", org); code != 429 {
		t.Fatalf("with Redis stopped, before any store error: %d, want the cached 429", code)
	}
	before := up.hits.Load()
	if code, _ := call("/open", redistest.UniqueID(t)); code != 200 {
		t.Fatalf("with Redis stopped: %d, want 200 (fail open)", code)
	}
	if up.hits.Load() != before+1 {
		t.Fatal("a failed-open request did not reach the upstream")
	}
	code, body := call("/closed", org)
	if code != 503 || !strings.Contains(body, `"code":"rate_limiter_unavailable"`) {
		t.Fatalf("on_redis_error deny with Redis stopped: %d %s, want 503", code, body)
	}
	srv.Restart(t) // empty data, empty script cache
	// The gateway's connections died with the server: a call or two may
	// still meet one and answer 503 before the pool reconnects.
	poll.Until(waitBound, pollEvery, func() error {
		if code, _ = call("/closed", org); code == 503 {
			return errors.New("still 503")
		}
		return nil
	})
	if code != 200 {
		t.Fatalf("first request after the restart: %d, want 200 on the empty Redis", code)
	}
	if code, _ := call("/closed", org); code != 429 {
		t.Fatalf("second request after the restart: %d, want 429: enforcement resumed", code)
	}
}

// While Redis hangs, every request gets on_redis_error's answer within the
// Redis timeout: the upstream's (allow, the default) or 503 (deny).
func TestRequestsWhileRedisHangsGetOnRedisErrorsAnswerWithinTheTimeout(t *testing.T) {
	srv := redistest.NewServer(t)
	up := newUpstream(t)
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit /open* {
		redis %[1]s {
			timeout %[2]s
		}
		scope org {http.request.header.X-Org}
		limit org * rpm 1000
	}
	rolter_ratelimit /closed* {
		redis %[1]s {
			timeout %[2]s
		}
		scope org {http.request.header.X-Org}
		limit org * rpm 1000
		on_redis_error deny
	}
	reverse_proxy {upstream}`, srv.URL(), redistest.HungTimeout))
	org := redistest.UniqueID(t)
	status := func(path string) (int, error) {
		req, err := http.NewRequest("GET", gw.url+path, nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("X-Org", org)
		res, err := gw.tester.Client.Do(req)
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		_, err = io.Copy(io.Discard, res.Body)
		return res.StatusCode, err
	}
	// requestConcurrently sends rounds requests back to back from each of 16
	// clients, alternately to /open and /closed, each of which must answer
	// its want, and returns how long each took.
	requestConcurrently := func(want map[string]int) []time.Duration {
		const clients, rounds = 16, 8
		took := make([]time.Duration, clients*rounds)
		var wg sync.WaitGroup
		for c := range clients {
			wg.Go(func() {
				for r := range rounds {
					path := "/open"
					if (c+r)%2 == 1 {
						path = "/closed"
					}
					start := time.Now()
					code, err := status(path)
					took[c*rounds+r] = time.Since(start)
					if code != want[path] {
						t.Errorf("%s: %d %v, want %d", path, code, err, want[path])
					}
				}
			})
		}
		wg.Wait()
		return took
	}
	// The same traffic with Redis up loads the script, and opens the
	// connections a first burst would pay for on a loaded machine.
	requestConcurrently(map[string]int{"/open": 200, "/closed": 200})
	if t.Failed() {
		t.FailNow()
	}
	resume := srv.Hang(t)
	defer resume()
	took := requestConcurrently(map[string]int{"/open": 200, "/closed": 503})
	redistest.CheckWithinTimeout(t, "requests", took)
}

// Secrets are kept by what a scope holds, not by its name: a scope called
// apikey holding a 51-character OpenAI key, one holding a user's email and
// one holding a customer id leave no trace anywhere the module writes, while
// a readable scope keeps its ids as written.
func TestSecretIDsLeaveNoTraceWhateverTheirScopeIsCalled(t *testing.T) {
	eachStore(t, func(t *testing.T, storeLine string) {
		logFile := t.TempDir() + "/caddy.log"
		up := newUpstream(t)
		uid := redistest.UniqueID(t)
		apiKey := "sk-" + uid + strings.Repeat("Zq7", 12) + "xyz" // sk- and 48 letters and digits
		email := "alice." + uid + "@example.com"
		customer := "cust_" + uid
		team := "ml-" + uid
		secrets := []string{apiKey, email, customer, uid}
		gw := startGatewayWith(t, up.URL, fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t\tlevel DEBUG\n\t}", logFile), fmt.Sprintf(`
	rolter_ratelimit {
		%s
		scope apikey {http.request.header.X-Api-Key}
		scope user {http.request.header.X-User-Email}
		scope customer {http.request.header.X-Customer}
		scope team {http.request.header.X-Team} readable
		limit apikey * rpm 2 tpm 100000
		limit user %s rpm 5
		limit customer * rpm 5
		limit team %s rpm 50
	}
	reverse_proxy {upstream}`, storeLine, email, team), 0)
		headers := []string{"X-Api-Key: " + apiKey, "X-User-Email: " + email, "X-Customer: " + customer, "X-Team: " + team}
		var bodies strings.Builder
		for i, want := range []int{200, 200, 429} { // the third is refused at debug level, by the key
			res, body := gw.do(t, headers...)
			if res.StatusCode != want {
				t.Fatalf("request %d: %d %s, want %d", i+1, res.StatusCode, body, want)
			}
			bodies.WriteString(body)
		}
		answers := []string{bodies.String()}
		digests := map[string]string{"apikey": limiter.KeyID(false, apiKey), "user": limiter.KeyID(false, email), "customer": limiter.KeyID(false, customer)}
		for scope, digest := range digests {
			raw := map[string]string{"apikey": apiKey, "user": email, "customer": customer}[scope]
			v, body := getLiveView(t, "scope="+scope+"&id="+url.QueryEscape(raw))
			if v.ID != digest || len(v.Limits) != 1 || v.Limits[0].ID != digest || v.Limits[0].RPM.Estimate != 2 {
				t.Errorf("live view of %s: %s, want the digest %s and its counters", scope, body, digest)
			}
			answers = append(answers, string(body))
			_, body = liveView(t, http.MethodGet, "scope=no"+scope+"&id="+url.QueryEscape(raw)) // an error answer
			answers = append(answers, string(body))
		}
		if v, body := getLiveView(t, "scope=team&id="+team); v.ID != team || len(v.Limits) != 1 || v.Limits[0].ID != team || v.Limits[0].RPM.Estimate != 2 {
			t.Errorf("live view of the readable team: %s, want its id as written", body)
		}
		answers = append(answers, metricsText(t))

		if storeLine != "" {
			keys, err := redistest.TestClient(t, redistest.EnvURL(t)).Keys(context.Background(), "rolter:rl:*").Result()
			if err != nil {
				t.Fatal(err)
			}
			found := map[string]bool{}
			for _, k := range keys {
				answers = append(answers, k)
				for scope, digest := range digests {
					found[scope] = found[scope] || strings.HasPrefix(k, "rolter:rl:"+scope+":"+digest+":")
				}
				found["team"] = found["team"] || strings.HasPrefix(k, "rolter:rl:team:"+team+":req:")
			}
			if len(found) != 4 {
				t.Errorf("Redis keys of the digested scopes and the readable team: found %v", found)
			}
		}

		logs, err := os.ReadFile(logFile)
		if err != nil {
			t.Fatal(err)
		}
		ours := 0
		for _, line := range strings.Split(string(logs), "\n") {
			if strings.Contains(line, `"logger":"http.handlers.rolter_ratelimit"`) {
				ours++
				answers = append(answers, line)
			}
		}
		for _, want := range []string{`"msg":"rate limits loaded"`, `"msg":"refused"`, digests["apikey"], digests["user"], "team " + team} {
			if !strings.Contains(string(logs), want) {
				t.Errorf("the module's log lines (%d) lack %q", ours, want)
			}
		}
		for _, a := range answers {
			for _, secret := range secrets {
				if strings.Contains(strings.ReplaceAll(a, team, ""), secret) { // the readable team holds uid
					t.Errorf("%q appears in %s", secret, a)
				}
			}
		}
	})
}

// Caddy's access log records request headers, redacting only Authorization
// and cookies: the filter of docs/operating.md (Secrets) deletes the others
// that carry keys, as Caddyfile.example does.
func TestTheREADMEsLogFilterKeepsAPIKeysOutOfTheAccessLog(t *testing.T) {
	logFile := t.TempDir() + "/access.log"
	up := newUpstream(t)
	apiKey := "sk-ant-" + redistest.UniqueID(t) + "-SECRET"
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	log {
		output file %s
		format filter {
			request>headers>X-Api-Key delete
			request>headers>Api-Key delete
			request>headers>X-Goog-Api-Key delete
		}
	}
	rolter_ratelimit {
		scope key {http.request.header.X-Api-Key}
		limit key * rpm 5
	}
	reverse_proxy {upstream}`, logFile))
	for _, also := range []string{"", "Api-Key", "X-Goog-Api-Key"} {
		headers := []string{"X-Api-Key: " + apiKey}
		if also != "" {
			headers = append(headers, also+": "+apiKey)
		}
		if res, body := gw.do(t, headers...); res.StatusCode != 200 {
			t.Fatalf("%d %s", res.StatusCode, body)
		}
	}
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(logs), `"uri":"/v1/chat/completions"`); n != 3 || strings.Contains(string(logs), "SECRET") {
		t.Fatalf("access log (%d entries) must log every request and no key:\n%s", n, logs)
	}
}

// Spring's denyEmptyKey, as an option: a request whose value for a required
// scope is empty is refused with 403 naming the scope, before any store
// call; a scope that is not required still leaves an empty value unlimited.
func TestRequiredScopeRefusesAnEmptyValueWith403BeforeAnyStoreCall(t *testing.T) {
	eachStore(t, func(t *testing.T, storeLine string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit /respond* {
		%[1]s
		scope key {http.request.header.Authorization} required
		scope org {http.request.header.X-Org}
		limit org * rpm 1
	}
	rolter_ratelimit /error* {
		%[1]s
		scope key {http.request.header.Authorization}
		scope org {http.request.header.X-Org} required
		limit key * rpm 100
		on_refusal error
	}
	reverse_proxy {upstream}
	handle_errors {
		respond "{http.rolter_ratelimit.outcome} {http.rolter_ratelimit.refused_scope}" {err.status_code}
	}`, storeLine))
		before := scrape(t)[`caddy_rolter_ratelimit_admissions_total{outcome="refused_empty_scope"}`]
		res, body := gw.send(t, "POST", "/respond", `{}`, "X-Org: "+redistest.UniqueID(t))
		var e openAIError
		if res.StatusCode != 403 || json.Unmarshal(body, &e) != nil || e.Error.Code != "rate_limit_scope_missing" ||
			e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, `"key"`) {
			t.Fatalf("without the required key: %d %s, want 403 naming the scope", res.StatusCode, body)
		}
		res, body = gw.send(t, "POST", "/error", `{}`, "Authorization: Bearer sk-"+redistest.UniqueID(t))
		if res.StatusCode != 403 || string(body) != "refused_empty_scope org" {
			t.Fatalf("on_refusal error without the required org: %d %q", res.StatusCode, body)
		}
		if n := up.hits.Load(); n != 0 {
			t.Fatalf("the upstream saw %d refused requests", n)
		}
		if got := scrape(t)[`caddy_rolter_ratelimit_admissions_total{outcome="refused_empty_scope"}`] - before; got != 2 {
			t.Errorf("admissions_total{outcome=refused_empty_scope} rose by %v, want 2", got)
		}
		key := "Authorization: Bearer sk-" + redistest.UniqueID(t)
		for i := range 3 { // no org value: the org's rpm 1 does not apply
			if res, body := gw.send(t, "POST", "/respond", `{}`, key); res.StatusCode != 200 {
				t.Fatalf("request %d with the key and no org: %d %s", i+1, res.StatusCode, body)
			}
		}
	})
}

// Refused before any store call: a store that cannot answer is never asked.
func TestRequiredScopeIsCheckedWithoutTheStore(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit {
		redis redis://127.0.0.1:%d
		scope key {http.request.header.Authorization} required
		limit key * rpm 5
		on_redis_error deny
	}
	reverse_proxy {upstream}`, freePort()))
	if res, body := gw.do(t); res.StatusCode != 403 {
		t.Fatalf("without the key, Redis down: %d %s, want 403 without asking the store", res.StatusCode, body)
	}
	if res, body := gw.do(t, "Authorization: Bearer sk-x"); res.StatusCode != 503 {
		t.Fatalf("with the key, Redis down: %d %s, want on_redis_error's 503", res.StatusCode, body)
	}
}

func TestInProcessCountersSurviveAConfigReload(t *testing.T) {
	up := newUpstream(t)
	key := redistest.UniqueID(t)
	site := func(comment string) string {
		return `
	# ` + comment + `
	rolter_ratelimit {
		scope key {http.request.header.Authorization}
		limit key * rpm 2
	}
	reverse_proxy {upstream}`
	}
	gw := startGatewayWith(t, up.URL, "", site("first load"), 0)
	if res, _ := gw.do(t, "Authorization: "+key); res.StatusCode != 200 {
		t.Fatalf("first request %d", res.StatusCode)
	}
	gw = startGatewayWith(t, up.URL, "\tdebug", site("second load"), gw.port) // a different config: a real reload
	if res, _ := gw.do(t, "Authorization: "+key); res.StatusCode != 200 {
		t.Fatalf("second request %d", res.StatusCode)
	}
	if res, _ := gw.do(t, "Authorization: "+key); res.StatusCode != 429 {
		t.Fatalf("third request %d after the reload, want 429: the count was lost", res.StatusCode)
	}
}

func TestChangedLimitTakesEffectOnTheFirstRequestAfterTheReload(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		org := redistest.UniqueID(t)
		site := func(rpm int) string {
			return limited(store, fmt.Sprintf(`
				scope org {http.request.header.X-Org}
				limit org * rpm %d`, rpm))
		}
		gw := startGatewayWith(t, up.URL, "", site(1), 0)
		gw.do(t, "X-Org: "+org)
		if res, _ := gw.do(t, "X-Org: "+org); res.StatusCode != 429 {
			t.Fatalf("second request under rpm 1: %d", res.StatusCode)
		}
		gw = startGatewayWith(t, up.URL, "", site(3), gw.port)
		res, _ := gw.do(t, "X-Org: "+org)
		if res.StatusCode != 200 || res.Header.Get("X-Ratelimit-Limit-Requests") != "3" {
			t.Fatalf("first request after raising rpm to 3: %d, limit %q", res.StatusCode, res.Header.Get("X-Ratelimit-Limit-Requests"))
		}
		gw = startGatewayWith(t, up.URL, "", site(1), gw.port)
		if res, _ := gw.do(t, "X-Org: "+org); res.StatusCode != 429 {
			t.Fatalf("first request after lowering rpm to 1 again: %d, want 429", res.StatusCode)
		}
	})
}

// A scope whose value is one request header placeholder is read from the
// header directly (scopeValue); it must resolve exactly as Caddy's replacer
// does, and any other value must still go through the replacer.
func TestScopeValuesResolveAsCaddysReplacerDoes(t *testing.T) {
	values := []string{
		"{http.request.header.X-Api-Key}",
		"{http.request.header.x-api-key}", // the replacer canonicalizes
		"{http.request.header.X-Multi}",   // several values: joined by commas
		"{http.request.header.X-Absent}",  // no value: the scope does not apply
		"{http.request.header.X-Api-Key}-{http.request.header.X-Org}",
		"{http.request.header.X-Org}:suffix",
		"prefix-{http.request.header.X-Org}",
		"{http.request.host}",
		"literal",
	}
	h := &Handler{}
	for i, v := range values {
		h.Scopes = append(h.Scopes, Scope{Name: "s" + strconv.Itoa(i), Value: v})
		h.scopeHeaders = append(h.scopeHeaders, scopeHeader(v))
	}
	if h.scopeHeaders[0] != "X-Api-Key" || h.scopeHeaders[1] != "X-Api-Key" || h.scopeHeaders[4] != "" || h.scopeHeaders[5] != "" {
		t.Fatalf("header placeholders recognized: %q", h.scopeHeaders)
	}
	r := httptest.NewRequest("POST", "http://gateway.example/v1/chat/completions", nil)
	r.Header.Set("X-Api-Key", "sk-one")
	r.Header.Set("X-Org", "acme")
	r.Header.Add("X-Multi", "a")
	r.Header.Add("X-Multi", "b")
	repl := caddyhttp.NewTestReplacer(r)
	for i, v := range values {
		if got, want := h.scopeValue(i, &request{Request: r, repl: repl}), repl.ReplaceAll(v, ""); got != want {
			t.Errorf("%s: %q, Caddy's replacer gives %q", v, got, want)
		}
	}
}
