package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
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
		family := redistest.UniqueID(t) // keeps the pools of each run apart
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
		if n := windowNow(t, store, newLimit("model", family+"-gpt-4o*", 0, 0), limiter.RPM).Cur; n != 3 {
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
		key := redistest.UniqueID(t)
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
	if got := limiter.PrefixKeyID(true, "gpt-4o"); got != "gpt-4o*" {
		t.Fatalf("readable prefix stored as %q", got)
	}
	if got := limiter.PrefixKeyID(false, "gpt-4o"); got != limiter.KeyID(false, "gpt-4o*") || got == limiter.KeyID(false, "gpt-4o") {
		t.Fatalf("secret prefix stored as %q: want the digest of the prefix and *, apart from the exact id's", got)
	}
	if got := limiter.PrefixKeyID(true, "has space"); got != limiter.KeyID(false, "has space*") {
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
			model := redistest.UniqueID(t)
			for _, c := range cases {
				body := `{"model":"` + model + `","max_tokens":` + c.maxTokens + `}`
				if res, got := gw.send(t, c.method, "/v1/chat/completions", body, "Content-Type: "+c.contentType); res.StatusCode != c.status {
					t.Fatalf("%s %s %s: %d %s, want %d", c.method, c.contentType, body, res.StatusCode, got, c.status)
				}
			}
		}
	})
}

// A body that names its model under two spellings of the key ("model" and
// "MODEL"), which an upstream decoding into a Go struct reads without
// regard to case, is refused with 400 before the store counts it, under a
// model scope or a budget, whichever spelling comes last: the client would
// choose the pool or the price it is counted at. Where nothing reads the
// model it passes, and a key repeated as it is spelled is its last value,
// for every decoder.
func TestAModelNamedUnderTwoSpellingsOfItsKeyIsRefusedWhereTheModelCounts(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		f := redistest.UniqueID(t)
		twoSpellings := []string{
			fmt.Sprintf(`{"model":"%[1]s-cheap","MODEL":"%[1]s-dear"}`, f),
			fmt.Sprintf(`{"Model":"%[1]s-dear","model":"%[1]s-cheap"}`, f),
		}
		refused := func(gw *gateway, scope string, headers ...string) {
			t.Helper()
			hits := up.hits.Load()
			for _, body := range twoSpellings {
				res, got := gw.send(t, "POST", "/v1/chat/completions", body, headers...)
				var e openAIError
				if res.StatusCode != http.StatusBadRequest || json.Unmarshal(got, &e) != nil || e.Error.Code != "rate_limit_scope_ambiguous" ||
					!strings.Contains(e.Error.Message, `two spellings of the key "model"`) || !strings.Contains(e.Error.Message, `scope "`+scope+`"`) {
					t.Errorf("%s: %d %s, want 400 rate_limit_scope_ambiguous naming the scope %s", body, res.StatusCode, got, scope)
				}
			}
			if up.hits.Load() != hits {
				t.Errorf("the upstream saw %d requests refused for their model's spellings", up.hits.Load()-hits)
			}
		}

		gw := startGateway(t, up.URL, limited(store, fmt.Sprintf(`
			scope key {http.request.header.X-Api-Key}
			scope model {http.rolter_ratelimit.model} readable
			limit model %[1]s-cheap rpm 100
			limit model %[1]s-dear rpm 1`, f)))
		refused(gw, "model", "X-Api-Key: a")
		repeated := fmt.Sprintf(`{"model":"%[1]s-cheap","model":"%[1]s-dear"}`, f)
		for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
			if res, got := gw.send(t, "POST", "/v1/chat/completions", repeated, "X-Api-Key: a"); res.StatusCode != want {
				t.Fatalf("%s, request %d: %d %s, want %d: the last model, dear, with its rpm of 1", repeated, i+1, res.StatusCode, got, want)
			}
		}

		gw = startGateway(t, up.URL, limited(store, fmt.Sprintf(`
			scope team {http.request.header.X-Team}
			limit team * budget_day 10
			price %[1]s-cheap input 0.1 output 0.1
			price %[1]s-dear input 10 output 10`, f)))
		team := redistest.UniqueID(t)
		refused(gw, "team", "X-Team: "+team)
		if res, got := gw.send(t, "POST", "/v1/chat/completions", fmt.Sprintf(`{"model":%q}`, f+"-dear"), "X-Team: "+team); res.StatusCode != http.StatusOK {
			t.Fatalf("one spelling under the budget: %d %s, want 200", res.StatusCode, got)
		}
		waitSettled(t, caddyAdmin(), team, 3*10_000+4*10_000) // only that one, priced dear

		gw = startGateway(t, up.URL, limited(store, "scope key {http.request.header.X-Api-Key}\nlimit key * rpm 100"))
		for _, body := range twoSpellings {
			if res, got := gw.send(t, "POST", "/v1/chat/completions", body, "X-Api-Key: "+redistest.UniqueID(t)); res.StatusCode != http.StatusOK {
				t.Errorf("%s where nothing reads the model: %d %s, want 200", body, res.StatusCode, got)
			}
		}
	})
}

