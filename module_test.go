package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// End-to-end tests: a real Caddy (caddytest runs it in this process, with its
// admin API on a free port) in front of a real upstream, over real HTTP.

var caddyAdmin = sync.OnceValue(func() int {
	caddytest.Default.Certificates = nil // no TLS in these tests
	return freePort()
})

func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// upstream plays an LLM API that sends its own rate-limit headers, and counts
// the requests that reach it.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Ratelimit-Limit-Requests", "99999")
		w.Header().Set("X-Ratelimit-Remaining-Tokens", "12345")
		io.WriteString(w, `{"object":"chat.completion","usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`)
	}))
	t.Cleanup(u.Close)
	return u
}

// gateway is a Caddy site on a free port whose routes are body, with the
// upstream's address substituted for {upstream}.
type gateway struct {
	tester *caddytest.Tester
	url    string
}

func startGateway(t *testing.T, upstreamURL string, body string) *gateway {
	t.Helper()
	return startGatewayWith(t, upstreamURL, "", body, freePort())
}

// startGatewayWith adds global options and picks the port, so that a test
// can load a second config on the same site.
func startGatewayWith(t *testing.T, upstreamURL string, globals, body string, port int) *gateway {
	t.Helper()
	admin := caddyAdmin()
	config := gatewayCaddyfile(admin, port, globals, body, upstreamURL)
	tester := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: admin, LoadRequestTimeout: 10 * time.Second})
	tester.InitServer(config, "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	return &gateway{tester: tester, url: fmt.Sprintf("http://127.0.0.1:%d", port)}
}

// gatewayCaddyfile is the whole Caddyfile of a test gateway: the admin on
// its port, the site on port with body as its routes, and the upstream's
// address for {upstream}.
func gatewayCaddyfile(admin, port int, globals, body, upstreamURL string) string {
	return fmt.Sprintf(`{
	admin localhost:%d
	auto_https off
	skip_install_trust
	grace_period 1ns
	http_port %d
%s
}
:%d {
%s
}
`, admin, port, globals, port, strings.ReplaceAll(body, "{upstream}", strings.TrimPrefix(upstreamURL, "http://")))
}

// do sends a chat completion with the given headers ("Name: value").
func (g *gateway) do(t *testing.T, headers ...string) (*http.Response, string) {
	t.Helper()
	res, body := g.send(t, "POST", "/v1/chat/completions", `{"model":"m"}`, headers...)
	return res, string(body)
}

// send sends a request with the given headers ("Name: value") and reads the
// whole answer.
func (g *gateway) send(t *testing.T, method, path, body string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, g.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	setHeaders(req, headers)
	res, err := g.tester.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, got
}

func setHeaders(req *http.Request, headers []string) {
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ": ")
		req.Header.Set(name, value)
	}
}

// redisLine is the store line of the gateways under test: the shared Redis.
func redisLine(t *testing.T) string {
	return "redis " + redisURLFromEnv(t)
}

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

func TestCaddyRefusesOverRPMWithOpenAIShaped429AndTheUpstreamNeverSeesIt(t *testing.T) {
	up := newUpstream(t)
	org := uniqueID(t)
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit {
		%s
		scope key {http.request.header.Authorization}
		scope org {http.request.header.X-Org}
		limit key * rpm 2
		limit org * rpm 100 tpm 100000
	}
	reverse_proxy {upstream}`, redisLine(t)))
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
}

func TestAdmittedResponsesCarryTheTightestLimitsHeadersInPlaceOfTheUpstreams(t *testing.T) {
	up := newUpstream(t)
	org := uniqueID(t)
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit {
		%s
		scope key {http.request.header.Authorization}
		scope org {http.request.header.X-Org}
		limit key * rpm 50
		limit org * rpm 10 tpm 5000
	}
	reverse_proxy {upstream}`, redisLine(t)))
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
}

