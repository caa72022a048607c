package ratelimit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
	"github.com/rolter/caddy-ratelimit/internal/usage"
	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// meteredChain is a gateway site on store whose chain of three scopes all
// have a tpm, charged reactively: what the tests of metering look at is
// what each response reports.
func meteredChain(t *testing.T, store, upstreamURL string) *gateway {
	return startGateway(t, upstreamURL, limited(store, `
		scope key {http.request.header.Authorization}
		scope team {http.request.header.X-Team}
		scope org {http.request.header.X-Org}
		limit key * rpm 1000 tpm 100000000
		limit team * tpm 100000000
		limit org * rpm 1000 tpm 100000000
		reserve_tokens off`))
}

// ids is one request's scope ids, unique to a test.
type ids struct{ key, team, org string }

func newIDs(t *testing.T) ids {
	return ids{key: "Bearer sk-" + redistest.UniqueID(t), team: redistest.UniqueID(t), org: redistest.UniqueID(t)}
}

func (i ids) headers() []string {
	return []string{"Authorization: " + i.key, "X-Team: " + i.team, "X-Org: " + i.org}
}

func (i ids) limits() []limiter.Limit {
	return []limiter.Limit{
		newLimit("key", limiter.KeyID(false, i.key), 0, 1),
		newLimit("team", limiter.KeyID(false, i.team), 0, 1),
		newLimit("org", limiter.KeyID(false, i.org), 0, 1),
	}
}

// windowNow is what l's window k holds in the store's current period and
// the one before it.
func windowNow(t *testing.T, store string, l limiter.Limit, k limiter.WindowKind) limiter.Window {
	var caps limiter.WindowCaps
	caps[k] = limiter.MaxCap // a peek reads only the windows a limit caps
	c := limiter.CapsOfWindows(caps)
	l.Caps = &c
	return peekInStore(t, store, l).Counts[0].Window[k]
}

// windowHolds is what l's window k holds in its current period and the last
// (a charge may land just before a period boundary).
func windowHolds(t *testing.T, store string, l limiter.Limit, k limiter.WindowKind) int64 {
	w := windowNow(t, store, l, k)
	return w.Cur + w.Prev
}

// waitCharged waits until every limit's token windows hold want tokens in
// store. The charge runs after the response, in the background: poll for it.
func waitCharged(t *testing.T, store string, chain []limiter.Limit, want int64) {
	t.Helper()
	waitWindow(t, store, chain, limiter.TPM, want)
}

// waitWindow waits until window k of every limit of chain holds want.
func waitWindow(t *testing.T, store string, chain []limiter.Limit, k limiter.WindowKind, want int64) {
	t.Helper()
	eventually(t, func() error {
		for _, l := range chain {
			if got := windowHolds(t, store, l, k); got != want {
				return fmt.Errorf("scope %s: %s holds %d, want %d", l.Scope, k, got, want)
			}
		}
		return nil
	})
}

// assertNothingCharged sends a metered sentinel request on the same chain,
// waits for its charge, and checks that it is all the chain holds.
func assertNothingCharged(t *testing.T, store string, gw *gateway, id ids) {
	t.Helper()
	gw.get(t, "/samples/openai_completions.json?coding=identity", id.headers()...)
	waitCharged(t, store, id.limits(), 12)
}

// get asks for a body as a client that decodes nothing itself (a
// hand-set Accept-Encoding keeps Go's transport from decoding).
func (g *gateway) get(t *testing.T, path string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	return g.send(t, "GET", path, "", append([]string{"Accept-Encoding: gzip, deflate, br, zstd"}, headers...)...)
}

