package ratelimit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// checkRefusal describes what is wrong with a refusal by the key's rpm 1,
// or is "".
func checkRefusal(res *http.Response, body []byte) string {
	if res.StatusCode != http.StatusTooManyRequests {
		return fmt.Sprintf("status %d %s", res.StatusCode, body)
	}
	ra, err := strconv.ParseInt(res.Header.Get("Retry-After"), 10, 64)
	if err != nil || ra < 1 || ra > 120 {
		return fmt.Sprintf("Retry-After %q", res.Header.Get("Retry-After"))
	}
	ms, err := strconv.ParseInt(res.Header.Get("Retry-After-Ms"), 10, 64)
	if err != nil || limiter.CeilSeconds(ms, 1) != ra {
		return fmt.Sprintf("Retry-After-Ms %q with Retry-After %d", res.Header.Get("Retry-After-Ms"), ra)
	}
	var e openAIError
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Type != "requests" || e.Error.Code != "rate_limit_exceeded" ||
		e.Error.Param != nil || e.Error.Message != fmt.Sprintf("Rate limit reached for key: limit 1 RPM (requests per minute). Please try again in %ds.", ra) {
		return fmt.Sprintf("body %s", body)
	}
	if got := res.Header.Get("X-Ratelimit-Remaining-Requests"); got != "0" {
		return fmt.Sprintf("X-Ratelimit-Remaining-Requests %q", got)
	}
	return ""
}

func TestHammeredKeyCostsRedisUnderACallPerHundredRefusalsAndARaisedCapAdmitsAtOnce(t *testing.T) {
	srv := redistest.NewServer(t) // its own, so that every script it runs is this test's
	up := newUpstream(t)
	site := func(rpm int) string {
		return fmt.Sprintf(`
	handle /plain/* {
		reverse_proxy {upstream}
	}
	handle {
		rolter_ratelimit {
			redis %s
			scope key {http.request.header.Authorization}
			limit key * rpm %d
		}
		reverse_proxy {upstream}
	}`, srv.URL(), rpm)
	}
	gw := startGatewayWith(t, up.URL, "", site(1), 0)
	key := "Authorization: Bearer sk-" + redistest.UniqueID(t)
	if res, body := gw.do(t, key); res.StatusCode != 200 {
		t.Fatalf("first request: %d %s", res.StatusCode, body)
	}

	const clients, hammer = 8, 2000
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	send := func(path string, headers ...string) (*http.Response, []byte, time.Duration, error) {
		req, err := http.NewRequest("POST", gw.url+path, strings.NewReader(`{"model":"m"}`))
		if err != nil {
			return nil, nil, 0, err
		}
		setHeaders(req, headers)
		start := time.Now()
		res, err := client.Do(req)
		if err != nil {
			return nil, nil, 0, err
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		return res, body, time.Since(start), err
	}
	before := redistest.ScriptCalls(t, srv.URL())
	var wrong atomic.Int64
	var firstWrong atomic.Value
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < hammer/clients; i++ {
				res, body, _, err := send("/v1/chat/completions", key)
				problem := ""
				if err != nil {
					problem = err.Error()
				} else {
					problem = checkRefusal(res, body)
				}
				if problem != "" && wrong.Add(1) == 1 {
					firstWrong.Store(problem)
				}
			}
		}()
	}
	wg.Wait()
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d of %d answers are not the key's refusal; the first: %s", n, hammer, firstWrong.Load())
	}
	calls := redistest.ScriptCalls(t, srv.URL()) - before
	t.Logf("%d refusals cost Redis %d script calls: %.4f per refusal", hammer, calls, float64(calls)/hammer)
	if calls*100 > hammer {
		t.Fatalf("%d refusals cost Redis %d script calls, want at most one per hundred", hammer, calls)
	}

	// Refusals are served at least as fast as the proxy serves admissions:
	// the same client alternates between the two, so that both see the
	// same load.
	var refused, proxied []time.Duration
	for i := 0; i < 300; i++ {
		res, body, took, err := send("/v1/chat/completions", key)
		if err != nil || checkRefusal(res, body) != "" {
			t.Fatalf("refusal %d: %v %s", i, err, body)
		}
		refused = append(refused, took)
		if res, _, took, err = send("/plain/v1/chat/completions"); err != nil || res.StatusCode != 200 {
			t.Fatalf("plain proxy request %d: %v", i, err)
		}
		proxied = append(proxied, took)
	}
	slices.Sort(refused)
	slices.Sort(proxied)
	t.Logf("median latency: %v per refusal from the cache, %v per admission by the plain proxy", refused[len(refused)/2], proxied[len(proxied)/2])
	if refused[len(refused)/2] > proxied[len(proxied)/2] {
		t.Errorf("refusals (median %v) are slower than the plain proxy's admissions (median %v)", refused[len(refused)/2], proxied[len(proxied)/2])
	}

	// The cache is keyed by the caps: the raised cap is the store's to decide.
	gw = startGatewayWith(t, up.URL, "", site(3), gw.port)
	if res, body := gw.do(t, key); res.StatusCode != 200 || res.Header.Get("X-Ratelimit-Limit-Requests") != "3" {
		t.Fatalf("first request after raising rpm to 3: %d %s, limit %q", res.StatusCode, body, res.Header.Get("X-Ratelimit-Limit-Requests"))
	}
}

