package ratelimit

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// standInProvider is an LLM provider with its own quota, as OpenAI and
// Anthropic keep one per organisation (or workspace) and model: a bucket
// of requests that refills continuously, full in window. It keeps one
// quota per organisation, named by the request's X-Org header. Each
// answer carries the rate-limit headers its dialect sends (X-Dialect:
// "openai", OpenAI's x-ratelimit-* with resets as Go durations; or
// "anthropic", Anthropic's anthropic-ratelimit-* with resets as RFC 3339
// moments, to the second); a request the bucket cannot take gets 429 with
// the wait until it can (retry-after-ms for OpenAI, retry-after in whole
// seconds for Anthropic), and counts in refused. A request whose
// X-Refuse-Ms header asks for it is refused with that retry-after-ms, and
// one whose X-Refuse-Gemini asks for it as Gemini refuses: the wait (a
// protobuf duration such as "45s") only in its body's RetryInfo.
type standInProvider struct {
	limit  int64
	window time.Duration

	mu     sync.Mutex
	orgs   map[string]*providerQuota
	counts map[string]*providerCounts
}

type providerQuota struct {
	level float64 // requests in the bucket as of at
	at    time.Time
}

// providerCounts are what the provider did for one organisation.
type providerCounts struct {
	served, refused atomic.Int64
	first, last     atomic.Int64 // unix nanoseconds of the first and last request
}

func newStandInProvider(limit int64, window time.Duration) *standInProvider {
	return &standInProvider{limit: limit, window: window, orgs: make(map[string]*providerQuota), counts: make(map[string]*providerCounts)}
}

// of is what the provider did for org.
func (p *standInProvider) of(org string) *providerCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.counts[org]
	if !ok {
		c = new(providerCounts)
		p.counts[org] = c
	}
	return c
}

// take takes a request from org's bucket, if it holds one, and says what
// it holds then and how long until it is full again, or until it holds a
// request.
func (p *standInProvider) take(org string, now time.Time) (ok bool, remaining int64, untilFull, untilOne time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q, known := p.orgs[org]
	if !known {
		q = &providerQuota{level: float64(p.limit), at: now}
		p.orgs[org] = q
	}
	perNano := float64(p.limit) / float64(p.window)
	q.level = math.Min(float64(p.limit), q.level+perNano*float64(now.Sub(q.at)))
	q.at = now
	if ok = q.level >= 1; ok {
		q.level--
	}
	return ok, int64(q.level), time.Duration((float64(p.limit) - q.level) / perNano), time.Duration(math.Max(1-q.level, 0) / perNano)
}

func (p *standInProvider) mode(_ *fakeUpstream, w http.ResponseWriter, r *http.Request) {
	now, org := time.Now(), r.Header.Get("X-Org")
	counts := p.of(org)
	counts.first.CompareAndSwap(0, now.UnixNano())
	counts.last.Store(now.UnixNano())
	h := w.Header()
	if ms := r.Header.Get("X-Refuse-Ms"); ms != "" {
		counts.refused.Add(1)
		h.Set("retry-after-ms", ms)
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"message":"stand-in provider: slow down","type":"requests","code":"rate_limit_exceeded"}}`)
		return
	}
	if delay := r.Header.Get("X-Refuse-Gemini"); delay != "" {
		counts.refused.Add(1)
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, `{"error":{"code":429,"message":"stand-in provider: quota exceeded","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":%q}]}}`, delay)
		return
	}
	ok, remaining, untilFull, untilOne := p.take(org, now)
	limit := strconv.FormatInt(p.limit, 10)
	anthropic := r.Header.Get("X-Dialect") == "anthropic"
	if anthropic {
		h.Set("anthropic-ratelimit-requests-limit", limit)
		h.Set("anthropic-ratelimit-requests-remaining", strconv.FormatInt(remaining, 10))
		h.Set("anthropic-ratelimit-requests-reset", now.Add(untilFull).Truncate(time.Second).Add(time.Second).UTC().Format(time.RFC3339))
	} else {
		h.Set("x-ratelimit-limit-requests", limit)
		h.Set("x-ratelimit-remaining-requests", strconv.FormatInt(remaining, 10))
		h.Set("x-ratelimit-reset-requests", untilFull.Round(time.Millisecond).String())
	}
	if !ok {
		counts.refused.Add(1)
		if anthropic {
			h.Set("retry-after", strconv.FormatInt(int64(math.Ceil(untilOne.Seconds())), 10))
		} else {
			h.Set("retry-after-ms", strconv.FormatInt(untilOne.Milliseconds()+1, 10))
		}
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"message":"stand-in provider: quota exceeded","type":"requests","code":"rate_limit_exceeded"}}`)
		return
	}
	counts.served.Add(1)
	h.Set("Content-Type", "application/json")
	io.WriteString(w, chatCompletion)
}

