package ratelimit

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// chatFor is a chat completion of model.
func chatFor(model string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model)
}

// A model scope is the provider's own quota: one pool per model, shared by
// every key; a prefix covers a model family's snapshots as one pool, the
// longest prefix wins, and an exact id beats any prefix.
func TestPerModelPoolsSharedByKeysWithTheLongestPrefixWinning(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		family := uniqueID(t) // keeps the pools of each run apart
		gw := startGateway(t, up.URL, limited(store, fmt.Sprintf(`
			scope key {http.request.header.X-Api-Key}
			scope model {http.rolter_ratelimit.model} readable
			limit model %[1]s-gpt-4o* rpm 3
			limit model %[1]s-gpt-4o-mini* rpm 1
			limit model %[1]s-gpt-4o-special rpm 100
			limit model %[1]s-gemini* rpm 1`, family)))
		send := func(key, model string) int {
			res, _ := gw.send(t, "POST", "/v1/chat/completions", chatFor(family+"-"+model), "Content-Type: application/json", "X-Api-Key: "+key)
			return res.StatusCode
		}
		got := []int{
			send("a", "gpt-4o"), send("b", "gpt-4o-2024-08-06"), send("a", "gpt-4o"), // the family's 3
			send("b", "gpt-4o-2024-11-20"),                                // refused: one pool for both keys and every snapshot
			send("a", "gpt-4o-mini"), send("b", "gpt-4o-mini-2024-07-18"), // the mini pool's 1, then refused
			send("a", "gpt-4o-special"), send("b", "gpt-4o-special"), // its own limit, not the family's
		}
		if fmt.Sprint(got) != "[200 200 200 429 200 429 200 200]" {
			t.Fatalf("statuses %v", got)
		}
		if n := storeCount(t, store, newLimit("model", family+"-gpt-4o*", 0, 0).prefix, rpm, nowMinute()); n != 3 {
			t.Fatalf("the gpt-4o pool's counter, named by its prefix, holds %d, want 3", n)
		}
		// The live view finds the pool an id belongs to.
		if v, body := getLiveView(t, "scope=model&id="+family+"-gpt-4o-2024-08-06"); len(v.Limits) != 1 || v.Limits[0].ID != family+"-gpt-4o*" || v.Limits[0].RPM.Estimate != 3 {
			t.Fatalf("live view of a snapshot: %s, want its family's pool with its 3 requests", body)
		}
		// Gemini names the model in the path.
		gemini := func() int {
			res, _ := gw.send(t, "POST", "/v1beta/models/"+family+"-gemini-2.5-flash:generateContent", `{"contents":[]}`, "Content-Type: application/json", "X-Api-Key: a")
			return res.StatusCode
		}
		if a, b := gemini(), gemini(); a != 200 || b != 429 {
			t.Fatalf("Gemini requests: %d then %d, want the pool's 1 then a refusal", a, b)
		}
		// No model: the model scope is not in the chain.
		if res, _ := gw.send(t, "POST", "/v1/embeddings", `{"input":"x"}`, "Content-Type: application/json", "X-Api-Key: a"); res.StatusCode != 200 {
			t.Fatalf("a request without a model: %d", res.StatusCode)
		}
	})
}

// A scope composed of the key and the model limits each key per model.
func TestPerKeyAndModelCompositeScope(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key_model {http.request.header.X-Api-Key}/{http.rolter_ratelimit.model}
			limit key_model * rpm 1`))
		key := uniqueID(t)
		send := func(key, model string) int {
			res, _ := gw.send(t, "POST", "/v1/messages", chatFor(model), "Content-Type: application/json", "X-Api-Key: "+key)
			return res.StatusCode
		}
		got := []int{send(key+"a", "gpt-4o"), send(key+"a", "gpt-4o"), send(key+"a", "claude-sonnet-4-5"), send(key+"b", "gpt-4o")}
		if fmt.Sprint(got) != "[200 429 200 200]" {
			t.Fatalf("statuses %v, want one request per key and model", got)
		}
	})
}

// A prefix pool's counters are named by the prefix: as written in a
// readable scope, digested in a secret one.
func TestPrefixPoolsAreNamedByTheirPrefix(t *testing.T) {
	if got := prefixKeyID(true, "gpt-4o"); got != "gpt-4o*" {
		t.Fatalf("readable prefix stored as %q", got)
	}
	if got := prefixKeyID(false, "gpt-4o"); got != keyID(false, "gpt-4o*") || got == keyID(false, "gpt-4o") {
		t.Fatalf("secret prefix stored as %q: want the digest of the prefix and *, apart from the exact id's", got)
	}
	if got := prefixKeyID(true, "has space"); got != keyID(false, "has space*") {
		t.Fatalf("a prefix that is no plain token is stored as %q, want its digest", got)
	}
}

// A prefix that resolves to nothing would silently cover every id, and an
// id that resolves to nothing would limit no request: the config load says
// so instead.
func TestAnIDOrPrefixResolvingToNothingFailsTheConfigLoad(t *testing.T) {
	for id, want := range map[string]string{
		"{env.ROLTER_TEST_UNSET_PREFIX}*": "prefix resolves to nothing",
		"{env.ROLTER_TEST_UNSET_ID}":      "the id resolves to nothing when the config loads",
	} {
		h := &Handler{
			Scopes: []Scope{{Name: "model", Value: "{http.rolter_ratelimit.model}"}},
			Limits: []LimitConfig{{Scope: "model", ID: id, RPM: 1}},
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := h.Provision(ctx)
		h.Cleanup()
		cancel()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Provision of id %s: %v, want %q", id, err, want)
		}
	}
}

// A client does not escape its model's limits or its reservation by
// declaring another type or method: a JSON body sent as text/plain or
// form-encoded (curl -d), or with GET or PUT, to an API path is read for its
// model and its reservation.
func TestABodySentWithAnotherTypeOrMethodGetsItsModelAndItsReservation(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope model {http.rolter_ratelimit.model} readable
			limit model * rpm 1 tpm 100000`))
		for _, cases := range [][]struct {
			method, contentType, maxTokens string
			status                         int
		}{{
			{"POST", "application/x-www-form-urlencoded", "50000000", 429}, // too large: its reservation was read
			{"POST", "text/plain", "10", 200},
			{"POST", "application/x-www-form-urlencoded", "10", 429}, // the model's rpm 1
		}, {
			{"GET", "application/json", "50000000", 429},
			{"PUT", "application/json", "10", 200},
			{"GET", "application/json", "10", 429},
		}} {
			model := uniqueID(t)
			for _, c := range cases {
				body := `{"model":"` + model + `","max_tokens":` + c.maxTokens + `}`
				if res, got := gw.send(t, c.method, "/v1/chat/completions", body, "Content-Type: "+c.contentType); res.StatusCode != c.status {
					t.Fatalf("%s %s %s: %d %s, want %d", c.method, c.contentType, body, res.StatusCode, got, c.status)
				}
			}
		}
	})
}
