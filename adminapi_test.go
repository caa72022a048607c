package ratelimit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// End-to-end tests of the live view (adminapi.go), on the admin endpoint of
// the in-process Caddy that the gateways of module_test.go run in.

var adminClient = &http.Client{Timeout: 10 * time.Second}

// liveView sends a request to the live view and reads the whole answer.
func liveView(t *testing.T, method, query string) (*http.Response, []byte) {
	t.Helper()
	return liveViewAt(t, caddyAdmin(), method, query)
}

// liveViewAt is liveView of the Caddy whose admin endpoint is on port
// admin (a gateway process of its own, say).
func liveViewAt(t *testing.T, admin int, method, query string) (*http.Response, []byte) {
	t.Helper()
	return adminAt(t, admin, method, UsagePath, query, "")
}

// adminAt sends a request to a route of the admin endpoint on port admin,
// with a form body unless form is "", and returns the whole answer.
func adminAt(t *testing.T, admin int, method, path, query, form string) (*http.Response, []byte) {
	t.Helper()
	var body io.Reader
	if form != "" {
		body = strings.NewReader(form)
	}
	req, err := http.NewRequest(method, fmt.Sprintf("http://localhost:%d%s?%s", admin, path, query), body)
	if err != nil {
		t.Fatal(err)
	}
	if form != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return mustDo(t, adminClient, req)
}

// adminAnswer is the JSON answer of a route of the admin endpoint, which
// must be 200 with JSON.
func adminAnswer[T any](t *testing.T, what string, res *http.Response, body []byte) T {
	t.Helper()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", what, res.StatusCode, body)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("answer %s: %v", body, err)
	}
	return v
}

// getLiveView asks for the view and fails unless it answers 200 with JSON.
func getLiveView(t *testing.T, query string) (UsageView, []byte) {
	t.Helper()
	return getLiveViewAt(t, caddyAdmin(), query)
}

// getLiveViewAt is getLiveView of the Caddy whose admin endpoint is on
// port admin.
func getLiveViewAt(t *testing.T, admin int, query string) (UsageView, []byte) {
	t.Helper()
	res, body := liveViewAt(t, admin, http.MethodGet, query)
	return adminAnswer[UsageView](t, "GET "+UsagePath+"?"+query, res, body), body
}

// waitLiveView asks for the view until done accepts it: token charges land
// after their response has reached the client.
func waitLiveView(t *testing.T, query string, done func(UsageView) bool) UsageView {
	t.Helper()
	return waitLiveViewAt(t, caddyAdmin(), query, done)
}

// waitLiveViewAt is waitLiveView of the Caddy whose admin endpoint is on
// port admin.
func waitLiveViewAt(t *testing.T, admin int, query string, done func(UsageView) bool) UsageView {
	t.Helper()
	var v UsageView
	eventually(t, func() error {
		var body []byte
		if v, body = getLiveViewAt(t, admin, query); !done(v) {
			return fmt.Errorf("the live view has not reached the expected state: %s", body)
		}
		return nil
	})
	return v
}

// apiError is the error answer of Caddy's admin API.
func apiError(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == "" {
		t.Fatalf("not an admin API error answer: %s", body)
	}
	return e.Error
}

// clearOfMinuteEnd waits, if needed, until a new minute has begun, so that
// the next margin lies inside one period of the sliding window and the
// estimates are whole counts. The callers' margins are 5 s, several times
// what they then take under -race on a busy 2-core machine (each well under
// a second): a test that starts in a minute's last 5 s waits for the next,
// about a twelfth of them, for 2.5 s on average.
func clearOfMinuteEnd(t *testing.T, margin time.Duration) {
	now := time.Now()
	if left := now.Truncate(time.Minute).Add(time.Minute).Sub(now); left < margin {
		time.Sleep(left + 50*time.Millisecond)
	}
}

func headerInt(t *testing.T, res *http.Response, name string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(res.Header.Get(name), 10, 64)
	if err != nil {
		t.Fatalf("%s: %q", name, res.Header.Get(name))
	}
	return n
}