func TestIETFHeadersDescribeThePolicyAndItsState(t *testing.T) {
	up := newUpstream(t)
	org := uniqueID(t)
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit {
		%s
		scope org {http.request.header.X-Org}
		limit org * rpm 10 tpm 5000
		headers ietf
	}
	reverse_proxy {upstream}`, redisLine(t)))
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
}

func TestOnRefusalErrorHandsThe429ToHandleErrorsWithPlaceholders(t *testing.T) {
	up := newUpstream(t)
	org := uniqueID(t)
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit {
		%s
		scope org {http.request.header.X-Org}
		limit org * rpm 1
		on_refusal error
	}
	reverse_proxy {upstream}
	handle_errors {
		respond "refused by {http.rolter_ratelimit.refused_scope} on {http.rolter_ratelimit.refused_kind}, cap {http.rolter_ratelimit.refused_limit}, retry in {http.rolter_ratelimit.retry_after}s" {err.status_code}
	}`, redisLine(t)))
	gw.do(t, "X-Org: "+org)
	res, body := gw.do(t, "X-Org: "+org)
	if res.StatusCode != 429 || !strings.HasPrefix(body, "refused by org on requests, cap 1, retry in ") {
		t.Fatalf("%d %q", res.StatusCode, body)
	}
	if res.Header.Get("Retry-After") == "" {
		t.Error("Retry-After missing from the handle_errors answer")
	}
}

func TestInProcessStoreEnforcesWithoutRedis(t *testing.T) {
	up := newUpstream(t)
	key := uniqueID(t)
	gw := startGateway(t, up.URL, `
	rolter_ratelimit {
		scope key {http.request.header.Authorization}
		limit key * rpm 3
	}
	reverse_proxy {upstream}`)
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
	srv := startRedis(t)
	up := newUpstream(t)
	org := uniqueID(t)
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
	srv.Stop(t)
	// The refusal is cached until Redis would admit the org (refusals.go):
	// it holds until the gateway meets the outage, which makes it forget.
	if code, _ := call("/open", org); code != 429 {
		t.Fatalf("with Redis stopped, before any store error: %d, want the cached 429", code)
	}
	before := up.hits.Load()
	if code, _ := call("/open", uniqueID(t)); code != 200 {
		t.Fatalf("with Redis stopped: %d, want 200 (fail open)", code)
	}
	if up.hits.Load() != before+1 {
		t.Fatal("a failed-open request did not reach the upstream")
	}
	code, body := call("/closed", org)
	if code != 503 || !strings.Contains(body, `"code":"rate_limiter_unavailable"`) {
		t.Fatalf("on_redis_error deny with Redis stopped: %d %s, want 503", code, body)
	}
	srv.Start(t) // empty data, empty script cache
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, _ = call("/closed", org)
		if code != 503 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code != 200 {
		t.Fatalf("first request after the restart: %d, want 200 on the empty Redis", code)
	}
	if code, _ := call("/closed", org); code != 429 {
		t.Fatalf("second request after the restart: %d, want 429: enforcement resumed", code)
	}
}