func TestEveryResponseShapeChargesEveryScopeAndReachesTheClientByteForByte(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerSamples(t))
		gw := meteredChain(t, store, up.URL)
		for _, g := range usagetest.Goldens {
			codings := []string{"identity", "gzip"}
			if g.File == "openai_chat_stream.sse" || g.File == "anthropic_messages.json" {
				codings = append(codings, "deflate", "br", "zstd")
			}
			for _, coding := range codings {
				t.Run(g.File+"/"+coding, func(t *testing.T) {
					id := newIDs(t)
					res, body := gw.get(t, "/samples/"+g.File+"?coding="+coding, id.headers()...)
					if res.StatusCode != 200 {
						t.Fatalf("status %d", res.StatusCode)
					}
					if want := usagetest.Encode(t, coding, usagetest.Read(t, g.File)); !bytes.Equal(body, want) {
						t.Fatalf("the client got %d bytes that differ from the upstream's %d", len(body), len(want))
					}
					if !g.Metered {
						assertNothingCharged(t, store, gw, id)
						return
					}
					waitCharged(t, store, id.limits(), g.Tokens)
				})
			}
		}
	})
}

func TestTPMCapRefusesWithTypeTokensOnceChargedUsageFillsIt(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerSamples(t))
		gw := startGateway(t, up.URL, limited(store, `
			scope org {http.request.header.X-Org} readable
			limit org * rpm 100 tpm 1000`))
		org := redistest.UniqueID(t)
		if res, _ := gw.get(t, "/samples/openai_chat.json?coding=gzip", "X-Org: "+org); res.StatusCode != 200 {
			t.Fatalf("first request %d", res.StatusCode)
		}
		waitCharged(t, store, []limiter.Limit{newLimit("org", org, 0, 1)}, 1163)
		res, body := gw.get(t, "/samples/openai_chat.json?coding=gzip", "X-Org: "+org)
		if res.StatusCode != 429 {
			t.Fatalf("with 1163 of tpm 1000 charged: %d, want 429", res.StatusCode)
		}
		var e openAIError
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Type != "tokens" || !strings.Contains(e.Error.Message, "1000 TPM") {
			t.Fatalf("refusal body %s", body)
		}
	})
}

func TestClientLeavingMidStreamIsChargedWhatTheStreamReportedByThen(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		// The rest of the answer never comes before the client leaves.
		mode, gone := answerCutStreams(cutStream{path: "/v1/messages", events: []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}",
		}})
		up := newFakeUpstream(t, mode)
		gw := meteredChain(t, store, up.URL)
		id := newIDs(t)
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", gw.url+"/v1/messages", nil)
		setHeaders(req, id.headers())
		res, err := gw.tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(res.Body).ReadString('\n')
		if err != nil || line != "event: message_start\n" {
			t.Fatalf("first line %q %v", line, err)
		}
		cancel() // the client goes away mid-stream
		res.Body.Close()
		<-gone
		waitCharged(t, store, id.limits(), 26)
	})
}

func TestStreamUsageIsRequestedUpstreamAndItsChunkHiddenFromAClientThatDidNotAsk(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		sample := usagetest.Read(t, "openai_chat_stream.sse")
		up := newFakeUpstream(t, answerStream(sample, 61, false))
		gw := meteredChain(t, store, up.URL)
		includesUsage := func(r upstreamRequest) bool {
			var req struct {
				StreamOptions struct {
					IncludeUsage bool `json:"include_usage"`
				} `json:"stream_options"`
			}
			json.Unmarshal(r.body, &req)
			return req.StreamOptions.IncludeUsage
		}

		// A client that did not ask: usage requested, the chunk removed.
		id := newIDs(t)
		_, got := gw.postChat(t, `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"<b>hi</b> & bye"}]}`, id.headers()...)
		up1 := up.lastRequest(t)
		if !includesUsage(up1) || up1.header.Get("Accept-Encoding") != "identity" || up1.contentLength != int64(len(up1.body)) {
			t.Fatalf("upstream saw %s (Accept-Encoding %q, Content-Length %d): want include_usage, identity and a correct Content-Length",
				up1.body, up1.header.Get("Accept-Encoding"), up1.contentLength)
		}
		if want := withoutUsageChunk(t, sample); !bytes.Equal(got, want) {
			t.Fatalf("client got:\n%s\nwant the stream without its usage chunk:\n%s", got, want)
		}
		waitCharged(t, store, id.limits(), 31)

		// A client that asked gets the stream as it is.
		id = newIDs(t)
		_, got = gw.postChat(t, `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[]}`, id.headers()...)
		if !includesUsage(up.lastRequest(t)) {
			t.Fatal("the client's own include_usage did not reach the upstream")
		}
		if !bytes.Equal(got, sample) {
			t.Fatalf("a client that asked for usage got a changed stream:\n%s", got)
		}
		waitCharged(t, store, id.limits(), 31)
	})
}

