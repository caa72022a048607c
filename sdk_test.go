package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/poll"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// sdkDir holds the providers' SDKs (testdata/sdk/package.json), which
// test.sh installs with npm.
const sdkDir = "testdata/sdk"

// runSDK runs one of testdata/sdk's scripts against the gateway and decodes
// its report. Without node or the installed SDKs the test skips, except in
// CI, where test.sh has installed them.
func runSDK(t *testing.T, script, gateway, key string, report any) {
	t.Helper()
	node, err := exec.LookPath("node")
	if _, statErr := os.Stat(filepath.Join(sdkDir, "node_modules")); err != nil || statErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node or the SDKs of %s are missing (./test.sh installs them)", sdkDir)
		}
		t.Skipf("node and the SDKs of %s (npm ci --prefix %s) are needed", sdkDir, sdkDir)
	}
	cmd := exec.Command(node, script)
	cmd.Dir = sdkDir
	cmd.Env = append(os.Environ(), "GATEWAY="+gateway, "KEY="+key)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("node %s: %v\n%s%s", script, err, out, stderr)
	}
	if err := json.Unmarshal(out, report); err != nil {
		t.Fatalf("node %s printed %q: %v", script, out, err)
	}
}

// The providers' own SDKs read the gateway's refusals in their dialects:
// Anthropic's as its RateLimitError, retried after retry-after-ms; Google's
// as an ApiError of status 429 with RESOURCE_EXHAUSTED and a RetryInfo
// delay, after which a call succeeds; OpenAI's refusal of a request too
// large as a RateLimitError it does not retry.
func TestEachProvidersSDKReadsTheRefusalAsItsRateLimitError(t *testing.T) {
	up := newFakeUpstream(t, answerAsEachAPI)
	// A bucket that refills in 2 s (a wide margin for a slow machine) for Anthropic's and Gemini's
	// paths; a tpm for OpenAI's, where a request can be too large.
	gw := startGateway(t, up.URL, `
	rolter_ratelimit /v1/chat/completions* {
		scope key {http.request.header.Authorization}
		limit key * tpm 1000
	}
	rolter_ratelimit {
		scope key {http.request.header.Authorization}{http.request.header.X-Api-Key}{http.request.header.X-Goog-Api-Key}
		limit key * rate 0.5 burst 1
	}
	reverse_proxy {upstream}`)

	var anthropic struct {
		Refused, RateLimitError, Answered bool
		Status, RetryAfterMs              int
		ErrorType                         string
		RetriedCalls, RetriedAfterMs      int
	}
	runSDK(t, "anthropic.mjs", gw.url, redistest.UniqueID(t), &anthropic)
	if !anthropic.Refused || !anthropic.RateLimitError || anthropic.Status != 429 || anthropic.ErrorType != "rate_limit_error" {
		t.Errorf("Anthropic's SDK: %+v, want its RateLimitError of type rate_limit_error", anthropic)
	}
	if !anthropic.Answered || anthropic.RetriedCalls != 2 || anthropic.RetryAfterMs <= 0 || anthropic.RetriedAfterMs < anthropic.RetryAfterMs*9/10 {
		t.Errorf("Anthropic's SDK with retries: %+v, want one retry after the gateway's retry-after-ms, then the answer", anthropic)
	}

	var gemini struct {
		Refused, APIError, AnsweredAfterTheDelay bool
		Status                                   int
		GrpcStatus, RetryDelay                   string
	}
	runSDK(t, "gemini.mjs", gw.url, redistest.UniqueID(t), &gemini)
	if !gemini.Refused || !gemini.APIError || gemini.Status != 429 || gemini.GrpcStatus != "RESOURCE_EXHAUSTED" || !strings.HasSuffix(gemini.RetryDelay, "s") || !gemini.AnsweredAfterTheDelay {
		t.Errorf("Google's SDK: %+v, want an ApiError 429 RESOURCE_EXHAUSTED with a RetryInfo delay, then an answer after it", gemini)
	}

	var openai struct {
		Refused, RateLimitError bool
		Type, Message           string
		Calls                   int
	}
	runSDK(t, "openai.mjs", gw.url, redistest.UniqueID(t), &openai)
	if !openai.Refused || !openai.RateLimitError || openai.Calls != 1 || !strings.Contains(openai.Message, "Request too large") {
		t.Errorf("OpenAI's SDK: %+v, want a RateLimitError saying the request is too large, not retried", openai)
	}
}

// A refusal by a cap on requests in flight names no wait, and OpenAI's SDK
// retries it on its own backoff (about half a second, then a second),
// getting through once the request that held the slot has ended.
func TestOpenAIsSDKRetriesARefusalByACapOnRequestsInFlightOnItsOwnBackoff(t *testing.T) {
	up := newFakeUpstream(t, answerAsEachAPI)
	gw := startGateway(t, up.URL, `
	rolter_ratelimit {
		scope sdk_in_flight {http.request.header.Authorization}
		limit sdk_in_flight * concurrent 1
	}
	reverse_proxy {upstream}`)
	key := redistest.UniqueID(t)
	held, holder := make(chan struct{}), heldRequest(t, gw.url+"/v1/chat/completions", "Bearer sk-"+key)
	go func() {
		defer close(held)
		res, err := http.DefaultClient.Do(holder)
		if err == nil {
			res.Body.Close()
		}
	}()
	<-up.arrived
	refusals := func() string {
		res, err := http.Get(fmt.Sprintf("http://localhost:%d/metrics", caddyAdmin()))
		if err != nil {
			return ""
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		for line := range strings.Lines(string(body)) {
			if strings.HasPrefix(line, `caddy_rolter_ratelimit_refusals_total{kind="concurrency",scope="sdk_in_flight"`) {
				return line
			}
		}
		return ""
	}
	before := refusals()
	go func() {
		// The held request ends once the SDK's first try was refused.
		poll.Until(2*waitBound, pollEvery, func() error {
			if refusals() == before {
				return errors.New("no refusal yet")
			}
			return nil
		})
		up.release()
	}()
	var report struct {
		Answered                           bool
		Statuses                           []int
		FirstRetryAfter, FirstRetryAfterMs string
		RetriedAfterMs                     int
		Error                              string
	}
	runSDK(t, "openai-inflight.mjs", gw.url, key, &report)
	<-held
	if !report.Answered || len(report.Statuses) != 2 || report.Statuses[0] != 429 || report.Statuses[1] != 200 {
		t.Fatalf("OpenAI's SDK: %+v, want a 429, then its own retry answered 200", report)
	}
	if report.FirstRetryAfter != "" || report.FirstRetryAfterMs != "" {
		t.Fatalf("the refusal announced a wait (Retry-After %q, retry-after-ms %q): none is known", report.FirstRetryAfter, report.FirstRetryAfterMs)
	}
	if report.RetriedAfterMs < 300 || report.RetriedAfterMs > 3000 {
		t.Fatalf("the SDK retried after %d ms, want its own backoff of about 375 to 500 ms", report.RetriedAfterMs)
	}
}

// heldRequest is a chat completion request to url with the Authorization
// header auth, which the test upstream holds (X-Upstream: held).
func heldRequest(t *testing.T, url, auth string) *http.Request {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hold"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Upstream", upstreamHeld)
	return req
}
