package ratelimit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

func TestSCGHeadersAndCustomStatusOnBucketAndRPMRefusals(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		org := redistest.UniqueID(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.Authorization}
			scope org {http.request.header.X-Org}
			limit key * rate 0.001 burst 3
			limit org * rpm 4 rate 100 burst 50 cost 2
			status 420
			headers scg openai`))
		first, second := "Authorization: Bearer sk-a-"+org, "Authorization: Bearer sk-b-"+org
		scg := func(res *http.Response) string {
			return fmt.Sprintf("remaining=%s burst=%s rate=%s requested=%s",
				res.Header.Get("X-RateLimit-Remaining"), res.Header.Get("X-RateLimit-Burst-Capacity"),
				res.Header.Get("X-RateLimit-Replenish-Rate"), res.Header.Get("X-RateLimit-Requested-Tokens"))
		}
		// The key's bucket (3, at a token per 1000 s) has the fewest tokens left.
		for i, left := range []string{"2", "1", "0"} {
			res, body := gw.do(t, first, "X-Org: "+org)
			if res.StatusCode != 200 {
				t.Fatalf("request %d: %d %s", i+1, res.StatusCode, body)
			}
			if got, want := scg(res), "remaining="+left+" burst=3 rate=0.001 requested=1"; got != want {
				t.Fatalf("request %d: %s, want %s", i+1, got, want)
			}
		}

		// The key's bucket refuses: the custom status, Spring's 0, and the exact
		// wait for one token.
		res, body := gw.do(t, first, "X-Org: "+org)
		if res.StatusCode != 420 {
			t.Fatalf("bucket refusal: %d %s, want the configured 420", res.StatusCode, body)
		}
		if got, want := scg(res), "remaining=0 burst=3 rate=0.001 requested=1"; got != want {
			t.Fatalf("bucket refusal: %s, want %s", got, want)
		}
		var e openAIError
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type != "requests" || e.Error.Code != "rate_limit_exceeded" ||
			!strings.Contains(e.Error.Message, "key: burst capacity 3, refilled at 0.001 per second") {
			t.Fatalf("bucket refusal body %s (%v)", body, err)
		}
		if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); ra < 999 || ra > 1000 {
			t.Fatalf("Retry-After %q, want the 1000 s a token takes at 0.001 per second", res.Header.Get("Retry-After"))
		}
		// The live view shows the empty bucket with the headers' definitions.
		v, view := getLiveView(t, "scope=key&digest="+url.QueryEscape(limiter.KeyID(false, "Bearer sk-a-"+org)))
		if len(v.Limits) != 1 || v.Limits[0].Admits || v.Limits[0].Bucket == nil {
			t.Fatalf("live view %s: want one limit, refusing, with its bucket", view)
		}
		if b := v.Limits[0].Bucket; b.BurstCapacity != 3 || b.ReplenishRate != "0.001" || b.RequestedTokens != 1 || b.Remaining != 0 ||
			b.FullMillis <= 2_900_000 || b.FullMillis > 3_000_000 {
			t.Fatalf("live view of the bucket %+v: want empty, full again in 3000 s", *b)
		}

		// A second key of the org fills the org's rpm 4, and then the rpm refuses:
		// the same status, and the scg headers still describe the tightest bucket
		// with what it holds, as Spring's script returns it: the second key's 2,
		// which the refused request did not take.
		if res, body := gw.do(t, second, "X-Org: "+org); res.StatusCode != 200 {
			t.Fatalf("second key: %d %s", res.StatusCode, body)
		}
		res, body = gw.do(t, second, "X-Org: "+org)
		if res.StatusCode != 420 || !strings.Contains(body, "Rate limit reached for org: limit 4 RPM") {
			t.Fatalf("rpm refusal: %d %s, want 420 from the org's rpm", res.StatusCode, body)
		}
		if got, want := scg(res), "remaining=2 burst=3 rate=0.001 requested=1"; got != want {
			t.Fatalf("rpm refusal: %s, want %s", got, want)
		}
		if got := res.Header.Get("X-Ratelimit-Remaining-Requests"); got != "0" {
			t.Fatalf("x-ratelimit-remaining-requests %q beside the scg headers, want 0", got)
		}
		if n := up.hits.Load(); n != 4 {
			t.Fatalf("the upstream saw %d requests, want the 4 admitted", n)
		}
	})
}

func TestCustomStatusLeavesTheOutage503Alone(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit {
		redis redis://127.0.0.1:%d
		scope key {http.request.header.Authorization}
		limit key * rate 1 burst 1
		on_redis_error deny
		status 420
	}
	reverse_proxy {upstream}`, freePort()))
	if res, body := gw.do(t, "Authorization: Bearer sk-x"); res.StatusCode != 503 || !strings.Contains(body, "rate_limiter_unavailable") {
		t.Fatalf("with no Redis: %d %s, want on_redis_error's 503", res.StatusCode, body)
	}
}

// When the store cannot answer and the request fails open, Spring sends
// X-RateLimit-Remaining -1 with the bucket's three other headers
// (RedisRateLimiterUnitTests.shouldReturnHeadersWhenRedisIssueOccurs); the
// other families have nothing to say without counters and send nothing.
func TestFailedOpenRequestCarriesSpringsRemainingMinusOne(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Remaining", "77") // the upstream's own, replaced with scg
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	}))
	t.Cleanup(up.Close)
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit /scg* {
		redis redis://127.0.0.1:%[1]d
		scope key {http.request.header.Authorization}
		scope org {http.request.header.X-Org}
		limit key * rate 1 burst 5 cost 2
		limit org * rate 10 burst 100 rpm 50
		headers scg
	}
	rolter_ratelimit /openai* {
		redis redis://127.0.0.1:%[1]d
		scope key {http.request.header.Authorization}
		limit key * rate 1 burst 5 cost 2 rpm 50
		headers openai ietf
	}
	reverse_proxy {upstream}`, freePort()))
	res, body := gw.send(t, "GET", "/scg", "", "Authorization: Bearer sk-x", "X-Org: acme")
	if res.StatusCode != 200 {
		t.Fatalf("with no Redis: %d %s, want the request failed open", res.StatusCode, body)
	}
	got := fmt.Sprint(res.Header.Values("X-RateLimit-Remaining"), res.Header.Values("X-RateLimit-Burst-Capacity"),
		res.Header.Values("X-RateLimit-Replenish-Rate"), res.Header.Values("X-RateLimit-Requested-Tokens"))
	if got != "[-1] [5] [1] [2]" { // the key's bucket: the least left after a request when all are full
		t.Fatalf("scg headers of a failed-open request: %s, want [-1] [5] [1] [2]", got)
	}
	res, _ = gw.send(t, "GET", "/openai", "", "Authorization: Bearer sk-x")
	if res.StatusCode != 200 || res.Header.Get("X-Ratelimit-Limit-Requests") != "" || res.Header.Get("Ratelimit") != "" ||
		!slices.Equal(res.Header.Values("X-Ratelimit-Remaining"), []string{"77"}) {
		t.Fatalf("openai and ietf on a failed-open request: %d %v, want only the upstream's own headers", res.StatusCode, res.Header)
	}
}
