package ratelimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// metricsText is the admin endpoint's whole /metrics answer.
func metricsText(t *testing.T) string {
	t.Helper()
	return metricsTextAt(t, caddyAdmin())
}

// metricsTextAt is the whole /metrics answer of the Caddy whose admin
// endpoint is on port admin (a gateway process of its own, say).
func metricsTextAt(t *testing.T, admin int) string {
	t.Helper()
	req, err := http.NewRequest("GET", fmt.Sprintf("http://localhost:%d/metrics", admin), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, body := mustDo(t, http.DefaultClient, req)
	return string(body)
}

// scrape reads the admin endpoint's /metrics into "name{labels}" → value.
func scrape(t *testing.T) map[string]float64 {
	t.Helper()
	return scrapeAt(t, caddyAdmin())
}

// scrapeAt is scrape of the Caddy whose admin endpoint is on port admin.
func scrapeAt(t *testing.T, admin int) map[string]float64 {
	t.Helper()
	out := make(map[string]float64)
	for line := range strings.Lines(metricsTextAt(t, admin)) {
		line = strings.TrimSuffix(line, "\n")
		if !strings.HasPrefix(line, "caddy_rolter_ratelimit_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

func TestMetricsCountOutcomesRefusalsAndTokensAndKeepCountingAcrossAReload(t *testing.T) {
	t.Run("memory", func(t *testing.T) { checkMetrics(t, nil) })
	t.Run("redis", func(t *testing.T) { checkMetrics(t, redistest.NewServer(t)) })
}

// checkMetrics runs the metrics test on a Redis of its own, srv, which it
// stops to see a request fail open, or on the in-process store (srv nil).
func checkMetrics(t *testing.T, srv *redistest.Server) {
	up := newFakeUpstream(t, answerSamples(t))
	store := ""
	if srv != nil {
		store = "redis " + srv.URL()
	}
	site := func(comment string) string {
		return fmt.Sprintf(`
	# %s
	rolter_ratelimit {
		%s
		scope key {http.request.header.Authorization}
		scope org {http.request.header.X-Org} readable
		limit key * rpm 2
		limit org * tpm 100000
		reserve_tokens off
	}
	reverse_proxy {upstream}`, comment, store)
	}
	gw := startGatewayWith(t, up.URL, "", site("first"), 0)
	before := scrape(t)
	key := "Authorization: Bearer sk-" + redistest.UniqueID(t)
	org := "X-Org: " + redistest.UniqueID(t)
	for i := 0; i < 3; i++ { // 2 admitted, 1 refused by the key's rpm
		gw.get(t, "/samples/openai_chat.json?coding=identity", key, org)
	}
	gw.get(t, "/samples/openai_error.json?coding=identity", "Authorization: Bearer sk-"+redistest.UniqueID(t), org) // admitted, not metered
	waitCharged(t, store, []limiter.Limit{newLimit("org", strings.TrimPrefix(org, "X-Org: "), 0, 1)}, 2*1163)
	want := map[string]float64{
		`caddy_rolter_ratelimit_admissions_total{outcome="admitted"}`:                                       3,
		`caddy_rolter_ratelimit_admissions_total{outcome="refused"}`:                                        1,
		`caddy_rolter_ratelimit_refusals_total{kind="requests",scope="key",shadow="false",window="minute"}`: 1,
		`caddy_rolter_ratelimit_tokens_charged_total{kind="total",model=""}`:                                2 * 1163,
		`caddy_rolter_ratelimit_tokens_charged_total{kind="input",model=""}`:                                2 * 1117,
		`caddy_rolter_ratelimit_tokens_charged_total{kind="output",model=""}`:                               2 * 46,
		`caddy_rolter_ratelimit_unmetered_total{what="response"}`:                                           1,
	}
	if srv != nil {
		srv.Stop()
		gw.get(t, "/samples/openai_chat.json?coding=identity", "Authorization: Bearer sk-"+redistest.UniqueID(t), org) // failed open
		want[`caddy_rolter_ratelimit_admissions_total{outcome="failed_open"}`] = 1
		want[`caddy_rolter_ratelimit_redis_errors_total{op="admit"}`] = 1
		want[`caddy_rolter_ratelimit_redis_call_duration_seconds_count{op="admit"}`] = 5
	}
	after := scrape(t)

	delta := func(name string) float64 { return after[name] - before[name] }
	for name, want := range want {
		if got := delta(name); got != want {
			t.Errorf("%s went up by %v, want %v", name, got, want)
		}
	}
	for _, gauge := range []string{"realtime_sessions_open", "request_body_bytes", "memory_counters"} {
		if _, ok := after["caddy_rolter_ratelimit_"+gauge]; !ok {
			t.Errorf("%s is missing", gauge)
		}
	}
	for name := range after {
		if strings.Contains(name, "sk-") || strings.Contains(name, strings.TrimPrefix(org, "X-Org: ")) {
			t.Fatalf("a metric label carries an id: %s", name)
		}
	}

	// A reload gives Caddy a fresh registry: the same counters are there
	// again and go on from where they were.
	if srv != nil {
		srv.Restart(t)
	}
	startGatewayWith(t, up.URL, "", site("second"), gw.port)
	reloaded := scrape(t)
	name := `caddy_rolter_ratelimit_admissions_total{outcome="admitted"}`
	if reloaded[name] < after[name] {
		t.Fatalf("%s fell from %v to %v across the reload", name, after[name], reloaded[name])
	}
	gw.get(t, "/samples/openai_chat.json?coding=identity", "Authorization: Bearer sk-"+redistest.UniqueID(t), org)
	if got := scrape(t)[name]; got != reloaded[name]+1 {
		t.Fatalf("%s is %v after one more admission, want %v", name, got, reloaded[name]+1)
	}
}

// Without a price, a request's tokens are counted under the configured id
// of its chain's limit of the model scope (a prefix pool's with its '*', or
// "*"), never the model it asked for; a chain without one, under "".
func TestTokenMetricsCarryTheConfiguredModelEntryNeverTheModelAsked(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		family := redistest.UniqueID(t) + "-gpt"
		gw := startGateway(t, up.URL, limited(store, fmt.Sprintf(`
			scope key {http.request.header.X-Api-Key}
			scope model {http.rolter_ratelimit.model} readable
			limit key * tpm 100000
			limit model %s* tpm 100000
			limit model * tpm 100000`, family)))
		used := up.json(openAIUsage(`{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}`))
		for _, c := range []struct{ model, entry string }{{family + "-4o", family + "*"}, {"made-up-" + redistest.UniqueID(t), "*"}} {
			charged := fmt.Sprintf(`caddy_rolter_ratelimit_tokens_charged_total{kind="total",model=%q}`, c.entry)
			before := scrape(t)[charged]
			body := fmt.Sprintf(`{"model":%q,"max_tokens":50,"messages":[]}`, c.model)
			if res, got := gw.postChat(t, body, "X-Api-Key: "+redistest.UniqueID(t), used); res.StatusCode != 200 {
				t.Fatalf("%s: %d %s", c.model, res.StatusCode, got)
			}
			waitMetric(t, charged, before+30)
			if strings.Contains(metricsText(t), c.model) {
				t.Errorf("the metrics name the model %s a client asked for", c.model)
			}
		}
	})
}
