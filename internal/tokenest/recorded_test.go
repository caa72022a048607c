package tokenest

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
	"github.com/rolter/caddy-ratelimit/internal/usage"
	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// TestInputEstimatesAgainstRecordedUsage measures, on real requests and the
// input their provider counted, how far the input estimate falls below the
// real count: what an admission's reservation can miss until the response
// settles it. A request that declares no tools is counted at most half
// again its estimate plus 40 tokens (the providers' framing of messages,
// and Anthropic's of extended thinking). A request that declares tools is
// only logged: the providers add a tool-use system prompt of hundreds of
// tokens, and server-side tools (web search, URL fetch) add what they
// fetched, thousands of tokens that no estimate of the request can see.
// Everything goes in its log (go test -v).
func TestInputEstimatesAgainstRecordedUsage(t *testing.T) {
	entries, read := usagetest.Recorded(t)
	var ratios []float64
	for _, e := range entries {
		if e.Request.Body == "" || e.IdentityFile != "" || strings.HasSuffix(e.File, ".jsonl") {
			continue // no request, a compressed twin, or a realtime session
		}
		body := read(e.File)
		m := usage.NewMeter(http.Header{"Content-Type": {e.ContentType}})
		m.Write(body)
		u, ok := m.Finish()
		// The input the provider counted: Anthropic's cache reads come on
		// top of its input, the others' are inside it.
		real := u.Input
		if e.Provider == "anthropic" {
			real += u.CacheRead
		}
		if !ok || real <= 0 {
			continue
		}
		est := Of(llmapi.Of(e.APIPath), []byte(e.Request.Body)).Input
		ratio := float64(real) / float64(max(est, 1))
		tools := strings.Contains(e.Request.Body, `"tools"`)
		t.Logf("%-52s estimate %6d, real %6d (%+d), real/estimate %6.2f, tools %v", e.File, est, real, real-est, ratio, tools)
		if tools {
			continue
		}
		ratios = append(ratios, ratio)
		if real > est+est/2+40 {
			t.Errorf("%s: the real input %d is over half again the estimate %d plus 40", e.File, real, est)
		}
	}
	if len(ratios) == 0 {
		t.Skip("no entry with a request body and a reported input")
	}
	slices.Sort(ratios)
	t.Logf("%d requests without tools: real/estimate median %.2f, max %.2f", len(ratios), ratios[len(ratios)/2], ratios[len(ratios)-1])
}