// The upstream gets the client's body byte for byte, key order, keys given
// twice, whitespace, numbers and escapes as sent, plus only the option.
func TestUpstreamReceivesTheClientsBytesPlusOnlyTheStreamUsageOption(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerStream(usagetest.Read(t, "openai_chat_stream.sse"), 61, false))
		gw := meteredChain(t, store, up.URL)
		// A conversation indented, with "stream" twice, the last one escaped.
		conversation := `{
  "stream": false,
  "model": "gpt-4o",
  "temperature": 1.0E+0,
  "messages": [{"role": "user", "content": "caf\u00e9 <b>&</b> \/ café"}],
  "stre\u0061m": true
}
`
		for _, c := range []struct{ sent, want string }{
			{conversation, strings.TrimSuffix(conversation, "}\n") + `,"stream_options":{"include_usage":true}}` + "\n"},
			{`{"stream":true, "stream_options": {"include_usage": true, "include_usage" :false, "x":[]},"model":"gpt-4o","messages":[]}`,
				`{"stream":true, "stream_options": {"include_usage": true, "include_usage" :true, "x":[]},"model":"gpt-4o","messages":[]}`},
		} {
			gw.postChat(t, c.sent, newIDs(t).headers()...)
			if got := up.lastRequest(t).body; string(got) != c.want {
				t.Fatalf("the client sent\n%s\nthe upstream got\n%s\nwant\n%s", c.sent, got, c.want)
			}
		}
	})
}

// A stream whose usage chunk the gateway removes is shorter than the
// upstream's Content-Length says: the client must get it whole all the same.
func TestStrippedStreamReachesTheClientWholeWhenTheUpstreamSentAContentLength(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		sample := usagetest.Read(t, "openai_chat_stream.sse")
		up := newFakeUpstream(t, answerStream(sample, 61, true))
		gw := meteredChain(t, store, up.URL)
		id := newIDs(t)
		res, got := gw.postChat(t, `{"model":"gpt-4o","stream":true,"messages":[]}`, id.headers()...) // fails on a body cut short
		if want := withoutUsageChunk(t, sample); !bytes.Equal(got, want) {
			t.Fatalf("client got:\n%s\nwant the stream without its usage chunk:\n%s", got, want)
		}
		if res.ContentLength != -1 {
			t.Fatalf("the shortened stream declared a Content-Length of %d", res.ContentLength)
		}
		waitCharged(t, store, id.limits(), 31)
	})
}

// withoutUsageChunk is the stream minus the bytes of its usage-only event.
func withoutUsageChunk(t *testing.T, stream []byte) []byte {
	var cut [2]int64
	s := usage.NewSSEScanner(usage.MaxEvent, func(ev usage.SSEEvent) {
		if usage.IsUsageOnlyChunk(ev.Data) {
			cut = [2]int64{ev.Start, ev.End}
		}
	})
	s.Write(stream)
	s.Flush()
	if cut[1] == 0 {
		t.Fatal("the sample has no usage chunk")
	}
	return append(append([]byte(nil), stream[:cut[0]]...), stream[cut[1]:]...)
}

func TestResponseWithAnEventOverTheCapIsUnmeteredAndUntouched(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		padding := strings.Repeat("x", usage.MaxEvent+1024)
		stream := []byte("event: message_delta\ndata: {\"type\":\"message_delta\",\"pad\":\"" + padding + "\",\"usage\":{\"input_tokens\":5,\"output_tokens\":7}}\n\n")
		up := newFakeUpstream(t, answerStream(stream, 32<<10, false))
		gw := meteredChain(t, store, up.URL)
		id := newIDs(t)
		_, body := gw.get(t, "/v1/messages", id.headers()...)
		if !bytes.Equal(body, stream) {
			t.Fatalf("client got %d bytes, want the upstream's %d unchanged", len(body), len(stream))
		}
		// The sentinel goes to a sample upstream on the same chain.
		sentinel := meteredChain(t, store, newFakeUpstream(t, answerSamples(t)).URL)
		assertNothingCharged(t, store, sentinel, id)
	})
}

