package ratelimit

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
	"github.com/rolter/caddy-ratelimit/internal/tokenest"
)

// Each API's clients get the handler's refusal in that API's own shape:
// Anthropic's error object and anthropic-ratelimit-* headers on
// /v1/messages, Google's RESOURCE_EXHAUSTED with a RetryInfo delay on
// Gemini's paths, OpenAI's everywhere else.
func TestRefusalsSpeakTheDialectOfTheAPIThePathNames(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rpm 1 tpm 100000
			reserve_tokens off`))
		key := "X-Api-Key: sk-" + redistest.UniqueID(t)
		res, _ := gw.send(t, "POST", "/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":5}`, key)
		if res.StatusCode != 200 || res.Header.Get("Anthropic-Ratelimit-Requests-Limit") != "1" || res.Header.Get("Anthropic-Ratelimit-Requests-Remaining") != "0" ||
			res.Header.Get("X-Ratelimit-Limit-Requests") != "99999" { // the upstream's own: not this dialect's family
			t.Fatalf("admitted Anthropic request: %d %v", res.StatusCode, res.Header)
		}
		if reset, err := time.Parse(time.RFC3339, res.Header.Get("Anthropic-Ratelimit-Requests-Reset")); err != nil || time.Until(reset) <= time.Minute-2*time.Second || time.Until(reset) > 2*time.Minute {
			t.Fatalf("anthropic-ratelimit-requests-reset %q: want an RFC 3339 time within two minutes (%v)", res.Header.Get("Anthropic-Ratelimit-Requests-Reset"), err)
		}
		res, body := gw.send(t, "POST", "/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":5}`, key)
		var anthropic struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		if res.StatusCode != 429 || json.Unmarshal(body, &anthropic) != nil || anthropic.Type != "error" || anthropic.Error.Type != "rate_limit_error" ||
			!strings.Contains(anthropic.Error.Message, "Rate limit reached for key") || res.Header.Get("Retry-After") == "" {
			t.Fatalf("Anthropic refusal: %d %s %v", res.StatusCode, body, res.Header)
		}

		res, body = gw.send(t, "POST", "/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[]}`, key)
		var gemini struct {
			Error struct {
				Code    int
				Message string
				Status  string
				Details []struct {
					Type       string `json:"@type"`
					RetryDelay string `json:"retryDelay"`
				}
			}
		}
		if res.StatusCode != 429 || json.Unmarshal(body, &gemini) != nil || gemini.Error.Code != 429 || gemini.Error.Status != "RESOURCE_EXHAUSTED" ||
			len(gemini.Error.Details) != 1 || gemini.Error.Details[0].Type != "type.googleapis.com/google.rpc.RetryInfo" {
			t.Fatalf("Gemini refusal: %d %s", res.StatusCode, body)
		}
		delay, err := time.ParseDuration(gemini.Error.Details[0].RetryDelay)
		if ms := headerInt(t, res, "Retry-After-Ms"); err != nil || delay != time.Duration(ms)*time.Millisecond {
			t.Fatalf("retryDelay %q, want the Retry-After-Ms wait %d ms", gemini.Error.Details[0].RetryDelay, ms)
		}

		res, body = gw.send(t, "POST", "/v1/chat/completions", `{"model":"gpt-4o"}`, key)
		var e openAIError
		if res.StatusCode != 429 || json.Unmarshal(body, &e) != nil || e.Error.Code != "rate_limit_exceeded" || e.Error.Type != "requests" {
			t.Fatalf("OpenAI refusal: %d %s", res.StatusCode, body)
		}
	})
}