// providerSite is a gateway's routes, by the X-Route header: each a
// handler on store (a redis line, or "" in process) whose key scope and
// provider scope (the org) are the request's, the provider's limit with
// caps far above the provider's quota, learning it or not, and with the
// extra lines.
func providerSite(store string, routes map[string]string) string {
	var site strings.Builder
	for route, lines := range routes {
		fmt.Fprintf(&site, "\t@%s header X-Route %[1]s\n\thandle @%[1]s {\n%s\t}\n", route, limited(flightStore(store), `
			scope key {http.request.header.X-Api-Key}
			scope provider {http.request.header.X-Org} readable
			limit key * rpm 100000
			on_redis_error deny
			`+lines))
	}
	return site.String()
}

// sendSteadily has keys clients send requests of org through the gateways
// (key i through gateway i mod len(gateways)) for d, each as an SDK does:
// its next request as soon as one is answered, after the Retry-After-Ms of
// a refusal, the gateway's or the provider's. It counts what the clients
// saw.
func sendSteadily(t *testing.T, gateways []string, route, dialect, org string, keys int, d time.Duration) (refusedByGateway, refusedByProvider int64) {
	t.Helper()
	var byGateway, byProvider atomic.Int64
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := range keys {
		key := redistest.UniqueID(t)
		wg.Go(func() {
			for time.Now().Before(end) {
				res, body, err := postChat(gateways[i%len(gateways)], "X-Api-Key", key, "X-Org", org, "X-Route", route, "X-Dialect", dialect)
				if err != nil {
					t.Error(err)
					return
				}
				if res.StatusCode == http.StatusOK {
					continue
				}
				if res.StatusCode != http.StatusTooManyRequests {
					t.Errorf("%d %s", res.StatusCode, body)
					return
				}
				wait := retryAfterOf(res)
				if strings.Contains(string(body), "stand-in provider") {
					byProvider.Add(1)
				} else {
					byGateway.Add(1)
				}
				time.Sleep(min(wait, time.Until(end)))
			}
		})
	}
	wg.Wait()
	return byGateway.Load(), byProvider.Load()
}