func headerDuration(t *testing.T, res *http.Response, name string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(res.Header.Get(name))
	if err != nil {
		t.Fatalf("%s: %q", name, res.Header.Get(name))
	}
	return d
}

func TestAdminLiveViewAgreesWithTheHeadersOfTheLastAdmittedRequest(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t) // every response reports 7 tokens
		org := redistest.UniqueID(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.Authorization}
			scope org {http.request.header.X-Org} readable
			limit key * rpm 50 tpm 100000
			limit org * rpm 10 tpm 1000
			reserve_tokens off`))
		query := "scope=org&id=" + org
		tokensCharged := func(n float64) func(UsageView) bool {
			return func(v UsageView) bool {
				return len(v.Limits) == 1 && v.Limits[0].TPM != nil && v.Limits[0].TPM.Estimate >= n
			}
		}
		send := func() *http.Response {
			res, body := gw.do(t, "Authorization: Bearer sk-"+org, "X-Org: "+org)
			if res.StatusCode != 200 {
				t.Fatalf("%d %s", res.StatusCode, body)
			}
			return res
		}
		clearOfMinuteEnd(t, 5*time.Second)
		start := time.Now()
		send()
		send()
		// The third request's token headers must see both earlier charges.
		waitLiveView(t, query, tokensCharged(14))
		sent := time.Now()
		last := send()
		v := waitLiveView(t, query, tokensCharged(21))
		elapsed := time.Since(sent)
		if time.Now().Truncate(time.Minute) != start.Truncate(time.Minute) {
			t.Logf("a minute boundary passed during the test; the relations below still hold within %v of it", 2*time.Second)
		}

		e := v.Limits[0]
		if v.Scope != "org" || v.ID != org || e.Store != storeKind(store) || e.Source != "default" || e.Handlers != 1 || !e.Admits ||
			!slices.EqualFunc(e.Chains, [][]string{{"key", "org"}}, slices.Equal) {
			t.Fatalf("view %+v, entry %+v", v, e)
		}
		if e.Redis != strings.TrimPrefix(store, "redis ") {
			t.Errorf("redis %q, want the store's address %q", e.Redis, strings.TrimPrefix(store, "redis "))
		}

		// Requests. The header of an admitted request counts that request,
		// which the store holds by now: the view, which counts no hypothetical
		// request, shows the same remaining (not one more, not one less).
		if got := headerInt(t, last, "X-Ratelimit-Limit-Requests"); e.RPM.Limit != got || got != 10 {
			t.Errorf("rpm limit: view %d, header %d, want 10 (the org is the tightest)", e.RPM.Limit, got)
		}
		if got := headerInt(t, last, "X-Ratelimit-Remaining-Requests"); e.RPM.Remaining != got || got != 7 {
			t.Errorf("remaining requests: view %d, header %d, want both 7: the header counts the admitted request, which the view sees charged", e.RPM.Remaining, got)
		}
		if e.RPM.Estimate != 3 || e.RPM.Remaining != e.RPM.Limit-int64(e.RPM.Estimate) {
			t.Errorf("rpm estimate %v, remaining %d: want 3 requests in this minute and remaining = limit - estimate", e.RPM.Estimate, e.RPM.Remaining)
		}

		// Tokens. The header is written before the response's own tokens are
		// charged, so the view is lower by exactly those 7 tokens.
		if got := headerInt(t, last, "X-Ratelimit-Limit-Tokens"); e.TPM.Limit != got || got != 1000 {
			t.Errorf("tpm limit: view %d, header %d, want 1000", e.TPM.Limit, got)
		}
		if got := headerInt(t, last, "X-Ratelimit-Remaining-Tokens"); got != 986 || e.TPM.Remaining != got-7 {
			t.Errorf("remaining tokens: view %d, header %d: want header 1000-14 and view = header - the last response's 7 tokens", e.TPM.Remaining, got)
		}
		if e.TPM.Estimate != 21 {
			t.Errorf("tpm estimate %v, want 21", e.TPM.Estimate)
		}

		// Resets: both count down from the same end (the end of the next minute),
		// so the header's reset exceeds the view's by the time between the
		// admission and the view's reading, at most what the test measured (plus
		// a millisecond for the store clock's truncation).
		for _, c := range []struct {
			kind   string
			header string
			view   *UsageCounter
		}{{"requests", "X-Ratelimit-Reset-Requests", e.RPM}, {"tokens", "X-Ratelimit-Reset-Tokens", e.TPM}} {
			h := headerDuration(t, last, c.header)
			r, err := time.ParseDuration(c.view.Reset)
			if err != nil || r != time.Duration(c.view.ResetMillis)*time.Millisecond {
				t.Errorf("%s reset %q does not match reset_ms %d", c.kind, c.view.Reset, c.view.ResetMillis)
			}
			if d := h - r; d < 0 || d > elapsed+time.Millisecond {
				t.Errorf("%s reset: header %v, view %v: the difference %v is not within the %v between the admission and the view", c.kind, h, r, d, elapsed)
			}
			if r <= time.Minute || r > 2*time.Minute {
				t.Errorf("%s reset %v: want the time until the end of the next minute", c.kind, r)
			}
		}
	})
}

func TestAdminLiveViewDigestsAKeyIDAndNeverEchoesIt(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		secret := "sk-live-" + redistest.UniqueID(t) + "-SECRET"
		raw := "Bearer " + secret
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.Authorization}
			scope team "{http.request.header.X-Team}"
			limit key * rpm 5
			limit team * rpm 9`))
		team := "team " + redistest.UniqueID(t) + " with spaces"
		for range 2 {
			if res, body := gw.do(t, "Authorization: "+raw, "X-Team: "+team); res.StatusCode != 200 {
				t.Fatalf("%d %s", res.StatusCode, body)
			}
		}
		digest := limiter.KeyID(false, raw)
		v, body := getLiveView(t, "scope=key&id="+url.QueryEscape(raw))
		for _, s := range []string{secret, "SECRET", "Bearer", "sk-live"} {
			if strings.Contains(string(body), s) {
				t.Fatalf("the answer repeats the raw key (%q): %s", s, body)
			}
		}
		if v.ID != digest || !digestRE.MatchString(v.ID) {
			t.Fatalf("id %q, want the digest %q", v.ID, digest)
		}
		if len(v.Limits) != 1 || v.Limits[0].RPM == nil || v.Limits[0].RPM.Estimate != 2 || v.Limits[0].RPM.Remaining != 3 || v.Limits[0].TPM != nil {
			t.Fatalf("limits %s: want the key's 2 requests of 5 and no tpm", body)
		}

		// The digest (as logs, metrics and Redis keys show it) asks for the same
		// counters without the key ever being sent.
		byDigest, _ := getLiveView(t, "scope=key&digest="+url.QueryEscape(digest))
		if byDigest.ID != digest || len(byDigest.Limits) != 1 || byDigest.Limits[0].RPM.Estimate != 2 {
			t.Fatalf("by digest: %+v", byDigest)
		}

		// Outside the key scope, an id that is not a short plain token is
		// digested too, as in the store's keys.
		v, body = getLiveView(t, "scope=team&id="+url.QueryEscape(team))
		if v.ID != limiter.KeyID(false, team) || !digestRE.MatchString(v.ID) || strings.Contains(string(body), "with spaces") ||
			len(v.Limits) != 1 || v.Limits[0].RPM.Estimate != 2 {
			t.Fatalf("team view %s: want the digest %q and the team's 2 requests", body, limiter.KeyID(false, team))
		}

		// Errors never repeat the id either.
		for _, q := range []string{"scope=nosuch&id=", "scope=key&digest=" + url.QueryEscape(raw) + "&id="} {
			res, body := liveView(t, http.MethodGet, q+url.QueryEscape(raw))
			if res.StatusCode != http.StatusBadRequest || strings.Contains(string(body), "SECRET") {
				t.Fatalf("%s: %d %s", q, res.StatusCode, body)
			}
		}
	})
}

