package ratelimit

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// The operator's view (dashboards/): the Grafana dashboard's queries and
// the alert rules, held to a real Prometheus (Debian's prometheus package:
// prometheus and promtool), which test.sh installs.

// promBinary is the path of a Prometheus program, or skips the test
// without it, except in CI, where test.sh has installed it.
func promBinary(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing (./test.sh installs Debian's prometheus package)", name)
		}
		t.Skipf("%s is needed (apt-get install prometheus)", name)
	}
	return path
}

// The alert rules are valid, and each fires on series that should fire it
// and not on series that should not (promtool's unit tests of them).
func TestTheAlertRulesAreValidAndFireExactlyWhenTheyShould(t *testing.T) {
	promtool := promBinary(t, "promtool")
	for _, args := range [][]string{{"check", "rules", "rolter_ratelimit.rules.yml"}, {"test", "rules", "rolter_ratelimit.rules.test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "dashboards"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// grafanaDashboard is what the test reads of the dashboard's JSON.
type grafanaDashboard struct {
	Templating struct {
		List []struct {
			Name, Type string
			Definition string
		}
	}
	Panels []struct {
		Title      string
		Datasource struct{ UID string }
		Targets    []struct{ Expr string }
	}
}

// panelQuery is a panel's query as Grafana sends it to Prometheus: its
// scope variable at All (.*), its rate interval a minute.
func panelQuery(expr string) string {
	return strings.NewReplacer(`$scope`, `.*`, `$__rate_interval`, `1m`).Replace(expr)
}

// Every panel's every query of the dashboard returns data from a real
// Prometheus that scrapes a real Caddy under traffic that makes every kind
// of refusal (requests, tokens, burst, too large, concurrency, budget, the
// provider's quota, a shadow limit's), waits and declines to wait, clamps
// and misses a usage, answers refusals from its cache, and loses its Redis
// (failed open): so that no panel names a metric or a label the module does
// not export. The dashboard's variables are a Prometheus data source and
// the scope names.
func TestEveryDashboardPanelsQueryAnswersInARealPrometheusScrapingTheGateway(t *testing.T) {
	prometheus := promBinary(t, "prometheus")
	var d grafanaDashboard
	b, err := os.ReadFile("dashboards/rolter_ratelimit.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if vars := d.Templating.List; len(vars) != 2 || vars[0].Name != "datasource" || vars[0].Type != "datasource" ||
		vars[1].Name != "scope" || !strings.HasPrefix(vars[1].Definition, "label_values(caddy_rolter_ratelimit_") {
		t.Fatalf("the dashboard's variables %+v, want a data source and the scope names", vars)
	}

	api := startPrometheus(t, prometheus, caddyAdmin()) // it starts while the traffic goes
	makeEveryKindOfRefusal(t)
	queries := []string{strings.TrimSuffix(strings.TrimPrefix(d.Templating.List[1].Definition, "label_values("), ", scope)")}
	for _, p := range d.Panels {
		if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: data source %q and %d queries, want ${datasource} and some", p.Title, p.Datasource.UID, len(p.Targets))
		}
		for _, target := range p.Targets {
			queries = append(queries, panelQuery(target.Expr))
		}
	}
	eventually(t, func() error {
		var empty []string
		for _, q := range queries {
			if n := promSeries(t, api, q); n == 0 {
				empty = append(empty, q)
			}
		}
		if len(empty) > 0 {
			return fmt.Errorf("%d of %d queries return no data yet: %s", len(empty), len(queries), strings.Join(empty, "; "))
		}
		return nil
	})
}

// startPrometheus starts a Prometheus that scrapes the Caddy admin
// endpoint on port admin every second, and returns its query API's URL.
func startPrometheus(t *testing.T, prometheus string, admin int) string {
	t.Helper()
	dir := t.TempDir()
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: caddy
    static_configs:
      - targets: ["localhost:%d"]
`, admin)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort()))
	cmd := exec.Command(prometheus, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus's log:\n%s", log.String())
		}
	})
	return "http://" + addr
}

// promSeries is how many series the instant query q returns from the
// Prometheus at api; 0 while it is not up yet.
func promSeries(t *testing.T, api, q string) int {
	t.Helper()
	res, err := http.Get(api + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return 0
	}
	defer res.Body.Close()
	if res.StatusCode == http.StatusServiceUnavailable { // starting
		return 0
	}
	var answer struct {
		Status string
		Error  string
		Data   struct{ Result []json.RawMessage }
	}
	if err := json.NewDecoder(res.Body).Decode(&answer); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	if answer.Status != "success" {
		t.Fatalf("%s: %s", q, answer.Error)
	}
	return len(answer.Data.Result)
}

// makeEveryKindOfRefusal sends, through gateways on Redis (and one whose
// Redis is gone), requests that make every kind of refusal and every other
// event the dashboard shows.
func makeEveryKindOfRefusal(t *testing.T) {
	t.Helper()
	up := newUpstream(t)
	gone := redistest.NewServer(t)
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	route /wait/* {
		rolter_ratelimit {
			%[1]s
			scope waits {http.request.header.X-Id} readable
			limit waits * rate 10 burst 1
			wait 5s
			max_waiting 1
		}
		reverse_proxy {upstream}
	}
	route /gone/* {
		rolter_ratelimit {
			redis %[2]s
			scope gone {http.request.header.X-Id} readable
			limit gone * rpm 10
			on_redis_error allow
		}
		reverse_proxy {upstream}
	}
	route {
		rolter_ratelimit {
			%[1]s
			scope rpm {http.request.header.X-Rpm} readable
			scope tpm {http.request.header.X-Tpm} readable
			scope burst {http.request.header.X-Burst} readable
			scope flight {http.request.header.X-Flight} readable
			scope budget {http.request.header.X-Budget} readable
			scope trial {http.request.header.X-Trial} readable
			scope provider {http.request.header.X-Provider} readable
			limit rpm * rpm 1
			limit tpm * tpm 1000
			limit burst * rate 0.1 burst 1 notify 100%%
			limit flight * concurrent 1
			limit budget * budget_day 0.001
			limit trial * rpm 1 shadow
			limit provider * learn
			price * input 3 output 15
		}
		reverse_proxy {upstream}
	}`, redisLine(t), gone.URL()))
	gone.Stop()
	id := redistest.UniqueID(t)
	chat := func(path string, headers ...string) int {
		res, _ := gw.send(t, "POST", path, `{"model":"m","max_tokens":10,"messages":[]}`, append(headers, "Content-Type: application/json")...)
		return res.StatusCode
	}
	twice := func(header string) {
		chat("/v1/chat/completions", header)
		chat("/v1/chat/completions", header)
	}
	for _, h := range []string{"X-Rpm: " + id, "X-Burst: " + id, "X-Budget: " + id, "X-Trial: " + id} {
		twice(h)
	}
	for range 10 { // a refused id, hammered: the refusal cache answers
		chat("/v1/chat/completions", "X-Rpm: "+id)
	}
	// Tokens: a report over what a response can use (clamped), one without
	// usage (unmetered), then a request too large and one refused by the
	// tokens charged.
	chat("/v1/chat/completions", "X-Tpm: "+id, up.json(openAIUsage(`{"prompt_tokens":999999999999,"completion_tokens":1,"total_tokens":1000000000000}`)))
	chat("/v1/chat/completions", "X-Tpm: "+id+"-b", up.json(`{"ok":true}`))
	gw.send(t, "POST", "/v1/chat/completions", `{"model":"m","max_tokens":5000}`, "X-Tpm: "+id+"-c")
	chat("/v1/chat/completions", "X-Tpm: "+id)
	// The provider refuses, with a wait of a minute (Gemini's RetryInfo):
	// its limit pauses, which the gauge shows, and refuses the next.
	chat("/v1beta/models/m:generateContent", "X-Provider: "+id, up.script(http.StatusTooManyRequests, "application/json",
		`{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"60s"}]}}`))
	eventually(t, func() error { // the pause is written once the refusal has reached its client
		if status := chat("/v1beta/models/m:generateContent", "X-Provider: "+id); status != http.StatusTooManyRequests {
			return fmt.Errorf("a request of the paused provider: %d, want 429", status)
		}
		return nil
	})
	// Requests in flight: one held, the next refused at the cap.
	var held sync.WaitGroup
	held.Go(func() { chat("/v1/chat/completions", "X-Flight: "+id, "X-Upstream: "+upstreamHeld) })
	waitSlotsHeld(t, caddyAdmin(), "flight", 1)
	chat("/v1/chat/completions", "X-Flight: "+id)
	up.release()
	held.Wait()
	// Waiting: of three at once, one is admitted, one waits for the
	// bucket, and one finds max_waiting full.
	var waiting sync.WaitGroup
	for range 3 {
		waiting.Go(func() { chat("/wait/v1/chat/completions", "X-Id: "+id) })
	}
	waiting.Wait()
	// The store gone: admitted unchecked.
	chat("/gone/v1/chat/completions", "X-Id: "+id)
}