// postChat sends a small chat completion to gateway with headers (names
// and values, in turn), as the load tests' clients do, and reads its
// answer.
func postChat(gateway string, headers ...string) (*http.Response, []byte, error) {
	req, err := http.NewRequest("POST", gateway+"/v1/chat/completions", strings.NewReader(`{"model":"m","max_tokens":10}`))
	if err != nil {
		return nil, nil, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return res, body, err
}

// retryAfterOf is a refusal's wait as an SDK reads it: retry-after-ms,
// else retry-after in seconds.
func retryAfterOf(res *http.Response) time.Duration {
	if ms, err := strconv.ParseFloat(res.Header.Get("Retry-After-Ms"), 64); err == nil {
		return time.Duration(ms * float64(time.Millisecond))
	}
	s, _ := strconv.ParseInt(res.Header.Get("Retry-After"), 10, 64)
	return time.Duration(s) * time.Second
}

// The provider's quota, learned from its answers and shared by every
// gateway through Redis, lets at most one of its refusals reach a client
// per gateway, and is used to at least 90%: three gateway processes whose
// provider limit caps far above the provider's real quota (300 requests,
// refilled continuously over 30 s) take it from six keys sending
// steadily, with OpenAI's headers and with Anthropic's, and with wait 5s
// no client is refused at all, with either. Without learn the same run gets many of the
// provider's refusals.
func TestGatewaysThatLearnTheProvidersQuotaLetAtMostOneOfItsRefusalsThroughEach(t *testing.T) {
	url := redistest.EnvURL(t)
	provider := newStandInProvider(300, 30*time.Second)
	up := newFakeUpstream(t, provider.mode)
	gws := startCaddyProcesses(t, 3, up, providerSite("redis "+url, map[string]string{
		"learn": "limit provider * rpm 100000 learn",
		"wait":  "limit provider * rpm 100000 learn\nwait 5s",
		"blind": "limit provider * rpm 100000",
	}))
	gateways := urlsOf(gws)
	const run = 6 * time.Second
	// The five runs are of five orgs, each the provider's quota of its
	// own: they run at once, as independent as one after another (the
	// gateways serve about 10 requests a second for each learning run),
	// in a fifth of the time.
	t.Run("steadily", func(t *testing.T) {
		for _, c := range []struct {
			route, dialect string
			waits          bool
		}{
			{"learn", "openai", false},
			{"learn", "anthropic", false},
			{"wait", "openai", true},
			{"wait", "anthropic", true},
		} {
			t.Run(c.route+"/"+c.dialect, func(t *testing.T) {
				t.Parallel()
				org := redistest.UniqueID(t)
				byGateway, byProvider := sendSteadily(t, gateways, c.route, c.dialect, org, 6, run)
				counts := provider.of(org)
				elapsed := time.Duration(counts.last.Load() - counts.first.Load())
				capacity := float64(provider.limit) + float64(provider.limit)*elapsed.Seconds()/provider.window.Seconds()
				used := float64(counts.served.Load()) / capacity
				t.Logf("%v: served %d of a capacity of %.0f (%.1f%%); the provider refused %d, the gateways %d", elapsed, counts.served.Load(), capacity, 100*used, counts.refused.Load(), byGateway)
				if refused := counts.refused.Load(); refused > int64(len(gws)) || byProvider != refused {
					t.Errorf("the provider refused %d requests, %d of which reached a client; want at most one per gateway, %d", refused, byProvider, len(gws))
				}
				if used < 0.9 {
					t.Errorf("the provider's quota was used to %.1f%%, want at least 90%%", 100*used)
				}
				if c.waits && byGateway > 0 {
					t.Errorf("with wait 5s, the gateways refused %d requests that waiting would have admitted", byGateway)
				}
			})
		}
		t.Run("without learn", func(t *testing.T) {
			t.Parallel()
			org := redistest.UniqueID(t)
			_, byProvider := sendSteadily(t, gateways, "blind", "openai", org, 6, 3*time.Second)
			if byProvider < 10 {
				t.Errorf("without learn, %d of the provider's refusals reached clients; the run is meant to drive it past its quota", byProvider)
			}
			t.Logf("without learn: the provider refused %d, all of which reached clients", byProvider)
		})
	})
	// A provider's refusal pauses its quota on every gateway until the end
	// of the wait it gave, which each gateway's refusal announces to the
	// millisecond.
	t.Run("a provider refusal pauses every gateway", func(t *testing.T) {
		org := redistest.UniqueID(t)
		send := func(gateway string, header ...string) (*http.Response, string) {
			req, _ := http.NewRequest("POST", gateway+"/v1/chat/completions", strings.NewReader(`{"model":"m","max_tokens":10}`))
			setHeaders(req, append(header, "X-Api-Key: "+redistest.UniqueID(t), "X-Org: "+org, "X-Route: learn"))
			res, body := mustDo(t, http.DefaultClient, req)
			return res, string(body)
		}
		res, body := send(gateways[0], "X-Refuse-Ms: 1500")
		refusedAt := time.Now()
		if res.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "stand-in provider") {
			t.Fatalf("the provider's refusal: %d %s", res.StatusCode, body)
		}
		pauseEnds := refusedAt.Add(1500 * time.Millisecond)
		for _, gw := range gateways {
			res, body := send(gw)
			announced := time.Now().Add(retryAfterOf(res))
			if res.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "provider's own quota") {
				t.Fatalf("%s during the pause: %d %s", gw, res.StatusCode, body)
			}
			off := announced.Sub(pauseEnds)
			t.Logf("%s announces the pause's end %v off the provider's wait as the client measured it", gw, off)
			if off < -50*time.Millisecond || off > 10*time.Millisecond {
				t.Errorf("%s announces the pause's end %v off the provider's wait", gw, off)
			}
		}
		time.Sleep(time.Until(pauseEnds.Add(-100 * time.Millisecond)))
		if res, _ := send(gateways[1]); res.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("100 ms before the provider's wait ends: %d, want still paused", res.StatusCode)
		}
		time.Sleep(time.Until(pauseEnds))
		for _, gw := range gateways {
			if res, body := send(gw); res.StatusCode != http.StatusOK {
				t.Errorf("%s once the provider's wait has ended: %d %s", gw, res.StatusCode, body)
			}
		}
	})
}

