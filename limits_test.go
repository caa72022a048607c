package ratelimit

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// A day cap refuses in its own window: the refusal names it (message,
// placeholders, metric), waits until the day's requests weigh less than
// the cap in the trailing 24 hours, and its headers describe a window of
// 86400 s.
func TestADailyCapRefusesNamingItsWindowAndWaitsForItsRelease(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		key := redistest.UniqueID(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rpm 100 rpd 2
			headers openai ietf
			on_refusal error`, `
		handle_errors {
			respond "{http.rolter_ratelimit.refused_kind} per {http.rolter_ratelimit.refused_window}, cap {http.rolter_ratelimit.refused_limit}: {err.message}" {err.status_code}
		}`))
		metric := `caddy_rolter_ratelimit_refusals_total{kind="requests",scope="key",shadow="false",window="day"}`
		before := scrape(t)[metric]
		dayBefore := time.Now().Unix() / 86_400
		first, _ := gw.do(t, "X-Api-Key: "+key)
		if first.StatusCode != 200 {
			t.Fatalf("first request: %d", first.StatusCode)
		}
		if got := first.Header.Get("RateLimit-Policy"); got != `"requests";q=100;w=60, "requests_per_day";q=2;w=86400` {
			t.Errorf("RateLimit-Policy %q: want the minute and the day window", got)
		}
		if got := first.Header.Get("RateLimit"); !strings.Contains(got, `"requests_per_day";r=1;t=`) {
			t.Errorf("RateLimit %q: want 1 request left today", got)
		}
		if l, r := first.Header.Get("X-Ratelimit-Limit-Requests"), first.Header.Get("X-Ratelimit-Remaining-Requests"); l != "2" || r != "1" {
			t.Errorf("x-ratelimit-*-requests %s/%s: want the tightest window, the day's 2 with 1 left", l, r)
		}
		gw.do(t, "X-Api-Key: "+key)
		refused, body := gw.do(t, "X-Api-Key: "+key)
		secondsIntoDay := time.Now().Unix() % 86_400
		if refused.StatusCode != 429 || !strings.HasPrefix(body, "requests per day, cap 2: Rate limit reached for key: limit 2 RPD (requests per day).") {
			t.Fatalf("third request: %d %q", refused.StatusCode, body)
		}
		retry, err := strconv.ParseInt(refused.Header.Get("Retry-After"), 10, 64)
		if err != nil {
			t.Fatalf("Retry-After %q", refused.Header.Get("Retry-After"))
		}
		if refused.Header.Get("X-Should-Retry") != "false" {
			t.Error("a wait of hours comes without x-should-retry false: the Anthropic SDKs would sleep it out, the OpenAI SDKs retry at once")
		}
		// Both requests of today weigh 1 once half of tomorrow has passed.
		if time.Now().Unix()/86_400 == dayBefore {
			want := 86_400 - secondsIntoDay + 43_200
			if retry < want-1 || retry > want+1 {
				t.Errorf("Retry-After %d s, want %d: until 12:00 tomorrow", retry, want)
			}
		} else if retry > 86_400 {
			t.Errorf("Retry-After %d s across midnight, want at most a day", retry)
		}
		if got := scrape(t)[metric]; got != before+1 {
			t.Errorf("%s = %v, want %v", metric, got, before+1)
		}
	})
}

// The live view shows every window a limit caps, the day windows with
// their own reset.
func TestLiveViewShowsTheDayAndTokenKindWindows(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		org := redistest.UniqueID(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope org {http.request.header.X-Org} readable
			limit org * rpm 10 rpd 1000 tpd 50000 itpm 4000 otpm 2000
			reserve_tokens off`))
		if res, _ := gw.do(t, "X-Org: "+org); res.StatusCode != 200 {
			t.Fatalf("status %d", res.StatusCode)
		}
		v, body := getLiveView(t, "scope=org&id="+org)
		if len(v.Limits) != 1 {
			t.Fatalf("live view %s", body)
		}
		l := v.Limits[0]
		if l.RPM == nil || l.RPD == nil || l.TPD == nil || l.ITPM == nil || l.OTPM == nil || l.TPM != nil || l.ITPD != nil || l.OTPD != nil {
			t.Fatalf("live view %s: want exactly rpm, rpd, tpd, itpm and otpm", body)
		}
		if l.RPD.Limit != 1000 || l.RPD.Estimate != 1 || l.RPD.Remaining != 999 {
			t.Errorf("rpd %+v: want 1 of 1000 used", *l.RPD)
		}
		// The request counts until the end of tomorrow.
		if reset := time.Duration(l.RPD.ResetMillis) * time.Millisecond; reset <= 24*time.Hour || reset > 48*time.Hour {
			t.Errorf("rpd resets in %v, want the end of tomorrow", reset)
		}
		if l.ITPM.Limit != 4000 || l.OTPM.Limit != 2000 || l.TPD.Limit != 50000 {
			t.Errorf("token windows %s", body)
		}
	})
}