func TestAdminLiveViewListsEachHandlerWithDifferentCapsOnceAndItsStore(t *testing.T) {
	up := newUpstream(t)
	org := redistest.UniqueID(t)
	redis := redisLine(t)
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit /a* {
		%[1]s
		scope org {http.request.header.X-Org}
		limit org * rpm 10
	}
	# the same store and caps as /a: the same entry
	rolter_ratelimit /d* {
		%[1]s
		scope key {http.request.header.Authorization}
		scope org {http.request.header.X-Org}
		limit org * rpm 10
	}
	rolter_ratelimit /b* {
		%[1]s
		scope org {http.request.header.X-Org}
		limit org %[2]s rpm 20 tpm 2000
		limit org * rpm 30
		reserve_tokens off
	}
	# the same caps as /a in the in-process store: an entry of its own
	rolter_ratelimit /c* {
		scope org {http.request.header.X-Org}
		limit org * rpm 10
	}
	# no limit for this org
	rolter_ratelimit /e* {
		%[1]s
		scope org {http.request.header.X-Org}
		limit org someone-else rpm 1
	}
	reverse_proxy {upstream}`, redis, org))
	for _, path := range []string{"/a", "/a", "/b", "/c"} {
		if res, body := gw.send(t, "POST", path+"/v1/chat/completions", `{"model":"m"}`, "X-Org: "+org); res.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, res.StatusCode, body)
		}
	}
	v := waitLiveView(t, "scope=org&id="+org, func(v UsageView) bool {
		return len(v.Limits) == 3 && v.Limits[2].TPM != nil && v.Limits[2].TPM.Estimate >= 7
	})

	type summary struct {
		store, source   string
		handlers        int
		chains          string
		rpm, tpm        int64
		requests, toks  float64
		remainingRPM    int64
		hasRedisAddress bool
	}
	var got []summary
	for _, e := range v.Limits {
		s := summary{store: e.Store, source: e.Source, handlers: e.Handlers, chains: fmt.Sprint(e.Chains), hasRedisAddress: e.Redis != ""}
		if e.RPM != nil {
			s.rpm, s.requests, s.remainingRPM = e.RPM.Limit, e.RPM.Estimate, e.RPM.Remaining
		}
		if e.TPM != nil {
			s.tpm, s.toks = e.TPM.Limit, e.TPM.Estimate
		}
		got = append(got, s)
	}
	// Handlers that share a scope name and a store share its counters,
	// whatever their caps: /a, /b and /d all count the org's 3 requests
	// in Redis; the in-process store saw only /c's.
	want := []summary{
		{store: "memory", source: "default", handlers: 1, chains: "[[org]]", rpm: 10, requests: 1, remainingRPM: 9},
		{store: "redis", source: "default", handlers: 2, chains: "[[key org] [org]]", rpm: 10, requests: 3, remainingRPM: 7, hasRedisAddress: true},
		{store: "redis", source: "own", handlers: 1, chains: "[[org]]", rpm: 20, tpm: 2000, requests: 3, remainingRPM: 17, toks: 7, hasRedisAddress: true},
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Fatalf("entries\n got %+v\nwant %+v", got, want)
	}
}

func TestAdminLiveViewReadsTheInProcessStore(t *testing.T) {
	up := newUpstream(t)
	org := redistest.UniqueID(t)
	gw := startGateway(t, up.URL, `
	rolter_ratelimit {
		scope org {http.request.header.X-Org}
		limit org * rpm 4
	}
	reverse_proxy {upstream}`)
	clearOfMinuteEnd(t, 5*time.Second)
	var last *http.Response
	for range 2 {
		last, _ = gw.do(t, "X-Org: "+org)
	}
	v, body := getLiveView(t, "scope=org&id="+org)
	if len(v.Limits) != 1 {
		t.Fatalf("%s", body)
	}
	e := v.Limits[0]
	if e.Store != "memory" || e.Redis != "" || e.TPM != nil || e.RPM.Estimate != 2 || !e.Admits {
		t.Fatalf("%s", body)
	}
	if h := headerInt(t, last, "X-Ratelimit-Remaining-Requests"); e.RPM.Remaining != h || h != 2 {
		t.Fatalf("remaining: view %d, header %d, want both 2", e.RPM.Remaining, h)
	}
	for range 2 {
		gw.do(t, "X-Org: "+org)
	}
	if v, body := getLiveView(t, "scope=org&id="+org); v.Limits[0].RPM.Remaining != 0 || v.Limits[0].Admits {
		t.Fatalf("after 4 of 4 requests: %s, want remaining 0 and admits false", body)
	}
}

func TestAdminLiveViewRefusesBadQueriesAndMethodsButAnswersAnUnlimitedID(t *testing.T) {
	up := newUpstream(t)
	org := redistest.UniqueID(t)
	startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit {
		scope org {http.request.header.X-Org}
		scope team {http.request.header.X-Team}
		limit org %s rpm 5
	}
	reverse_proxy {upstream}`, org))
	for _, c := range []struct{ query, want string }{
		{"scope=nosuch&id=x", `unknown scope "nosuch": no loaded rolter_ratelimit handler has a scope of that name (known scopes: org, team)`},
		{"id=" + org, "missing scope parameter"},
		{"scope=&id=" + org, "missing scope parameter"},
		{"scope=org", "missing id parameter"},
		{"scope=org&id=", "empty id parameter"},
		{"scope=org&id=" + org + "&digest=%23" + strings.Repeat("0", 32), "give either the id parameter or the digest parameter"},
		{"scope=org&digest=" + org, `the digest parameter must be "#" and 32`},
		{"scope=org&scope=team&id=" + org, "give the scope parameter once"},
	} {
		res, body := liveView(t, http.MethodGet, c.query)
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", c.query, res.StatusCode, body)
			continue
		}
		if msg := apiError(t, body); !strings.HasPrefix(msg, c.want) {
			t.Errorf("%s: error %q, want it to start with %q", c.query, msg, c.want)
		}
	}

	res, body := liveView(t, http.MethodPost, "scope=org&id="+org)
	if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "GET" {
		t.Errorf("POST: %d (Allow %q) %s, want 405 with Allow: GET", res.StatusCode, res.Header.Get("Allow"), body)
	}
	apiError(t, body)

	// A known scope, and an id that nothing limits there: not an error.
	for _, q := range []string{"scope=org&id=someone-else", "scope=team&id=" + org} {
		v, body := getLiveView(t, q)
		if v.Limits == nil || len(v.Limits) != 0 || !strings.Contains(string(body), `"limits":[]`) || !strings.Contains(v.Note, "not limited") {
			t.Errorf("%s: %s, want 200 with an empty list and a note", q, body)
		}
	}
}

