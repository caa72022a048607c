package usage

import (
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// UncachedInput is the input read from no prompt cache and written to none:
// the part of Input that a model's input price prices. Per family:
//
//	OpenAI chat    prompt_tokens - prompt_tokens_details.cached_tokens
//	Responses      input_tokens - input_tokens_details.cached_tokens
//	Realtime       input_tokens - input_token_details.cached_tokens
//	Anthropic      input_tokens (cache writes and reads are priced apart),
//	               summed over the iterations where that is larger
//	Gemini         promptTokenCount + toolUsePromptTokenCount - cachedContentTokenCount
//
// a cached count being at most the count it is inside, and a usage object
// that mixes families taking it from its largest family. So, for one family,
// Input is UncachedInput + CacheRead (OpenAI, Gemini: the cached input is
// inside Input) or UncachedInput + CacheWrite (Anthropic: the cache reads
// are beside Input).
func TestUncachedInputIsWhatTheInputPricePrices(t *testing.T) {
	sse := func(docs ...string) string {
		var b strings.Builder
		for _, d := range docs {
			b.WriteString("data: " + d + "\n\n")
		}
		return b.String()
	}
	const (
		typeJSON = "application/json"
		typeSSE  = "text/event-stream"
		// What the rest of Input is, for a single family.
		cacheInside = "Input = UncachedInput + CacheRead"
		cacheBeside = "Input = UncachedInput + CacheWrite"
		mixed       = "" // no identity: each count from its largest family
	)
	compaction := `{"type":"compaction","input_tokens":100,"output_tokens":83,"cache_creation_input_tokens":0,"cache_read_input_tokens":55096}`
	message := `{"type":"message","input_tokens":181,"output_tokens":8,"cache_creation_input_tokens":40,"cache_read_input_tokens":0}`
	cases := []struct {
		name, contentType, body string
		uncached                int64
		rest                    string
	}{
		// OpenAI chat/completions/embeddings.
		{"chat, nothing cached", typeJSON,
			`{"usage":{"prompt_tokens":1117,"completion_tokens":46,"total_tokens":1163,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0}}}`,
			1117, cacheInside},
		{"chat, part cached", typeJSON,
			`{"usage":{"prompt_tokens":1117,"completion_tokens":46,"total_tokens":1163,"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0}}}`,
			1117 - 1024, cacheInside},
		{"chat, all cached", typeJSON,
			`{"usage":{"prompt_tokens":1024,"completion_tokens":46,"prompt_tokens_details":{"cached_tokens":1024}}}`,
			0, cacheInside},
		{"chat, cached above prompt_tokens: at most prompt_tokens", typeJSON,
			`{"usage":{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":64}}}`,
			0, cacheInside},
		{"chat, cached without prompt_tokens", typeJSON,
			`{"usage":{"total_tokens":30,"prompt_tokens_details":{"cached_tokens":10}}}`,
			0, cacheInside},
		{"chat stream, the include_usage chunk", typeSSE,
			sse(`{"choices":[{"delta":{"content":"x"}}],"usage":null}`,
				`{"choices":[],"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920}}}`),
			2006 - 1920, cacheInside},
		{"completions", typeJSON, `{"object":"text_completion","usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`, 5, cacheInside},
		{"embeddings", typeJSON, `{"object":"list","usage":{"prompt_tokens":8,"total_tokens":8}}`, 8, cacheInside},
		// The Responses API: its input_tokens holds the cached tokens that
		// input_tokens_details reports, unlike Anthropic's input_tokens.
		{"responses body", typeJSON,
			`{"id":"resp_1","object":"response","status":"completed","usage":{"input_tokens":3763,"input_tokens_details":{"cached_tokens":3584},` +
				`"output_tokens":44,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":3807}}`,
			3763 - 3584, cacheInside},
		{"responses stream, response.completed", typeSSE,
			sse(`{"type":"response.created","response":{"id":"resp_1","usage":null}}`,
				`{"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":3763,"input_tokens_details":{"cached_tokens":3584},`+
					`"output_tokens":44,"output_tokens_details":{"reasoning_tokens":20},"total_tokens":3807}}}`),
			3763 - 3584, cacheInside},
		{"responses, details before input_tokens", typeJSON,
			`{"response":{"usage":{"input_tokens_details":{"cached_tokens":3584},"input_tokens":3763,"output_tokens":44,"total_tokens":3807}}}`,
			3763 - 3584, cacheInside},
		{"responses, nothing cached", typeJSON,
			`{"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"total_tokens":123}}`,
			36, cacheInside},
		{"responses, cached above input_tokens: at most input_tokens", typeJSON,
			`{"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":50},"output_tokens":1,"total_tokens":11}}`,
			0, cacheInside},
		// The Realtime API's shape, as audio transcriptions send it in a body.
		{"realtime shape in a body", typeJSON,
			`{"text":"Hi.","usage":{"type":"tokens","total_tokens":205,"input_tokens":41,"output_tokens":164,` +
				`"input_token_details":{"text_tokens":14,"audio_tokens":27,"cached_tokens":8,"cached_tokens_details":{"text_tokens":8,"audio_tokens":0}}}}`,
			41 - 8, cacheInside},
		// Anthropic: input_tokens is the uncached input already.
		{"anthropic, no cache", typeJSON, `{"type":"message","usage":{"input_tokens":20,"output_tokens":7}}`, 20, cacheBeside},
		{"anthropic, cache writes and reads", typeJSON,
			`{"type":"message","usage":{"input_tokens":12,"cache_creation_input_tokens":1500,"cache_read_input_tokens":4200,` +
				`"cache_creation":{"ephemeral_5m_input_tokens":1000,"ephemeral_1h_input_tokens":500},"output_tokens":340}}`,
			12, cacheBeside},
		{"anthropic stream, the latest input_tokens", typeSSE,
			sse(`{"type":"message_start","message":{"usage":{"input_tokens":100,"cache_read_input_tokens":50,"output_tokens":1}}}`,
				`{"type":"message_delta","usage":{"input_tokens":90,"cache_creation_input_tokens":5,"output_tokens":70}}`),
			90, cacheBeside},
		// A compacted response: the iterations' input_tokens summed, or the
		// top level's where that is larger.
		{"anthropic compacted body", typeJSON,
			`{"type":"message","usage":{"input_tokens":181,"cache_creation_input_tokens":40,"cache_read_input_tokens":0,"output_tokens":8,` +
				`"iterations":[` + compaction + `,` + message + `]}}`,
			100 + 181, cacheBeside},
		{"anthropic compacted stream", typeSSE,
			sse(`{"type":"message_start","message":{"usage":{"input_tokens":100,"cache_read_input_tokens":55096,"output_tokens":7}}}`,
				`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":181,"cache_creation_input_tokens":40,`+
					`"cache_read_input_tokens":0,"output_tokens":8,"iterations":[`+compaction+`,`+message+`]}}`),
			100 + 181, cacheBeside},
		{"anthropic compacted, the top level larger", typeJSON,
			`{"usage":{"input_tokens":500,"output_tokens":20,"iterations":[{"input_tokens":1,"output_tokens":1},{"input_tokens":2,"output_tokens":1}]}}`,
			500, cacheBeside},
		// Gemini: the cached content is inside promptTokenCount, the tool-use
		// prompt beside it.
		{"gemini, prompt cached", typeJSON,
			`{"usageMetadata":{"promptTokenCount":1208,"candidatesTokenCount":9,"totalTokenCount":1263,"cachedContentTokenCount":1024,"thoughtsTokenCount":46}}`,
			1208 - 1024, cacheInside},
		{"gemini, tool-use prompt", typeJSON,
			`{"usageMetadata":{"promptTokenCount":320,"toolUsePromptTokenCount":1450,"candidatesTokenCount":210,"thoughtsTokenCount":388,"totalTokenCount":2368}}`,
			320 + 1450, cacheInside},
		{"gemini, cached and tool-use prompt", typeJSON,
			`{"usageMetadata":{"promptTokenCount":5210,"toolUsePromptTokenCount":300,"cachedContentTokenCount":4096,"candidatesTokenCount":85,"totalTokenCount":5595}}`,
			5210 + 300 - 4096, cacheInside},
		{"gemini stream, the last snapshot", typeSSE,
			sse(`{"usageMetadata":{"promptTokenCount":5210,"cachedContentTokenCount":4096,"totalTokenCount":5210}}`,
				`{"usageMetadata":{"promptTokenCount":5210,"cachedContentTokenCount":4096,"candidatesTokenCount":30,"totalTokenCount":5240}}`),
			5210 - 4096, cacheInside},
		{"gemini stream, a cached count the last snapshot leaves out is 0", typeSSE,
			sse(`{"usageMetadata":{"promptTokenCount":500,"cachedContentTokenCount":400,"totalTokenCount":500}}`,
				`{"usageMetadata":{"promptTokenCount":500,"candidatesTokenCount":20,"totalTokenCount":520}}`),
			500, cacheInside},
		{"gemini, cached above promptTokenCount: at most promptTokenCount", typeJSON,
			`{"usageMetadata":{"promptTokenCount":10,"toolUsePromptTokenCount":5,"cachedContentTokenCount":50,"candidatesTokenCount":1}}`,
			5, cacheInside},
		// Mixed families: the largest family's, as for the other counts.
		{"chat and anthropic names", typeJSON,
			`{"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":60},` +
				`"input_tokens":100,"output_tokens":5,"cache_read_input_tokens":80}}`,
			max(100-60, 100), mixed},
		{"chat and responses names, both cached", typeJSON,
			`{"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":80},` +
				`"input_tokens":100,"output_tokens":5,"input_tokens_details":{"cached_tokens":80},"total_tokens":105}}`,
			max(100-80, 100-80), mixed},
		{"chat and gemini names", typeJSON,
			`{"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":90},` +
				`"promptTokenCount":50,"cachedContentTokenCount":10,"candidatesTokenCount":5}}`,
			max(100-90, 50-10), mixed},
		{"anthropic and gemini names", typeJSON,
			`{"usage":{"input_tokens":30,"cache_creation_input_tokens":10,"output_tokens":5,` +
				`"promptTokenCount":50,"cachedContentTokenCount":40,"candidatesTokenCount":5}}`,
			max(30, 50-40), mixed},
	}
	for _, c := range cases {
		for _, ch := range usagetest.Chunkings() {
			u, metered := meterUsage(usagetest.Header(c.contentType, ""), ch.Split([]byte(c.body)))
			if !metered || u.UncachedInput != c.uncached {
				t.Errorf("%s (%s): UncachedInput %d (metered %v) in %+v, want %d", c.name, ch.Name, u.UncachedInput, metered, u, c.uncached)
			}
			switch {
			case c.rest == cacheInside && u.Input != u.UncachedInput+u.CacheRead,
				c.rest == cacheBeside && u.Input != u.UncachedInput+u.CacheWrite,
				!partsWithinWholes(u):
				t.Errorf("%s (%s): %+v, want %s", c.name, ch.Name, u, c.rest)
			}
		}
	}

	// Within bounds it by the clamped Input.
	for _, c := range []struct {
		name, body string
		uncached   int64
	}{
		{"chat under the ceiling", `{"usage":{"prompt_tokens":500,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":100}}}`, 400},
		{"chat over it", `{"usage":{"prompt_tokens":2000,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":500}}}`, 600},
		{"anthropic over it", `{"usage":{"input_tokens":1000,"cache_creation_input_tokens":200,"output_tokens":5}}`, 600},
		{"anthropic, Input over it, its uncached part not", `{"usage":{"input_tokens":100,"cache_creation_input_tokens":900,"output_tokens":5}}`, 100},
	} {
		u, _ := meterJSON(c.body)
		w, _ := u.Within(Usage{Total: 1e6, Input: 600, Output: 500})
		if w.UncachedInput != c.uncached || w.UncachedInput > w.Input {
			t.Errorf("Within, %s: %+v, want UncachedInput %d", c.name, w, c.uncached)
		}
	}

	// The Realtime tap: each response.done's input_tokens less its
	// input_token_details.cached_tokens, summed, each response at most its
	// ceiling's Input.
	done := func(usage string) []byte {
		return usagetest.Text(`{"type":"response.done","event_id":"event_9","response":{"object":"realtime.response","id":"resp_9","status":"completed",` +
			`"output":[],"usage":` + usage + `}}`)
	}
	tap := NewRealtimeTap(MaxEvent, noCeiling)
	usagetest.Feed(tap,
		done(`{"total_tokens":1290,"input_tokens":1024,"output_tokens":266,`+
			`"input_token_details":{"text_tokens":224,"audio_tokens":800,"image_tokens":0,"cached_tokens":768,`+
			`"cached_tokens_details":{"text_tokens":128,"audio_tokens":640,"image_tokens":0}},"output_token_details":{"text_tokens":66,"audio_tokens":200}}`),
		done(`{"total_tokens":240,"input_tokens":200,"output_tokens":40}`),
		done(`{"total_tokens":6,"input_tokens":5,"output_tokens":1,"input_token_details":{"cached_tokens":50}}`),
		done(`{"total_tokens":110,"input_tokens":100,"output_tokens":10,"input_token_details":{"cached_tokens":0}}`),
	)
	got := tap.Take()
	if want := int64((1024 - 768) + 200 + 0 + 100); got.UncachedInput != want {
		t.Errorf("realtime: UncachedInput %d in %+v, want %d", got.UncachedInput, got, want)
	}
	if got.Input != got.UncachedInput+got.CacheRead {
		t.Errorf("realtime: %+v, want Input = UncachedInput + CacheRead", got)
	}
	if got := tap.Take(); got != (Usage{}) {
		t.Errorf("realtime: a second Take = %+v, want zero", got)
	}
	tap = NewRealtimeTap(MaxEvent, Usage{Total: 1e6, Input: 600, Output: 500})
	usagetest.Feed(tap,
		done(`{"total_tokens":1e12,"input_tokens":1e12,"output_tokens":1,"input_token_details":{"cached_tokens":1e11}}`),
		done(`{"total_tokens":110,"input_tokens":100,"output_tokens":10,"input_token_details":{"cached_tokens":30}}`),
	)
	if got, want := tap.Take(), int64(600+(100-30)); got.UncachedInput != want {
		t.Errorf("realtime over the ceiling: UncachedInput %d in %+v, want %d", got.UncachedInput, got, want)
	}
}
