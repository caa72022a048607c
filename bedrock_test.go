package ratelimit

// AWS Bedrock and Cohere end to end: their answers in each shape they
// come in, charged exactly what they report; and their clients' own SDKs
// (testdata/sdk: the AWS SDK for JavaScript v3, Cohere's v2) through a
// real Caddy, reading the gateway's refusals as their providers' own.

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// bedrockEvent is one event of a Bedrock stream: its type and its JSON.
type bedrockEvent struct{ typ, payload string }

// eventStream is the events as Bedrock streams them: AWS event-stream
// messages, made by the AWS SDK's own encoder.
func eventStream(t testing.TB, events ...bedrockEvent) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := eventstream.NewEncoder()
	for _, e := range events {
		var h eventstream.Headers
		h.Set(":event-type", eventstream.StringValue(e.typ))
		h.Set(":content-type", eventstream.StringValue("application/json"))
		h.Set(":message-type", eventstream.StringValue("event"))
		if err := enc.Encode(&b, eventstream.Message{Headers: h, Payload: []byte(e.payload)}); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// invokeChunks is a model's own events as InvokeModelWithResponseStream
// streams them: each the bytes of a chunk event, in base64, beside the
// padding Bedrock adds.
func invokeChunks(t testing.TB, events ...string) []byte {
	t.Helper()
	chunks := make([]bedrockEvent, len(events))
	for i, e := range events {
		payload, err := json.Marshal(map[string]any{"bytes": []byte(e), "p": "abcdefghijklmnopq"})
		if err != nil {
			t.Fatal(err)
		}
		chunks[i] = bedrockEvent{"chunk", string(payload)}
	}
	return eventStream(t, chunks...)
}

// What the stand-in Bedrock and Cohere answer, and what each costs at
// bedrockPrices: $3 per million input tokens (3000 nano-dollars a token),
// $15 output (15_000), $0.30 a cache read (300), $3.75 a cache write
// (3750). The counts differ from answer to answer, so that a charge tells
// which counts it took.
const (
	bedrockPrices = "price * input 3 output 15 cache_read 0.3 cache_write 3.75"

	// Converse reports its uncached input apart from its cache reads and
	// writes: the whole input is 11 + 5 + 3.
	converseAnswer = `{"output":{"message":{"role":"assistant","content":[{"text":"Hi"}]}},"stopReason":"end_turn",` +
		`"usage":{"inputTokens":11,"outputTokens":7,"totalTokens":26,"cacheReadInputTokens":5,"cacheWriteInputTokens":3},"metrics":{"latencyMs":210}}`
	converseCost = 11*3000 + 5*300 + 3*3750 + 7*15_000 // 150_750

	converseStreamCost = 13*3000 + 9*15_000 // 174_000

	// InvokeModel answers Anthropic's body, and Bedrock's headers count
	// the same tokens: charged once.
	invokeAnswer = `{"id":"msg_bdrk_01","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[{"type":"text","text":"Hi"}],` +
		`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":17,"cache_creation_input_tokens":2,"cache_read_input_tokens":6,"output_tokens":4}}`
	invokeCost = 17*3000 + 6*300 + 2*3750 + 4*15_000 // 120_300

	invokeStreamCost = 19*3000 + 12*15_000 // 237_000

	// Cohere bills 5 input tokens of the 71 its model read.
	cohereAnswer = `{"id":"5a50480a-cf52-46f0-af01-53d18539bd31","message":{"role":"assistant","content":[{"type":"text","text":"Hi"}]},"finish_reason":"COMPLETE",` +
		`"usage":{"billed_units":{"input_tokens":5,"output_tokens":7},"tokens":{"input_tokens":71,"output_tokens":7},"cached_tokens":0}}`
	cohereCost = 5*3000 + 7*15_000 // 120_000

	cohereStreamCost = 6*3000 + 9*15_000 // 153_000

	// bedrockReservation is what a request of budgetCall's prompt and
	// max_tokens 100 reserves of a budget at bedrockPrices: 10 input
	// tokens at the dearest input price, a cache write's, and 100 at the
	// output price.
	bedrockReservation = 10*3750 + 100*15_000 // 1_537_500
)

// converseStreamEvents are ConverseStream's events: the usage comes last,
// in the metadata event.
var converseStreamEvents = []bedrockEvent{
	{"messageStart", `{"role":"assistant"}`},
	{"contentBlockDelta", `{"contentBlockIndex":0,"delta":{"text":"Hi"}}`},
	{"contentBlockDelta", `{"contentBlockIndex":0,"delta":{"text":" there"}}`},
	{"contentBlockStop", `{"contentBlockIndex":0}`},
	{"messageStop", `{"stopReason":"end_turn"}`},
	{"metadata", `{"usage":{"inputTokens":13,"outputTokens":9,"totalTokens":22},"metrics":{"latencyMs":300}}`},
}

// invokeStreamEvents are Anthropic's events as a model on Bedrock streams
// them: the last with Bedrock's own count of the invocation, the same
// tokens as Anthropic's message_start and message_delta report.
var invokeStreamEvents = []string{
	`{"type":"message_start","message":{"id":"msg_bdrk_02","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":19,"output_tokens":1}}}`,
	`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
	`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
	`{"type":"content_block_stop","index":0}`,
	`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":12}}`,
	`{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":19,"outputTokenCount":12,"invocationLatency":412,"firstByteLatency":198}}`,
}

// cohereStream is Cohere's v2 chat stream: its billed units come in the
// message-end event.
var cohereStream = strings.Join([]string{
	"event: message-start\n" + `data: {"id":"0b6a9f4e-3d5c-4b34-9d8e-1f2a3b4c5d6e","type":"message-start","delta":{"message":{"role":"assistant","content":[],"tool_plan":"","tool_calls":[],"citations":[]}}}`,
	"event: content-start\n" + `data: {"type":"content-start","index":0,"delta":{"message":{"content":{"type":"text","text":""}}}}`,
	"event: content-delta\n" + `data: {"type":"content-delta","index":0,"delta":{"message":{"content":{"text":"Hi"}}}}`,
	"event: content-end\n" + `data: {"type":"content-end","index":0}`,
	"event: message-end\n" + `data: {"type":"message-end","delta":{"finish_reason":"COMPLETE","usage":{"billed_units":{"input_tokens":6,"output_tokens":9},"tokens":{"input_tokens":72,"output_tokens":9}}}}`,
}, "\n\n") + "\n\n"

// bedrockAnswer is what the stand-in answers a request of path: the body,
// its Content-Type, and Bedrock's token-count headers for InvokeModel.
func bedrockAnswer(t testing.TB, path string, stream bool) (body []byte, contentType string, header http.Header) {
	const events = "application/vnd.amazon.eventstream"
	switch {
	case strings.HasSuffix(path, "/converse"):
		return []byte(converseAnswer), "application/json", nil
	case strings.HasSuffix(path, "/converse-stream"):
		return eventStream(t, converseStreamEvents...), events, nil
	case strings.HasSuffix(path, "/invoke"):
		return []byte(invokeAnswer), "application/json", http.Header{
			"X-Amzn-Bedrock-Input-Token-Count": {"17"}, "X-Amzn-Bedrock-Output-Token-Count": {"4"},
			"X-Amzn-Bedrock-Cache-Read-Input-Token-Count": {"6"}, "X-Amzn-Bedrock-Cache-Write-Input-Token-Count": {"2"},
		}
	case strings.HasSuffix(path, "/invoke-with-response-stream"):
		return invokeChunks(t, invokeStreamEvents...), events, nil
	case stream:
		return []byte(cohereStream), "text/event-stream", nil
	}
	return []byte(cohereAnswer), "application/json", nil
}

// answerAsBedrockAndCohere answers Bedrock's four runtime APIs and
// Cohere's v2 chat in their shapes (bedrockAnswer), in small flushed
// writes, so that an event-stream message comes in pieces. A request with
// X-Upstream: gzip gets its answer gzip-encoded; X-Upstream: corrupt gets
// it with its last byte changed, the last message's CRC.
func answerAsBedrockAndCohere(t testing.TB) upstreamMode {
	return func(_ *fakeUpstream, w http.ResponseWriter, r *http.Request) {
		sent, _ := io.ReadAll(r.Body)
		body, contentType, header := bedrockAnswer(t, r.URL.Path, bytes.Contains(sent, []byte(`"stream":true`)))
		for name, values := range header {
			w.Header()[name] = values
		}
		w.Header().Set("Content-Type", contentType)
		switch r.Header.Get("X-Upstream") {
		case "gzip":
			var z bytes.Buffer
			zw := gzip.NewWriter(&z)
			zw.Write(body)
			zw.Close()
			body = z.Bytes()
			w.Header().Set("Content-Encoding", "gzip")
		case "corrupt":
			body = bytes.Clone(body)
			body[len(body)-1] ^= 0xff
		}
		writeInFlushedChunks(w, body, 13)
	}
}

// bedrockLines are the limiter of the Bedrock and Cohere tests: a key
// (the credential each API reads) with a day budget, a model of the
// path (Bedrock's) or the body (Cohere's), and every model priced at
// bedrockPrices.
func bedrockLines(budgets string) string {
	return `scope key {http.rolter_ratelimit.api_key} readable
		scope model {http.rolter_ratelimit.model} readable
		limit key * budget_day 1
		` + budgets + "\n" + bedrockPrices
}

// waitKeySpent waits until key's day budget holds nothing reserved and spent
// nano-dollars spent, in the live view of the Caddy on admin.
func waitKeySpent(t *testing.T, admin int, key string, spent int64) {
	t.Helper()
	waitLiveViewAt(t, admin, "scope=key&id="+key, func(v UsageView) bool {
		b := v.Limits[0].BudgetDay
		return len(v.Limits) > 0 && b != nil && b.Reserved == "0.00" && nanoUSD(t, b.Spent) == spent
	})
}

// Each shape Bedrock and Cohere answer in is charged exactly what it
// reports, and reaches the client byte for byte: Converse's JSON, whose
// input is its uncached input and its cache reads and writes, each at its
// price; ConverseStream's event stream, whole and gzip-encoded;
// InvokeModel's Anthropic body beside Bedrock's count headers, charged
// once; InvokeModelWithResponseStream's Anthropic chunks beside Bedrock's
// invocation metrics, charged once; Cohere's billed units, not the tokens
// its model read, in JSON and in its stream. An event stream whose last
// message fails its CRC is charged the request's reservation.
func TestEachBedrockAndCohereAnswerIsChargedExactlyWhatItReportsAndReachesTheClientUnchanged(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerAsBedrockAndCohere(t))
		gw := flightGatewayTo(t, up.URL, store, bedrockLines(""))
		const model = "us.anthropic.claude-sonnet-4-20250514-v1:0"
		converse := fmt.Sprintf(`{"messages":[{"role":"user","content":[{"text":%q}]}],"inferenceConfig":{"maxTokens":%d}}`, budgetPrompt, budgetMaxTokens)
		invoke := fmt.Sprintf(`{"anthropic_version":"bedrock-2023-05-31","max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, budgetMaxTokens, budgetPrompt)
		cohere := fmt.Sprintf(`{"model":"command-a-03-2025","messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":%%t}`, budgetPrompt, budgetMaxTokens)
		for _, c := range []struct {
			name, path, body, upstream string
			cost                       int64
		}{
			{"Converse", "/model/" + model + "/converse", converse, "", converseCost},
			{"ConverseStream", "/model/" + model + "/converse-stream", converse, "", converseStreamCost},
			{"ConverseStream gzip", "/model/" + model + "/converse-stream", converse, "gzip", converseStreamCost},
			{"InvokeModel", "/model/" + model + "/invoke", invoke, "", invokeCost},
			{"InvokeModelWithResponseStream", "/model/" + model + "/invoke-with-response-stream", invoke, "", invokeStreamCost},
			{"InvokeModelWithResponseStream, a CRC broken", "/model/" + model + "/invoke-with-response-stream", invoke, "corrupt", bedrockReservation},
			{"Cohere", "/v2/chat", fmt.Sprintf(cohere, false), "", cohereCost},
			{"Cohere stream", "/v2/chat", fmt.Sprintf(cohere, true), "", cohereStreamCost},
		} {
			t.Run(c.name, func(t *testing.T) {
				key := redistest.UniqueID(t)
				credential := "Authorization: Bearer " + key
				if strings.HasPrefix(c.path, "/model/") {
					credential = "Authorization: " + sigv4Authorization(key)
				}
				res, got := gw.send(t, "POST", c.path, c.body, "Content-Type: application/json", credential, "X-Upstream: "+c.upstream)
				want, _, _ := bedrockAnswer(t, c.path, strings.Contains(c.body, `"stream":true`))
				if c.upstream == "corrupt" {
					want[len(want)-1] ^= 0xff
				}
				if res.StatusCode != 200 || !bytes.Equal(got, want) {
					t.Fatalf("%d, %d bytes; want 200 and the upstream's %d bytes unchanged", res.StatusCode, len(got), len(want))
				}
				waitKeySpent(t, caddyAdmin(), key, c.cost)
			})
		}
	})
}

// sdkRefusalsGateway is the gateway of the SDKs' tests, in front of the
// stand-in Bedrock and Cohere, and the key its scripts' credentials start
// with: <key>-budget has a day budget that one request fits
// (bedrockReservation of $0.0016, and no second), and the model
// throttled-model a bucket of one request a second.
func sdkRefusalsGateway(t *testing.T, store string) (*gateway, string) {
	up := newFakeUpstream(t, answerAsBedrockAndCohere(t))
	key := redistest.UniqueID(t)
	return flightGatewayTo(t, up.URL, store, bedrockLines(`
		limit key `+key+`-budget budget_day 0.0016
		limit model throttled-model rate 1 burst 1`)), key
}

// bedrockSDKReport is what testdata/sdk/bedrock.mjs prints.
type bedrockSDKReport struct {
	Converse, ConverseStream, Invoke, InvokeStream    bedrockSDKCall
	ThrottledFirst, ThrottledRaised, ThrottledRetried bedrockSDKCall
	BudgetFirst, BudgetRefused                        bedrockSDKCall
	Attempts                                          []bedrockSDKAttempt
}

// bedrockSDKCall is one call of the SDK: its answer, or the error it
// raised, and the attempts it made ($metadata.attempts).
type bedrockSDKCall struct {
	Attempts                         int
	Usage                            map[string]int64
	Metrics                          map[string]int64
	Text                             string
	Error, Message                   string
	Throttling, ServiceQuotaExceeded bool
}

// bedrockSDKAttempt is the answer one attempt got.
type bedrockSDKAttempt struct {
	Key, ErrorType, AmzRetryAfter, RetryAfter string
	Status                                    int
	At                                        int64 // unix milliseconds
}

// The AWS SDK for JavaScript v3 calls Bedrock's four runtime APIs through
// the gateway, each signed with SigV4 by an access key of its own, which
// the gateway's api_key placeholder reads: each call reads the usage the
// stand-in reported, and each key is charged exactly that at its price.
// A call the gateway throttles (a bucket of one a second on its model) is
// raised as ThrottlingException when the SDK may not retry, and with
// retries is retried once, no sooner than the x-amz-retry-after the
// refusal announced, and answered. A spent budget is raised as
// ServiceQuotaExceededException after one attempt, saying that the request
// may cost more than is left: the SDK does not retry it.
func TestTheAWSSDKCallsEachBedrockAPIThroughTheGatewayChargedExactlyAndReadsItsRefusals(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw, key := sdkRefusalsGateway(t, store)
		var r bedrockSDKReport
		runSDK(t, "bedrock.mjs", gw.url, key, &r)

		for _, c := range []struct {
			name, key string
			call      bedrockSDKCall
			usage     map[string]int64
			cost      int64
		}{
			{"Converse", "converse", r.Converse, map[string]int64{"inputTokens": 11, "outputTokens": 7, "totalTokens": 26, "cacheReadInputTokens": 5, "cacheWriteInputTokens": 3}, converseCost},
			{"ConverseStream", "stream", r.ConverseStream, map[string]int64{"inputTokens": 13, "outputTokens": 9, "totalTokens": 22}, converseStreamCost},
			{"InvokeModel", "invoke", r.Invoke, map[string]int64{"input_tokens": 17, "cache_creation_input_tokens": 2, "cache_read_input_tokens": 6, "output_tokens": 4}, invokeCost},
			{"InvokeModelWithResponseStream", "invokestream", r.InvokeStream, map[string]int64{"input_tokens": 19, "output_tokens": 12}, invokeStreamCost},
		} {
			if c.call.Error != "" || c.call.Attempts != 1 || !strings.HasPrefix(c.call.Text, "Hi") || fmt.Sprint(c.call.Usage) != fmt.Sprint(c.usage) {
				t.Errorf("%s: %+v, want answered at once with the usage %v", c.name, c.call, c.usage)
			}
			waitKeySpent(t, caddyAdmin(), key+"-"+c.key, c.cost)
		}
		if m := r.InvokeStream.Metrics; m["inputTokenCount"] != 19 || m["outputTokenCount"] != 12 {
			t.Errorf("InvokeModelWithResponseStream's invocation metrics %v, want 19 and 12", m)
		}

		if r.ThrottledFirst.Error != "" || !r.ThrottledRaised.Throttling || r.ThrottledRaised.Error != "ThrottlingException" || r.ThrottledRaised.Attempts != 1 {
			t.Errorf("throttled: first %+v, then %+v; want the first answered and the next raised as ThrottlingException after one attempt", r.ThrottledFirst, r.ThrottledRaised)
		}
		if r.ThrottledRetried.Error != "" || r.ThrottledRetried.Attempts != 2 {
			t.Errorf("throttled with retries: %+v, want answered at the second attempt", r.ThrottledRetried)
		}
		var throttled []bedrockSDKAttempt
		for _, a := range r.Attempts {
			if a.Key == key+"-throttled" {
				throttled = append(throttled, a)
			}
		}
		if len(throttled) != 4 || throttled[0].Status != 200 || throttled[3].Status != 200 {
			t.Fatalf("the throttled key's attempts %+v, want 200, 429, 429, 200", throttled)
		}
		for _, refused := range throttled[1:3] {
			ms := headerValueInt(t, refused.AmzRetryAfter)
			if refused.Status != 429 || refused.ErrorType != "ThrottlingException" || ms < 1 || ms > 1000 || refused.RetryAfter != "1" {
				t.Errorf("a throttled attempt %+v, want 429 ThrottlingException, x-amz-retry-after the milliseconds until the bucket admits (at most 1000), Retry-After 1", refused)
			}
		}
		if waited, ms := throttled[3].At-throttled[2].At, headerValueInt(t, throttled[2].AmzRetryAfter); waited < ms {
			t.Errorf("the SDK retried %d ms after a refusal that announced %d ms", waited, ms)
		}

		b := r.BudgetRefused
		if r.BudgetFirst.Error != "" || b.Error != "ServiceQuotaExceededException" || !b.ServiceQuotaExceeded || b.Attempts != 1 ||
			!strings.HasPrefix(b.Message, "Not enough budget left for key: this request may cost up to $0.0015375;") {
			t.Errorf("budget: first %+v, then %+v; want the first answered and the next raised as ServiceQuotaExceededException, not retried", r.BudgetFirst, b)
		}
		last := r.Attempts[len(r.Attempts)-1]
		if last.Key != key+"-budget" || last.Status != 400 || last.ErrorType != "ServiceQuotaExceededException" {
			t.Errorf("the budget's refusal %+v, want 400 ServiceQuotaExceededException", last)
		}
	})
}

// headerValueInt is a header's value as a number; the test fails if it
// is not one.
func headerValueInt(t *testing.T, v string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%q is not a number: %v", v, err)
	}
	return n
}

// cohereSDKReport is what testdata/sdk/cohere.mjs prints.
type cohereSDKReport struct {
	Chat, ChatStream, ThrottledFirst, ThrottledRetried, BudgetFirst, BudgetRefused cohereSDKCall
}

// cohereSDKCall is one call of Cohere's SDK and the responses it got.
type cohereSDKCall struct {
	Usage struct {
		BilledUnits map[string]int64 `json:"billedUnits"`
		Tokens      map[string]int64
	}
	Text           string
	Error, Message string
	CohereError    bool
	Status         int
	Responses      []sdkResponse
}

// Cohere's v2 SDK, through the gateway: its chat and its chat stream each
// read the billed units the stand-in reported, and each key is charged
// exactly those at its price, not the tokens the model read. A call the
// gateway throttles is retried by the SDK no sooner than the Retry-After
// the refusal announced, and answered. A spent budget is the SDK's error
// of status 402, after one response: it does not retry it.
func TestCoheresSDKIsChargedItsBilledUnitsAndReadsItsRefusals(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw, key := sdkRefusalsGateway(t, store)
		var r cohereSDKReport
		runSDK(t, "cohere.mjs", gw.url, key, &r)

		for _, c := range []struct {
			name, key string
			call      cohereSDKCall
			billed    string
			cost      int64
		}{
			{"chat", "chat", r.Chat, "map[inputTokens:5 outputTokens:7]", cohereCost},
			{"chat stream", "stream", r.ChatStream, "map[inputTokens:6 outputTokens:9]", cohereStreamCost},
		} {
			if c.call.Error != "" || c.call.Text != "Hi" || fmt.Sprint(c.call.Usage.BilledUnits) != c.billed {
				t.Errorf("%s: %+v, want answered with billed units %s", c.name, c.call, c.billed)
			}
			waitKeySpent(t, caddyAdmin(), key+"-"+c.key, c.cost)
		}

		retried := r.ThrottledRetried.Responses
		if r.ThrottledFirst.Error != "" || r.ThrottledRetried.Error != "" || len(retried) != 2 || retried[0].Status != 429 || retried[1].Status != 200 {
			t.Fatalf("throttled: %+v, then %+v; want the second refused once with 429, retried and answered", r.ThrottledFirst, r.ThrottledRetried)
		}
		if waited, s := retried[1].At-retried[0].At, headerValueInt(t, retried[0].RetryAfter); s != 1 || waited < headerValueInt(t, retried[0].RetryAfterMs) {
			t.Errorf("the SDK retried %d ms after a refusal of Retry-After %d (retry-after-ms %s)", waited, s, retried[0].RetryAfterMs)
		}

		b := r.BudgetRefused
		if r.BudgetFirst.Error != "" || !b.CohereError || b.Status != 402 || len(b.Responses) != 1 ||
			!strings.Contains(b.Message, "Not enough budget left for key: this request may cost up to $0.0015375;") {
			t.Errorf("budget: first %+v, then %+v; want the next raised with status 402 after one response", r.BudgetFirst, b)
		}
	})
}