func TestNoSecretReachesARedisKeyOrALogLine(t *testing.T) {
	url := redisURLFromEnv(t)
	logFile := t.TempDir() + "/caddy.log"
	up := newUpstream(t)
	secret := "sk-proj-" + uniqueID(t) + "-SECRET"
	gw := startGatewayWith(t, up.URL, fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t\tlevel DEBUG\n\t}", logFile), fmt.Sprintf(`
	rolter_ratelimit {
		redis %s
		scope key {http.request.header.Authorization}
		scope team "{http.request.header.X-Team}"
		limit key * rpm 1
		limit team * rpm 100
	}
	reverse_proxy {upstream}`, url), freePort())
	team := "team with spaces"
	gw.do(t, "Authorization: Bearer "+secret, "X-Team: "+team)
	if res, _ := gw.do(t, "Authorization: Bearer "+secret, "X-Team: "+team); res.StatusCode != 429 {
		t.Fatalf("second request %d, want 429 (which logs the refusal at debug)", res.StatusCode)
	}
	keys, err := redisClient(t, url).Keys(context.Background(), "rolter:rl:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	digest := keyID("key", "Bearer "+secret)
	found := false
	for _, k := range keys {
		if strings.Contains(k, "SECRET") || strings.Contains(k, "Bearer") || strings.Contains(k, team) {
			t.Fatalf("Redis key %q holds the secret", k)
		}
		found = found || strings.HasPrefix(k, "rolter:rl:key:"+digest+":req:")
	}
	if !found {
		t.Fatalf("no key for the digested id %s among %d keys", digest, len(keys))
	}
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logs), digest) {
		t.Fatalf("the refusal's debug line with the digested id is missing from the log")
	}
	for _, line := range strings.Split(string(logs), "\n") {
		if strings.Contains(line, `"logger":"http.handlers.rolter_ratelimit"`) && strings.Contains(line, team) {
			t.Fatalf("our log line holds a raw id: %s", line)
		}
	}
	if strings.Contains(string(logs), "SECRET") {
		t.Fatalf("the secret appears in Caddy's log:\n%s", logs)
	}
}

func TestInProcessCountersSurviveAConfigReload(t *testing.T) {
	up := newUpstream(t)
	key := uniqueID(t)
	port := freePort()
	site := func(comment string) string {
		return `
	# ` + comment + `
	rolter_ratelimit {
		scope key {http.request.header.Authorization}
		limit key * rpm 2
	}
	reverse_proxy {upstream}`
	}
	gw := startGatewayWith(t, up.URL, "", site("first load"), port)
	if res, _ := gw.do(t, "Authorization: "+key); res.StatusCode != 200 {
		t.Fatalf("first request %d", res.StatusCode)
	}
	gw = startGatewayWith(t, up.URL, "\tdebug", site("second load"), port) // a different config: a real reload
	if res, _ := gw.do(t, "Authorization: "+key); res.StatusCode != 200 {
		t.Fatalf("second request %d", res.StatusCode)
	}
	if res, _ := gw.do(t, "Authorization: "+key); res.StatusCode != 429 {
		t.Fatalf("third request %d after the reload, want 429: the count was lost", res.StatusCode)
	}
}

func TestChangedLimitTakesEffectOnTheFirstRequestAfterTheReload(t *testing.T) {
	up := newUpstream(t)
	org := uniqueID(t)
	port := freePort()
	site := func(rpm int) string {
		return fmt.Sprintf(`
	rolter_ratelimit {
		%s
		scope org {http.request.header.X-Org}
		limit org * rpm %d
	}
	reverse_proxy {upstream}`, redisLine(t), rpm)
	}
	gw := startGatewayWith(t, up.URL, "", site(1), port)
	gw.do(t, "X-Org: "+org)
	if res, _ := gw.do(t, "X-Org: "+org); res.StatusCode != 429 {
		t.Fatalf("second request under rpm 1: %d", res.StatusCode)
	}
	gw = startGatewayWith(t, up.URL, "", site(3), port)
	res, _ := gw.do(t, "X-Org: "+org)
	if res.StatusCode != 200 || res.Header.Get("X-Ratelimit-Limit-Requests") != "3" {
		t.Fatalf("first request after raising rpm to 3: %d, limit %q", res.StatusCode, res.Header.Get("X-Ratelimit-Limit-Requests"))
	}
	gw = startGatewayWith(t, up.URL, "", site(1), port)
	if res, _ := gw.do(t, "X-Org: "+org); res.StatusCode != 429 {
		t.Fatalf("first request after lowering rpm to 1 again: %d, want 429", res.StatusCode)
	}
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
		if got, want := h.scopeValue(i, repl, r), repl.ReplaceAll(v, ""); got != want {
			t.Errorf("%s: %q, Caddy's replacer gives %q", v, got, want)
		}
	}
}