// One gateway learns the provider's quota on either store alike: six keys
// sending steadily through it meet at most one of the provider's
// refusals, and use its quota to at least 90%.
func TestAGatewayLearnsTheProvidersQuotaOnEitherStore(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		provider := newStandInProvider(300, 30*time.Second)
		up := newFakeUpstream(t, provider.mode)
		gw := startGateway(t, up.URL, providerSite(store, map[string]string{"learn": "limit provider * rpm 100000 learn"}))
		org := redistest.UniqueID(t)
		byGateway, byProvider := sendSteadily(t, []string{gw.url}, "learn", "openai", org, 6, 3*time.Second)
		counts := provider.of(org)
		elapsed := time.Duration(counts.last.Load() - counts.first.Load())
		capacity := float64(provider.limit) * (1 + elapsed.Seconds()/provider.window.Seconds())
		t.Logf("%v: served %d of a capacity of %.0f; the provider refused %d, the gateway %d", elapsed, counts.served.Load(), capacity, counts.refused.Load(), byGateway)
		if refused := counts.refused.Load(); refused > 1 || byProvider != refused {
			t.Errorf("the provider refused %d requests, %d of which reached a client; want at most one", refused, byProvider)
		}
		if used := float64(counts.served.Load()) / capacity; used < 0.9 {
			t.Errorf("the provider's quota was used to %.1f%%, want at least 90%%", 100*used)
		}
		// The live view shows what was learned, from which header, when,
		// and when it ends; then the pause a refusal asked for.
		v, body := getLiveView(t, "scope=provider&id="+org)
		if len(v.Limits) != 1 || v.Limits[0].Learned == nil {
			t.Fatalf("live view: %s", body)
		}
		q, ok := v.Limits[0].Learned.Quotas["requests"]
		if !ok || q.Limit != 300 || q.Header != "x-ratelimit-limit-requests" || q.FullInMillis <= 0 || q.FullInMillis > 30_000 || q.ReportedAt == "" {
			t.Errorf("the learned requests quota in the live view: %+v (%s)", q, body)
		}
		// Once the gateway lets one through (the run left the quota
		// empty), the provider refuses it for a minute.
		eventually(t, func() error {
			req, _ := http.NewRequest("POST", gw.url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
			setHeaders(req, []string{"X-Api-Key: k", "X-Org: " + org, "X-Route: learn", "X-Refuse-Ms: 60000"})
			if res, body := mustDo(t, http.DefaultClient, req); !strings.Contains(string(body), "stand-in provider") {
				return fmt.Errorf("the gateway answered %d %s", res.StatusCode, body)
			}
			return nil
		})
		eventually(t, func() error {
			v, body = getLiveView(t, "scope=provider&id="+org)
			if l := v.Limits[0].Learned; l.PausedBy != "retry-after-ms" || l.PausedForMillis < 50_000 || l.PausedUntil == "" {
				return fmt.Errorf("the live view shows no pause of a minute by retry-after-ms: %s", body)
			}
			return nil
		})
		// The metrics count the provider's pause and the refusals it makes.
		before := scrape(t)[`caddy_rolter_ratelimit_refusals_total{kind="provider",scope="provider",shadow="false",window=""}`]
		req, _ := http.NewRequest("POST", gw.url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		setHeaders(req, []string{"X-Api-Key: k", "X-Org: " + org, "X-Route: learn"})
		if res, body := mustDo(t, http.DefaultClient, req); res.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), "provider's own quota") {
			t.Fatalf("during the provider's pause: %d %s", res.StatusCode, body)
		}
		metrics := scrape(t)
		if got := metrics[`caddy_rolter_ratelimit_refusals_total{kind="provider",scope="provider",shadow="false",window=""}`]; got != before+1 {
			t.Errorf("refusals of kind provider went from %v to %v, want one more", before, got)
		}
		if got := metrics[`caddy_rolter_ratelimit_provider_paused_ids{scope="provider"}`]; got < 1 {
			t.Errorf("provider_paused_ids of scope provider is %v, want the paused org counted", got)
		}
		// Gemini gives its wait only in its refusal's body: the pause
		// takes it once the body is read.
		gemini := redistest.UniqueID(t)
		req, _ = http.NewRequest("POST", gw.url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		setHeaders(req, []string{"X-Api-Key: k", "X-Org: " + gemini, "X-Route: learn", "X-Refuse-Gemini: 45s"})
		if res, body := mustDo(t, http.DefaultClient, req); !strings.Contains(string(body), "RESOURCE_EXHAUSTED") {
			t.Fatalf("the provider's Gemini refusal: %d %s", res.StatusCode, body)
		}
		eventually(t, func() error {
			v, body = getLiveView(t, "scope=provider&id="+gemini)
			if l := v.Limits[0].Learned; l.PausedBy != "RetryInfo" || l.PausedForMillis < 40_000 || l.PausedForMillis > 45_000 {
				return fmt.Errorf("the live view shows no pause of 45 s by RetryInfo: %s", body)
			}
			return nil
		})
	})
}