// startGatewayOnDeadRedis starts a gateway whose store is a Redis that
// nothing serves, limiting every org, and returns an org for the admin
// API to ask about, and the dead Redis's address.
func startGatewayOnDeadRedis(t *testing.T) (org, dead string) {
	t.Helper()
	dead = fmt.Sprintf("127.0.0.1:%d", freePort()) // nothing listens there
	startGateway(t, newUpstream(t).URL, fmt.Sprintf(`
	rolter_ratelimit {
		redis redis://%s
		scope org {http.request.header.X-Org}
		limit org * rpm 5
	}
	reverse_proxy {upstream}`, dead))
	return redistest.UniqueID(t), dead
}

func TestAdminLiveViewAnswers503WhenTheStoreCannotBeRead(t *testing.T) {
	org, dead := startGatewayOnDeadRedis(t)
	res, body := liveView(t, http.MethodGet, "scope=org&id="+org)
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("with Redis stopped: %d %s, want 503", res.StatusCode, body)
	}
	if msg := apiError(t, body); !strings.Contains(msg, "cannot be read") || !strings.Contains(msg, dead) {
		t.Fatalf("error %q: want it to say which store cannot be read", msg)
	}
}

// Handlers that differ in declaring a scope readable store its ids apart:
// the view reads each as that handler stores it, and names the id in the
// clear only where every handler declares the scope readable.
func TestAdminLiveViewReadsEachHandlersStoredFormOfTheID(t *testing.T) {
	up := newUpstream(t)
	org := redistest.UniqueID(t)
	gw := startGateway(t, up.URL, `
	rolter_ratelimit /readable* {
		scope org {http.request.header.X-Org} readable
		limit org * rpm 10
	}
	rolter_ratelimit /secret* {
		scope org {http.request.header.X-Org}
		limit org * rpm 10
	}
	reverse_proxy {upstream}`)
	for _, path := range []string{"/readable", "/secret", "/secret"} {
		if res, body := gw.send(t, "GET", path, "", "X-Org: "+org); res.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, res.StatusCode, body)
		}
	}
	digest := limiter.KeyID(false, org)
	v, body := getLiveView(t, "scope=org&id="+org)
	got := fmt.Sprint(v.ID == digest, len(v.Limits))
	for _, e := range v.Limits {
		got += fmt.Sprintf(" %s=%v", map[bool]string{true: "raw", false: e.ID}[e.ID == org], e.RPM.Estimate)
	}
	if want := fmt.Sprintf("true 2 %s=2 raw=1", digest); got != want {
		t.Fatalf("view %s\n got %s\nwant %s", body, got, want)
	}
}