// A response is charged at most the output its request caps itself at,
// times its choices, since providers count reasoning and thinking inside
// that cap: a report of 1e20 tokens charges max_tokens 10 as 10 output
// tokens, and max_completion_tokens 10 with n 3 as 30. A request without a
// cap, or whose choices are not a count, is charged at most the fixed
// ceiling for each of its choices. Each clamp is counted in
// usage_clamped_total.
func TestAResponseIsChargedAtMostItsRequestsOwnOutputCapTimesItsChoices(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		absurd := up.json(absurdCompletion)
		gw := startGateway(t, up.URL, limited(store, `
			scope org {http.request.header.X-Org} readable
			limit org * tpm 2000000000 itpm 2000000000 otpm 2000000000`))
		metric := `caddy_rolter_ratelimit_usage_clamped_total{what="response"}`
		const messages = `"messages":[{"role":"user","content":"hi"}]`
		for _, c := range []struct {
			what, body string
			output     int64
		}{
			{"max_tokens 10", `{"model":"gpt-4o","max_tokens":10,` + messages + `}`, 10},
			{"max_completion_tokens 10 and n 3", `{"model":"gpt-4o","max_completion_tokens":10,"n":3,` + messages + `}`, 30},
			{"no cap and n 2", `{"model":"gpt-4o","n":2,` + messages + `}`, 2 * maxResponseOutput},
			// An n the gateway cannot read as a count may be read as one
			// upstream: the request's output is unknown.
			{"max_tokens 10 and n \"3\"", `{"model":"gpt-4o","max_tokens":10,"n":"3",` + messages + `}`, maxResponseOutput},
			// A cap given in two ways may be read either way upstream (a Go
			// struct reads MAX_TOKENS as max_tokens, and the last of them).
			{"max_tokens 10 beside MAX_TOKENS 4096", `{"model":"gpt-4o","max_tokens":10,"MAX_TOKENS":4096,` + messages + `}`, maxResponseOutput},
			{"max_tokens 10 beside max_completion_tokens 4096", `{"model":"gpt-4o","max_tokens":10,"max_completion_tokens":4096,` + messages + `}`, maxResponseOutput},
		} {
			org := redistest.UniqueID(t)
			clamped := scrape(t)[metric]
			if res, body := gw.postChat(t, c.body, "X-Org: "+org, absurd); res.StatusCode != 200 {
				t.Fatalf("%s: %d %s", c.what, res.StatusCode, body)
			}
			waitMetric(t, metric, clamped+1)
			waitWindow(t, store, orgTokens(org), limiter.OTPM, c.output)
			waitWindow(t, store, orgTokens(org), limiter.ITPM, maxResponseInput)
			waitCharged(t, store, orgTokens(org), maxResponseInput+c.output)
		}
	})
}

// A budget is charged what the clamped usage costs: a report of 1e20 tokens
// for a gpt-4o request capped at 100 output tokens costs its input at the
// ceiling and 100 output tokens ($25.001), not a million ($35).
func TestAnAbsurdReportChargesABudgetNoMoreThanTheRequestsOwnOutputCap(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := flightGatewayTo(t, up.URL, store, teamLines+`
			limit team * budget_day 100
			price gpt-4o input 2.50 output 10`)
		team := redistest.UniqueID(t)
		answer := up.json(openAIUsage(`{"prompt_tokens":1e20,"completion_tokens":1e20,"total_tokens":1e20}`))
		if res, body := openAICall("gpt-4o", false).send(t, gw, "X-Team: "+team, answer); res.StatusCode != 200 {
			t.Fatalf("%d %s", res.StatusCode, body)
		}
		waitSettled(t, caddyAdmin(), team, maxResponseInput*2500+budgetMaxTokens*10_000)
	})
}

