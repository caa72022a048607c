package ratelimit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// The handler roots a chain at its outermost scope with a value, so that the
// keys of one request share a slot; a scope without a value moves the root in.
func TestClusterChainIsTaggedWithItsOutermostPresentScope(t *testing.T) {
	h := &Handler{
		// No call is made: the tags are the chain's, whatever the cluster.
		Redis: &RedisConfig{Cluster: []string{fmt.Sprintf("redis://127.0.0.1:%d", freePort())}},
		Scopes: []Scope{
			{Name: "key", Value: "{http.request.header.Authorization}"},
			{Name: "team", Value: "{http.request.header.X-Team}", Readable: true},
			{Name: "org", Value: "{http.request.header.X-Org}", Readable: true},
		},
		Limits: []LimitConfig{{Scope: "key", ID: "*", RPM: 5}, {Scope: "team", ID: "*", RPM: 50}},
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	for _, tc := range []struct {
		headers map[string]string
		tag     string
	}{
		{map[string]string{"Authorization": "Bearer sk-1", "X-Team": "ml", "X-Org": "acme"}, "{org:acme}:"}, // org has no limit, yet it is the root
		{map[string]string{"Authorization": "Bearer sk-1", "X-Team": "ml"}, "{team:ml}:"},
		{map[string]string{"Authorization": "Bearer sk-1"}, "{key:" + limiter.KeyID(false, "Bearer sk-1") + "}:"},
	} {
		r, _ := http.NewRequest("GET", "/", nil)
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		repl := caddy.NewReplacer()
		repl.Map(func(key string) (any, bool) {
			if name, ok := strings.CutPrefix(key, "http.request.header."); ok {
				return r.Header.Get(name), true
			}
			return nil, false
		})
		chain, _ := h.chain(&request{Request: r, repl: repl})
		for _, l := range chain {
			if want := "rolter:rl:" + tc.tag + l.Scope + ":"; l.Prefix[:len(want)] != want {
				t.Errorf("%v: prefix %s, want it under %s", tc.headers, l.Prefix, tc.tag)
			}
		}
	}
}

func TestClusterLiveViewReadsTheCountersUnderTheGivenRoot(t *testing.T) {
	gw := clusterTeamGateway(t, 7)
	org, team := redistest.UniqueID(t), redistest.UniqueID(t)
	for i := 0; i < 3; i++ {
		if res, _ := gw.do(t, "X-Org: "+org, "X-Team: "+team); res.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, res.StatusCode)
		}
	}
	view := func(query string) (int, string) {
		res, err := http.Get(fmt.Sprintf("http://localhost:%d/rolter_ratelimit/usage?%s", caddyAdmin(), query))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b strings.Builder
		io.Copy(&b, res.Body)
		return res.StatusCode, b.String()
	}
	if code, body := view("scope=team&id=" + team); code != 400 || !strings.Contains(body, "e.g. root=org:acme") {
		t.Fatalf("without root on a cluster: %d %s, want 400 asking for it", code, body)
	}
	code, body := view("scope=team&id=" + team + "&root=org:" + org)
	if code != 200 || !strings.Contains(body, `"remaining":4`) {
		t.Fatalf("with root: %d %s, want remaining 4 of rpm 7 after 3 requests", code, body)
	}
}

// clusterTeamGateway is a gateway on the shared Redis Cluster, of three
// primaries, whose chain is a team and its org (the chain's root), each
// team capped at rpm.
func clusterTeamGateway(t *testing.T, rpm int) *gateway {
	t.Helper()
	c := sharedCluster(t)
	return startGateway(t, newUpstream(t).URL, fmt.Sprintf(`
	rolter_ratelimit {
		redis cluster %s
		scope team {http.request.header.X-Team}
		scope org {http.request.header.X-Org}
		limit team * rpm %d
	}
	reverse_proxy {upstream}`, strings.Join(c.URLs(), " "), rpm))
}