func TestCachedOrgRefusalAnswersAnotherKeyOfTheOrgWithoutARedisCall(t *testing.T) {
	srv := redistest.NewServer(t)
	up := newUpstream(t)
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit {
		redis %s
		scope key {http.request.header.Authorization}
		scope org {http.request.header.X-Org}
		limit key * rpm 100
		limit org * rpm 2
	}
	reverse_proxy {upstream}`, srv.URL()))
	org := "X-Org: " + redistest.UniqueID(t)
	key := func() string { return "Authorization: Bearer sk-" + redistest.UniqueID(t) }
	for i := 0; i < 2; i++ {
		if res, body := gw.do(t, key(), org); res.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i+1, res.StatusCode, body)
		}
	}
	if res, body := gw.do(t, key(), org); res.StatusCode != 429 || !strings.Contains(body, "for org") {
		t.Fatalf("third key of the org: %d %s, want the org's refusal", res.StatusCode, body)
	}
	before, metrics := redistest.ScriptCalls(t, srv.URL()), scrape(t)
	res, body := gw.do(t, key(), org)
	if res.StatusCode != 429 || !strings.Contains(body, "for org: limit 2 RPM") {
		t.Fatalf("fourth key of the org: %d %s, want the org's refusal", res.StatusCode, body)
	}
	if calls := redistest.ScriptCalls(t, srv.URL()) - before; calls != 0 {
		t.Fatalf("the fourth key's refusal cost Redis %d script calls, want none", calls)
	}
	if limit, left := res.Header.Get("X-Ratelimit-Limit-Requests"), res.Header.Get("X-Ratelimit-Remaining-Requests"); limit != "2" || left != "0" {
		t.Errorf("x-ratelimit-limit-requests %q, remaining %q: want the org's 2 and 0", limit, left)
	}
	after := scrape(t)
	for name, want := range map[string]float64{
		`caddy_rolter_ratelimit_refusals_cached_total`:                                                      1,
		`caddy_rolter_ratelimit_refusals_total{kind="requests",scope="org",shadow="false",window="minute"}`: 1,
		`caddy_rolter_ratelimit_admissions_total{outcome="refused"}`:                                        1,
	} {
		if got := after[name] - metrics[name]; got != want {
			t.Errorf("%s went up by %v, want %v", name, got, want)
		}
	}
	if res, body := gw.do(t, key(), "X-Org: "+redistest.UniqueID(t)); res.StatusCode != 200 {
		t.Fatalf("a key of another org: %d %s", res.StatusCode, body)
	}
	if calls := redistest.ScriptCalls(t, srv.URL()) - before; calls != 1 {
		t.Fatalf("a key of another org cost Redis %d script calls, want its admission's one", calls)
	}
}