// cutStream is a stream the upstream sends up to a point and then holds
// until its client has gone: the events are sent, and once the client has
// read the line last, it leaves.
type cutStream struct {
	path, body string
	events     []string // each event's lines, without the blank line that ends it
	last       string   // the last line the client reads before it leaves
}

// leaveAt sends s through gw with the header lines, reads the answer up to
// s.last, leaves, and returns once the upstream has seen the gateway give
// the request up.
func (s cutStream) leaveAt(t *testing.T, gw *gateway, upstreamGone <-chan struct{}, headers ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", gw.url+s.path, strings.NewReader(s.body))
	if err != nil {
		t.Fatal(err)
	}
	setHeaders(req, append([]string{"Content-Type: application/json"}, headers...))
	res, err := gw.tester.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(res.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended (%v) before the client read %q", err, s.last)
		}
		if strings.TrimRight(line, "\r\n") == s.last {
			break
		}
	}
	cancel() // the client goes away
	res.Body.Close()
	<-upstreamGone
}

// A stream the client leaves before its final report (each API's terminal
// event) is charged, count by count, the larger of what it reported and
// what it reserved: an Anthropic stream read to its last text but not to
// message_delta (message_start's output_tokens 1 is no final count), and a
// Gemini stream whose chunks so far carry only the prompt's count. What a
// client reads and leaves is charged at least its reservation, on every
// window: tpm, itpm and otpm.
func TestAStreamTheClientLeavesBeforeItsFinalReportIsChargedAtLeastItsReservation(t *testing.T) {
	const prompt = `"Price every token of this prompt exactly"` // 10 tokens
	anthropic := cutStream{
		path: "/v1/messages",
		body: `{"model":"claude-sonnet-4-5","max_tokens":500,"stream":true,"messages":[{"role":"user","content":` + prompt + `}]}`,
		events: []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}",
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"All the answer the client wants.\"}}",
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
		},
		last: `data: {"type":"content_block_stop","index":0}`,
	}
	gemini := cutStream{
		path: "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
		body: `{"contents":[{"parts":[{"text":` + prompt + `}]}],"generationConfig":{"maxOutputTokens":300}}`,
		events: []string{
			`data: {"candidates":[{"content":{"parts":[{"text":"All the"}],"role":"model"}}],"usageMetadata":{"promptTokenCount":15,"totalTokenCount":15}}`,
			`data: {"candidates":[{"content":{"parts":[{"text":" answer."}],"role":"model"}}],"usageMetadata":{"promptTokenCount":15,"totalTokenCount":15}}`,
		},
		last: `data: {"candidates":[{"content":{"parts":[{"text":" answer."}],"role":"model"}}],"usageMetadata":{"promptTokenCount":15,"totalTokenCount":15}}`,
	}
	eachStore(t, func(t *testing.T, store string) {
		mode, gone := answerCutStreams(anthropic, gemini)
		up := newFakeUpstream(t, mode)
		gw := startGateway(t, up.URL, limited(store, `
			scope org {http.request.header.X-Org} readable
			limit org * tpm 100000 itpm 100000 otpm 100000`))
		for _, c := range []struct {
			what                 string
			stream               cutStream
			total, input, output int64
		}{
			// input: the 25 reported over the 10 estimated; output: the
			// 500 of max_tokens over the 1 reported.
			{"anthropic", anthropic, 25 + 500, 25, 500},
			// input: the 15 reported over the 10 estimated; output: the
			// 300 of maxOutputTokens.
			{"gemini", gemini, 15 + 300, 15, 300},
		} {
			org := redistest.UniqueID(t)
			charged := scrape(t)[`caddy_rolter_ratelimit_tokens_charged_total{kind="total",model=""}`]
			c.stream.leaveAt(t, gw, gone, "X-Org: "+org)
			waitMetric(t, `caddy_rolter_ratelimit_tokens_charged_total{kind="total",model=""}`, charged+float64(c.total))
			waitCharged(t, store, orgTokens(org), c.total)
			waitWindow(t, store, orgTokens(org), limiter.ITPM, c.input)
			waitWindow(t, store, orgTokens(org), limiter.OTPM, c.output)
		}
	})
}