// Anthropic's input and output token limits have headers of their own: an
// admitted Messages request sees its reservation's input estimate in
// anthropic-ratelimit-input-tokens-* and its max_tokens in
// -output-tokens-*, and tpm's in -tokens-*.
func TestAnthropicRequestsSeeTheirInputAndOutputTokenLimitsInAnthropicsHeaders(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * itpm 10000 otpm 2000 tpm 50000`))
		body := `{"model":"claude-sonnet-4-5","max_tokens":500,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 400) + `"}]}`
		est := tokenest.Of(llmapi.Of("/v1/messages"), []byte(body))
		res, _ := gw.send(t, "POST", "/v1/messages", body, "Content-Type: application/json", "X-Api-Key: sk-"+redistest.UniqueID(t))
		if res.StatusCode != 200 {
			t.Fatalf("status %d", res.StatusCode)
		}
		for name, want := range map[string]int64{
			"Anthropic-Ratelimit-Input-Tokens-Limit":      10000,
			"Anthropic-Ratelimit-Input-Tokens-Remaining":  10000 - est.Input,
			"Anthropic-Ratelimit-Output-Tokens-Limit":     2000,
			"Anthropic-Ratelimit-Output-Tokens-Remaining": 1500,
			"Anthropic-Ratelimit-Tokens-Limit":            50000,
			"Anthropic-Ratelimit-Tokens-Remaining":        50000 - est.Input - 500,
		} {
			if got := headerInt(t, res, name); got != want {
				t.Errorf("%s: %d, want %d", name, got, want)
			}
		}
		for _, name := range []string{"Anthropic-Ratelimit-Input-Tokens-Reset", "Anthropic-Ratelimit-Output-Tokens-Reset"} {
			if _, err := time.Parse(time.RFC3339, res.Header.Get(name)); err != nil {
				t.Errorf("%s %q: want an RFC 3339 time", name, res.Header.Get(name))
			}
		}
		if res.Header.Get("Anthropic-Ratelimit-Requests-Limit") != "" {
			t.Error("requests headers without a request cap")
		}
	})
}

// The dialect option chooses the shape where the path cannot tell, as
// behind a gateway that mounts an API elsewhere.
func TestTheDialectOptionOverridesThePath(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, up.URL, limited("", `
		scope key {http.request.header.X-Api-Key} required
		limit key * rpm 1
		dialect gemini`))
	res, body := gw.send(t, "POST", "/anthropic/proxy", `{}`)
	if res.StatusCode != 403 || !strings.Contains(string(body), `"status":"PERMISSION_DENIED"`) || !strings.Contains(string(body), `"code":403`) {
		t.Fatalf("%d %s, want Google's PERMISSION_DENIED", res.StatusCode, body)
	}
}

func TestDialectOfAPathIsTheAPIItNames(t *testing.T) {
	for path, want := range map[string]dialect{
		"/v1/messages":              dialectAnthropic,
		"/anthropic/v1/messages":    dialectAnthropic,
		"/v1/messages/count_tokens": dialectAnthropic,
		"/v1beta/models/gemini-2.5-flash:streamGenerateContent": dialectGemini,
		"/v1beta/models/gemini-2.5-flash:countTokens":           dialectGemini,
		"/v1/chat/completions":                                  dialectOpenAI,
		"/v1/threads/t1/messages":                               dialectOpenAI,
		"/openai/deployments/gpt/chat/completions":              dialectOpenAI,
		"/v1/models/gpt-4o":                                     dialectOpenAI,
		"/anthropic/messages":                                   dialectAnthropic,
		"/v1/projects/p/locations/l/publishers/anthropic/models/claude-sonnet-4@20250514:rawPredict":       dialectAnthropic,
		"/v1/projects/p/locations/l/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict": dialectAnthropic,
		"/v1/projects/p/locations/l/publishers/google/models/gemini-2.5-pro:generateContent":               dialectGemini,
		bedrockConverse: dialectBedrock,
		"/model/anthropic.claude-3-haiku-20240307-v1:0/invoke-with-response-stream": dialectBedrock,
		"/v2/chat": dialectCohere,
	} {
		if got := dialectOf("", llmapi.Of(path)); got != want {
			t.Errorf("%s: dialect %d, want %d", path, got, want)
		}
	}
}