// The live view shows a cap on requests in flight with the slots held now:
// one more for each request admitted, one less as each ends.
func TestAdminLiveViewShowsTheSlotsHeldOfACapOnRequestsInFlight(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		team := redistest.UniqueID(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope team {http.request.header.X-Team} readable
			limit team * concurrent 3`))
		_, finish := heldBurst(t, flightClient(t), []string{gw.url}, up, 2, "X-Team: "+team)
		v, body := getLiveView(t, "scope=team&id="+team)
		if len(v.Limits) != 1 || v.Limits[0].Store != storeKind(store) {
			t.Fatalf("%s", body)
		}
		if c := v.Limits[0].Concurrent; c == nil || *c != (UsageSlots{Limit: 3, InFlight: 2, Remaining: 1}) || !v.Limits[0].Admits {
			t.Fatalf("with 2 of 3 requests in flight: %s", body)
		}
		finish()
		waitLiveView(t, "scope=team&id="+team, func(v UsageView) bool {
			return *v.Limits[0].Concurrent == UsageSlots{Limit: 3, InFlight: 0, Remaining: 3}
		})
	})
}

// Whatever a scope is called, its ids are digested; only a scope declared
// readable keeps a short plain id as it is.
func TestEveryIDIsDigestedUnlessItsScopeIsReadable(t *testing.T) {
	legacyKey := "sk-" + strings.Repeat("aB3", 16) // a 51-character OpenAI key: a plain token
	for _, id := range []string{legacyKey, "alice@example.com", "acme", "42", "has space", strings.Repeat("x", 65)} {
		got := limiter.KeyID(false, id)
		if !digestRE.MatchString(got) || strings.Contains(got, id) {
			t.Errorf("secret scope: %q is stored as %q, want its digest", id, got)
		}
		if readable := limiter.KeyID(true, id); limiter.IsPlainID(id) && readable != id || !limiter.IsPlainID(id) && readable != got {
			t.Errorf("readable scope: %q is stored as %q", id, readable)
		}
	}
	if limiter.KeyID(true, "acme") != "acme" || limiter.KeyID(true, legacyKey) != legacyKey {
		t.Fatal("a readable scope's short plain ids are written as they are")
	}
}
