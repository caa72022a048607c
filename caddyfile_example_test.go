package ratelimit

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
)

// The README's first command runs Caddyfile.example: it loads as it is
// written (on other ports, bound to loopback), lets a key make five
// requests a minute and refuses the sixth, and learns its stand-in
// upstream's quota, which the live view shows as the file says, and tallies
// the key's requests and refusal in the top view.
func TestTheExampleGatewayAdmitsFiveRequestsAMinuteAndLearnsItsUpstreamsQuota(t *testing.T) {
	example, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	bin := caddyBinary(t)
	var gw *caddyProcess
	onFreePorts(t, freePort, func(pick func() int) error {
		port, upstream, admin := pick(), pick(), pick()
		caddyfile := strings.NewReplacer(
			"auto_https off", "auto_https off\n\tdefault_bind 127.0.0.1",
			":8080", ":"+strconv.Itoa(port),
			"localhost:8081", "127.0.0.1:"+strconv.Itoa(upstream),
			":8081", ":"+strconv.Itoa(upstream),
			"localhost:2019", "localhost:"+strconv.Itoa(admin),
		).Replace(string(example))
		gw, err = tryCaddyProcess(t, bin, port, admin, caddyfile)
		return err
	})
	chat := func() *http.Response {
		req, _ := http.NewRequest("POST", gw.url+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}]}`))
		setHeaders(req, []string{"Authorization: Bearer sk-test", "Content-Type: application/json"})
		res, _ := mustDo(t, http.DefaultClient, req)
		return res
	}
	for i := range 5 {
		if res := chat(); res.StatusCode != http.StatusOK {
			t.Fatalf("request %d of 5: %d", i+1, res.StatusCode)
		}
	}
	if res := chat(); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the sixth request within a minute: %d, want 429 (limit key * rpm 5)", res.StatusCode)
	}
	v, body := getLiveViewAt(t, gw.admin, "scope=provider&id=openai/gpt-4o-mini")
	if len(v.Limits) != 1 || v.Limits[0].Learned == nil {
		t.Fatalf("the live view of the provider's quota: %s", body)
	}
	if q := v.Limits[0].Learned.Quotas["requests"]; q.Limit != 10000 || q.Header != "x-ratelimit-limit-requests" {
		t.Fatalf("the learned requests quota: %+v, want the stand-in's 10000 from x-ratelimit-limit-requests (%s)", q, body)
	}
	// The top keys: the one key, its five admissions and its refusal.
	for by, want := range map[string]int64{"requests": 5, "refusals": 1} {
		top := topAt(t, gw.admin, "scope=key&by="+by)
		if len(top.Stores) != 1 || len(top.Stores[0].Top) != 1 || top.Stores[0].Top[0].Value != want || top.Stores[0].Top[0].ID != limiter.KeyID(false, "sk-test") {
			t.Fatalf("the top keys by %s: %+v, want sk-test's digest with %d", by, top, want)
		}
	}
}