// A reservation is too large when a part of it exceeds the window of its
// kind: the refusal names that window, and an uncapped request's default
// output is trimmed to fit instead.
func TestAnOutputCapOverTheOTPMIsTooLargeWhileAnUncappedRequestFits(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope org {http.request.header.X-Org}
			limit org * itpm 100000 otpm 800`))
		org := "X-Org: " + redistest.UniqueID(t)
		res, body := gw.postChat(t, `{"model":"gpt-4o","max_tokens":900,"messages":[{"role":"user","content":"hi"}]}`, org)
		if res.StatusCode != 429 || res.Header.Get("X-Should-Retry") != "false" ||
			!strings.Contains(string(body), "Request too large for org on output tokens per min (OTPM): Limit 800, Requested 900.") {
			t.Fatalf("%d %s, want a request too large for the otpm", res.StatusCode, body)
		}
		// No max_tokens: the default 1024 of output is reserved as the 800 that fit.
		if res, body := gw.postChat(t, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, org); res.StatusCode != 200 {
			t.Fatalf("uncapped request: %d %s", res.StatusCode, body)
		}
	})
}

// A JSON config can give what the Caddyfile cannot write, a negative cap:
// Validate names the limit and the cap.
func TestJSONValidationRejectsANegativeWindowCap(t *testing.T) {
	var h Handler
	if err := json.Unmarshal([]byte(`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"*","rpm":5,"otpd":-1}]}`), &h); err != nil {
		t.Fatal(err)
	}
	err := h.Validate()
	if err == nil || err.Error() != `limit for scope "key" id "*": otpd must be a positive integer of at most 100000000000, not -1` {
		t.Fatalf("Validate: %v", err)
	}
}

// A JSON config's negative cap on requests in flight fails Validate naming
// the limit, as a negative window cap does.
func TestJSONValidationRejectsANegativeConcurrencyCap(t *testing.T) {
	var h Handler
	if err := json.Unmarshal([]byte(`{"scopes":[{"name":"key","value":"x"}],"limits":[{"scope":"key","id":"*","concurrent":-1}]}`), &h); err != nil {
		t.Fatal(err)
	}
	err := h.Validate()
	if err == nil || err.Error() != `limit for scope "key" id "*": concurrent must be a positive integer of at most 100000000000, not -1` {
		t.Fatalf("Validate: %v", err)
	}
}

// newLimit is a per-minute limit without a hash tag, as the handler builds
// it of a line with rpm and tpm.
func newLimit(scope, id string, perMinute, tokensPerMinute int64) limiter.Limit {
	return limiter.NewLimit("", scope, id, limiter.CapsOfWindows(limiter.WindowCaps{limiter.RPM: perMinute, limiter.TPM: tokensPerMinute}))
}

// capsLimit is the limit without a hash tag of a configured line's caps.
func capsLimit(t testing.TB, line LimitConfig) limiter.Limit {
	t.Helper()
	caps, err := line.caps()
	if err != nil {
		t.Fatal(err)
	}
	return limiter.NewLimit("", line.Scope, line.ID, caps)
}