// Bedrock's answers carry, in x-amzn-ErrorType, the code by which the AWS
// SDKs decide to retry: ThrottlingException for a refusal that a wait
// helps, with the wait in x-amz-retry-after in milliseconds; codes they
// never retry for a spent budget and a request too large, which are 400
// (the JavaScript SDK retries any 429); and each other status's code.
// Cohere's spent budget is 402, its request too large 400.
func TestBedrocksAndCoheresRefusalsCarryWhatTheirSDKsDecideToRetryBy(t *testing.T) {
	for _, c := range []struct {
		name        string
		d           dialect
		quota, huge bool
		status      int
		code        string
	}{
		{"Bedrock throttled", dialectBedrock, false, false, 429, "ThrottlingException"},
		{"Bedrock budget", dialectBedrock, true, false, 400, "ServiceQuotaExceededException"},
		{"Bedrock too large", dialectBedrock, false, true, 400, "ValidationException"},
		{"Cohere throttled", dialectCohere, false, false, 429, ""},
		{"Cohere budget", dialectCohere, true, false, 402, ""},
		{"Cohere too large", dialectCohere, false, true, 400, ""},
		{"OpenAI budget", dialectOpenAI, true, false, 429, ""},
		{"Anthropic too large", dialectAnthropic, false, true, 429, ""},
	} {
		status := c.d.limitStatus(c.quota, c.huge)
		w := httptest.NewRecorder()
		if err := c.d.write(w, errorAnswer{status: status, message: "m", retryMillis: 1250, quota: c.quota, tooLarge: c.huge}); err != nil {
			t.Fatal(err)
		}
		h := w.Result().Header
		if status != c.status || h.Get("X-Amzn-Errortype") != c.code {
			t.Errorf("%s: %d %q, want %d %q", c.name, status, h.Get("X-Amzn-Errortype"), c.status, c.code)
		}
		if want := map[bool]string{true: "1250"}[c.d == dialectBedrock]; h.Get("X-Amz-Retry-After") != want {
			t.Errorf("%s: x-amz-retry-after %q, want %q", c.name, h.Get("X-Amz-Retry-After"), want)
		}
	}
	for status, code := range map[int]string{400: "ValidationException", 403: "AccessDeniedException", 503: "ServiceUnavailableException", 500: "InternalServerException"} {
		if got := bedrockErrorCode(errorAnswer{status: status}); got != code {
			t.Errorf("Bedrock's %d: %s, want %s", status, got, code)
		}
	}
}

// dialectOfAnswer is the provider whose error shape body has: Anthropic's
// {"type":"error","error":{"type":…}}, Google's {"error":{"status":…}}, or
// OpenAI's {"error":{"type":…,"code":…}}.
func dialectOfAnswer(body []byte) string {
	var v struct {
		Type  string `json:"type"`
		Error struct {
			Type   string `json:"type"`
			Status string `json:"status"`
			Code   any    `json:"code"`
		} `json:"error"`
	}
	switch {
	case json.Unmarshal(body, &v) != nil:
		return "not JSON"
	case v.Type == "error" && v.Error.Type != "":
		return "anthropic"
	case v.Error.Status != "":
		return "gemini"
	case v.Error.Type != "" && v.Error.Code != nil:
		return "openai"
	}
	return "unknown"
}

// Every path form the estimator reads answers in its provider's shape: the
// one classifier (llmapi) decides the dialect, the estimate and the model.
func TestEveryPathFormTheEstimatorReadsIsRefusedInItsProvidersShape(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rpm 1`))
		for _, c := range []struct{ path, body, want string }{
			{"/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:rawPredict", `{"anthropic_version":"vertex-2023-10-16","max_tokens":5,"messages":[]}`, "anthropic"},
			{"/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict", `{"anthropic_version":"vertex-2023-10-16","max_tokens":5,"messages":[]}`, "anthropic"},
			{"/anthropic/messages", `{"model":"claude-sonnet-4-5","max_tokens":5,"messages":[]}`, "anthropic"},
			{"/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[]}`, "gemini"},
			{"/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:streamGenerateContent", `{"contents":[]}`, "gemini"},
			{"/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21", `{"messages":[]}`, "openai"},
			{"/v1/chat/completions", `{"model":"gpt-4o","messages":[]}`, "openai"},
		} {
			key := "X-Api-Key: " + redistest.UniqueID(t)
			for range 2 {
				res, body := gw.send(t, "POST", c.path, c.body, "Content-Type: application/json", key)
				if res.StatusCode == 200 {
					continue
				}
				if got := dialectOfAnswer(body); res.StatusCode != 429 || got != c.want {
					t.Errorf("%s: refused %d in %s's shape, want 429 in %s's: %s", c.path, res.StatusCode, got, c.want, body)
				}
			}
		}
	})
}

// A too-large refusal, like every refusal, carries the chain's rate-limit
// headers as they stand.
func TestATooLargeRefusalCarriesTheRateLimitHeaders(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rpm 5 tpm 1000`))
		res, body := gw.postChat(t, `{"model":"m","max_tokens":5000,"messages":[]}`, "X-Api-Key: "+redistest.UniqueID(t))
		if res.StatusCode != 429 || !strings.Contains(string(body), "Request too large") {
			t.Fatalf("%d %s, want 429 too large", res.StatusCode, body)
		}
		if res.Header.Get("X-Ratelimit-Limit-Tokens") != "1000" || res.Header.Get("X-Ratelimit-Remaining-Requests") != "5" || res.Header.Get("X-Should-Retry") != "false" {
			t.Fatalf("too-large headers %v, want x-ratelimit-* of the chain and x-should-retry false", res.Header)
		}
	})
}