// The model a path names is read as an upstream that normalises the path
// reads it (dot segments resolved, repeated slashes dropped), so that a
// client cannot be counted at one model and served another: Azure's
// deployment behind "..", Gemini's model behind "//" or "/.", and
// Bedrock's behind ".." or encoded, count in the model's own pool.
func TestAModelInThePathIsCountedAsANormalisingUpstreamReadsIt(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw, f := dearPoolGateway(t, store)
		for _, paths := range [][]string{
			{"/openai/deployments/" + f + "-cheap/../" + f + "-dear/chat/completions", "/openai/deployments/" + f + "-dear/chat/completions"},
			{"/v1beta/models//" + f + "-dear:generateContent", "/v1beta/models/" + f + "-dear:generateContent/."},
			// Bedrock's model, as its clients encode it (an ARN's every
			// colon and slash), is counted decoded.
			{"/model/" + f + "-cheap/../" + f + "-dear/converse", "/model/" + f + "%2Ddear/converse-stream"},
		} {
			var got []int
			for _, path := range paths {
				res, _ := gw.send(t, "POST", path, `{"messages":[],"contents":[]}`, "Content-Type: application/json")
				got = append(got, res.StatusCode)
			}
			postReset(t, "scope=model&id="+f+"-dear", "")
			if fmt.Sprint(got) != "[200 429]" {
				t.Errorf("%q: statuses %v, want the dear pool's 1, then a refusal", paths, got)
			}
		}
	})
}

// A body declared Content-Encoding identity, which is no coding at all, is
// read for its model as any other: the model scope counts it.
func TestABodyDeclaredIdentityEncodedIsReadForItsModel(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw, f := dearPoolGateway(t, store)
		var got []int
		for _, encoding := range []string{"identity", "Identity, identity"} {
			res, _ := gw.send(t, "POST", "/v1/chat/completions", chatFor(f+"-dear"), "Content-Type: application/json", "Content-Encoding: "+encoding)
			got = append(got, res.StatusCode)
		}
		if fmt.Sprint(got) != "[200 429]" {
			t.Errorf("statuses %v, want the dear pool's 1, then a refusal", got)
		}
	})
}

// dearPoolGateway is a gateway on store whose model scope gives the model
// f-dear, f a name of the test's own, a pool of one request a minute.
func dearPoolGateway(t *testing.T, store string) (gw *gateway, f string) {
	t.Helper()
	f = redistest.UniqueID(t)
	return startGateway(t, newUpstream(t).URL, limited(store, fmt.Sprintf(`
		scope model {http.rolter_ratelimit.model} readable
		limit model %s-dear rpm 1`, f))), f
}
