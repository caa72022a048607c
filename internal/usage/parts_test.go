package usage

import (
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

func TestEveryGoldenPartsEntryIsAGoldenSample(t *testing.T) {
	golden := map[string]bool{}
	for _, g := range usagetest.Goldens {
		golden[g.File] = true
	}
	for file := range usagetest.GoldenParts {
		if !golden[file] {
			t.Errorf("usagetest.GoldenParts names %s, which is not in usagetest.Goldens", file)
		}
	}
}

func TestPricedPartsAreReadFromEachProvidersFields(t *testing.T) {
	cases := []struct {
		name, body string
		want       Usage
	}{
		// OpenAI chat: every part inside prompt_tokens / completion_tokens.
		{"chat", `{"usage":{"prompt_tokens":100,"completion_tokens":50,"total_tokens":150,` +
			`"prompt_tokens_details":{"cached_tokens":64,"audio_tokens":20,"text_tokens":80,"image_tokens":0},` +
			`"completion_tokens_details":{"reasoning_tokens":30,"audio_tokens":12,"accepted_prediction_tokens":5,"rejected_prediction_tokens":3}}}`,
			Usage{Total: 150, Input: 100, Output: 50, UncachedInput: 100 - 64, CacheRead: 64, AudioInput: 20, Reasoning: 30, AudioOutput: 12}},
		// Responses: input_tokens_details, output_tokens_details.
		{"responses", `{"type":"response.completed","response":{"usage":{"input_tokens":3763,"input_tokens_details":{"cached_tokens":3584},` +
			`"output_tokens":44,"output_tokens_details":{"reasoning_tokens":20},"total_tokens":3807}}}`,
			Usage{Total: 3807, Input: 3763, Output: 44, UncachedInput: 3763 - 3584, CacheRead: 3584, Reasoning: 20}},
		// Realtime and audio transcriptions: input_token_details,
		// output_token_details ("token"); cached_tokens_details is not read.
		{"realtime shape", `{"usage":{"total_tokens":205,"input_tokens":41,"output_tokens":164,` +
			`"input_token_details":{"text_tokens":14,"audio_tokens":27,"image_tokens":0,"cached_tokens":8,"cached_tokens_details":{"text_tokens":8,"audio_tokens":0}},` +
			`"output_token_details":{"text_tokens":28,"audio_tokens":136}}}`,
			Usage{Total: 205, Input: 41, Output: 164, UncachedInput: 41 - 8, CacheRead: 8, AudioInput: 27, AudioOutput: 136}},
		// Audio transcriptions (gpt-4o-transcribe): the same details.
		{"transcription", `{"text":"Hello.","usage":{"type":"tokens","input_tokens":14,"input_token_details":{"text_tokens":0,"audio_tokens":14},"output_tokens":45,"total_tokens":59}}`,
			Usage{Total: 59, Input: 14, Output: 45, UncachedInput: 14, AudioInput: 14}},
		// Anthropic: cache reads beside Input, cache writes inside it; the
		// 5m/1h breakdown is not added again.
		{"anthropic", `{"type":"message","usage":{"input_tokens":3,"cache_creation_input_tokens":598,"cache_read_input_tokens":4597,` +
			`"cache_creation":{"ephemeral_5m_input_tokens":598,"ephemeral_1h_input_tokens":0},"output_tokens":350}}`,
			Usage{Total: 3 + 598 + 4597 + 350, Input: 3 + 598, Output: 350, UncachedInput: 3, CacheRead: 4597, CacheWrite: 598}},
		// Gemini: cached content inside the prompt, thoughts inside Output.
		{"gemini", `{"usageMetadata":{"promptTokenCount":3797,"candidatesTokenCount":656,"totalTokenCount":6002,"cachedContentTokenCount":3055,` +
			`"cacheTokensDetails":[{"modality":"TEXT","tokenCount":3055}],"thoughtsTokenCount":1549}}`,
			Usage{Total: 6002, Input: 3797, Output: 656 + 1549, UncachedInput: 3797 - 3055, CacheRead: 3055, Reasoning: 1549}},
		// A part is at most its whole, and 0 without it.
		{"cached above prompt", `{"usage":{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":64,"audio_tokens":11},` +
			`"completion_tokens_details":{"reasoning_tokens":9,"audio_tokens":6}}}`,
			Usage{Total: 15, Input: 10, Output: 5, UncachedInput: 0, CacheRead: 10, AudioInput: 10, Reasoning: 5, AudioOutput: 5}},
		{"parts without their wholes", `{"usage":{"total_tokens":30,"prompt_tokens_details":{"cached_tokens":10},"output_tokens_details":{"reasoning_tokens":7}}}`,
			Usage{Total: 30}},
		{"gemini cached above prompt", `{"usageMetadata":{"promptTokenCount":10,"cachedContentTokenCount":50,"candidatesTokenCount":1}}`,
			Usage{Total: 11, Input: 10, Output: 1, UncachedInput: 0, CacheRead: 10}},
		// Only the details objects of a usage object, each with its own names.
		{"details of the wrong kind", `{"usage":{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"reasoning_tokens":4},` +
			`"completion_tokens_details":{"cached_tokens":3}}}`,
			Usage{Total: 15, Input: 10, Output: 5, UncachedInput: 10}},
		{"details outside usage", `{"prompt_tokens_details":{"cached_tokens":4},"usage":{"prompt_tokens":10}}`, Usage{Total: 10, Input: 10, UncachedInput: 10}},
		{"nested in details", `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"more":{"cached_tokens":4}}}}`, Usage{Total: 10, Input: 10, UncachedInput: 10}},
		{"details in an iteration", `{"usage":{"iterations":[{"input_tokens":10,"input_tokens_details":{"cached_tokens":4}}]}}`, Usage{Total: 10, Input: 10, UncachedInput: 10}},
		{"details not an object", `{"usage":{"prompt_tokens":10,"prompt_tokens_details":[{"cached_tokens":4}],"completion_tokens_details":null}}`, Usage{Total: 10, Input: 10, UncachedInput: 10}},
		// A later details object wins, field by field, as any count.
		{"repeated details", `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":4,"audio_tokens":2},"prompt_tokens_details":{"cached_tokens":6}}}`,
			Usage{Total: 10, Input: 10, UncachedInput: 10 - 6, CacheRead: 6, AudioInput: 2}},
		// Mixed families: each part its largest family's.
		{"mixed families", `{"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":60},` +
			`"input_tokens":100,"output_tokens":5,"cache_read_input_tokens":80,"cache_creation_input_tokens":7}}`,
			Usage{Total: 100 + 5 + 80 + 7, Input: 107, Output: 5, UncachedInput: 100, CacheRead: 80, CacheWrite: 7}},
	}
	for _, c := range cases {
		for _, ch := range usagetest.Chunkings() {
			u, metered := meterUsage(usagetest.Header("application/json", ""), ch.Split([]byte(c.body)))
			if u != c.want || !metered {
				t.Errorf("%s (%s): got (%+v, %v), want (%+v, true)", c.name, ch.Name, u, metered, c.want)
			}
		}
	}
}

func TestDetailsAloneDoNotMeterAResponse(t *testing.T) {
	for _, body := range []string{
		`{"usage":{"prompt_tokens_details":{"cached_tokens":5}}}`,
		`{"usage":{"input_token_details":{"audio_tokens":5},"output_token_details":{"audio_tokens":5}}}`,
		`{"response":{"usage":{"completion_tokens_details":{"reasoning_tokens":5}}}}`,
	} {
		if u, metered := meterJSON(body); metered || u != (Usage{}) {
			t.Errorf("%s: got (%+v, %v), want unmetered", body, u, metered)
		}
	}
}

func TestPricedPartsFollowEachShapesStreamRules(t *testing.T) {
	sse := func(docs ...string) string {
		var b strings.Builder
		for _, d := range docs {
			b.WriteString("data: " + d + "\n\n")
		}
		return b.String()
	}
	cases := []struct {
		name, body string
		want       Usage
	}{
		// Anthropic: per field the latest wins; message_delta's omitted
		// fields keep message_start's.
		{"anthropic delta keeps the cache fields it omits",
			sse(`{"type":"message_start","message":{"usage":{"input_tokens":12,"cache_creation_input_tokens":1500,"cache_read_input_tokens":4200,"output_tokens":1}}}`,
				`{"type":"message_delta","usage":{"output_tokens":340}}`),
			Usage{Total: 12 + 1500 + 4200 + 340, Input: 1512, Output: 340, UncachedInput: 12, CacheRead: 4200, CacheWrite: 1500}},
		{"anthropic delta replaces the cache fields it reports, even lower",
			sse(`{"type":"message_start","message":{"usage":{"input_tokens":12,"cache_creation_input_tokens":1500,"cache_read_input_tokens":4200,"output_tokens":1}}}`,
				`{"type":"message_delta","usage":{"cache_creation_input_tokens":0,"cache_read_input_tokens":5700,"output_tokens":340}}`),
			Usage{Total: 12 + 5700 + 340, Input: 12, Output: 340, UncachedInput: 12, CacheRead: 5700}},
		// Gemini: the last snapshot; a part it leaves out is gone.
		{"gemini last snapshot",
			sse(`{"usageMetadata":{"promptTokenCount":500,"cachedContentTokenCount":400,"thoughtsTokenCount":90,"totalTokenCount":590}}`,
				`{"usageMetadata":{"promptTokenCount":500,"candidatesTokenCount":20,"totalTokenCount":520}}`),
			Usage{Total: 520, Input: 500, Output: 20, UncachedInput: 500}},
		{"gemini running thoughts",
			sse(`{"usageMetadata":{"promptTokenCount":30,"thoughtsTokenCount":651,"totalTokenCount":681}}`,
				`{"usageMetadata":{"promptTokenCount":30,"candidatesTokenCount":4,"thoughtsTokenCount":1340,"cachedContentTokenCount":16,"totalTokenCount":1374}}`),
			Usage{Total: 1374, Input: 30, Output: 1344, UncachedInput: 30 - 16, CacheRead: 16, Reasoning: 1340}},
		// OpenAI chat stream: the include_usage chunk.
		{"openai usage chunk",
			sse(`{"choices":[{"delta":{"content":"x"}}],"usage":null}`,
				`{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":100,"total_tokens":112,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":100,"audio_tokens":0}}}`),
			Usage{Total: 112, Input: 12, Output: 100, UncachedInput: 12, Reasoning: 100}},
		// Iterations: cache reads and writes summed over them, each the
		// larger of the sum and the top-level field.
		{"iterations",
			sse(`{"type":"message_start","message":{"usage":{"input_tokens":100,"cache_read_input_tokens":55096,"output_tokens":7}}}`,
				`{"type":"message_delta","usage":{"input_tokens":181,"cache_creation_input_tokens":40,"cache_read_input_tokens":0,"output_tokens":8,"iterations":[`+
					`{"type":"compaction","input_tokens":100,"output_tokens":83,"cache_read_input_tokens":55096,"cache_creation_input_tokens":0},`+
					`{"type":"message","input_tokens":181,"output_tokens":8,"cache_read_input_tokens":300,"cache_creation_input_tokens":40}]}}`),
			Usage{Total: 100 + 83 + 55096 + 181 + 8 + 300 + 40, Input: 100 + 181 + 40, Output: 83 + 8, UncachedInput: 100 + 181, CacheRead: 55096 + 300, CacheWrite: 40}},
		{"top-level cache write above the iterations'",
			sse(`{"type":"message_delta","usage":{"input_tokens":1,"cache_creation_input_tokens":900,"iterations":[{"input_tokens":1,"cache_creation_input_tokens":5}]}}`),
			Usage{Total: 901, Input: 901, UncachedInput: 1, CacheWrite: 900}},
	}
	for _, c := range cases {
		for _, ch := range usagetest.Chunkings() {
			u, metered := meterUsage(usagetest.Header("text/event-stream", ""), ch.Split([]byte(c.body)))
			if u != c.want || !metered {
				t.Errorf("%s (%s): got (%+v, %v), want (%+v, true)", c.name, ch.Name, u, metered, c.want)
			}
		}
	}
}

func TestWithinBoundsEachPartByItsWholesCeiling(t *testing.T) {
	ceiling := Usage{Total: 1000, Input: 600, Output: 500}
	cases := []struct {
		name       string
		u, want    Usage
		wantOver   bool
		wantEquals bool // want == u
	}{
		{"under", Usage{Total: 900, Input: 500, Output: 400, UncachedInput: 200, CacheRead: 300, CacheWrite: 100, Reasoning: 200, AudioInput: 50, AudioOutput: 60},
			Usage{}, false, true},
		{"OpenAI input over: the cached part too",
			Usage{Total: 1e9, Input: 1e9, Output: 10, UncachedInput: 1e8, CacheRead: 9e8, AudioInput: 1e9},
			Usage{Total: 1000, Input: 600, Output: 10, UncachedInput: 600, CacheRead: 600, AudioInput: 600}, true, false},
		{"Anthropic cache reads beside Input: bounded by Total",
			Usage{Total: 1e9, Input: 20, Output: 10, UncachedInput: 15, CacheRead: 1e9 - 30, CacheWrite: 5},
			Usage{Total: 1000, Input: 20, Output: 10, UncachedInput: 15, CacheRead: 1000, CacheWrite: 5}, true, false},
		{"output over: reasoning and audio too",
			Usage{Total: 2e9, Input: 5, Output: 2e9, Reasoning: 1e9, AudioOutput: 2e9},
			Usage{Total: 1000, Input: 5, Output: 500, Reasoning: 500, AudioOutput: 500}, true, false},
		{"a part over its own whole",
			Usage{Total: 50, Input: 30, Output: 20, UncachedInput: 35, CacheWrite: 40, Reasoning: 25},
			Usage{Total: 50, Input: 30, Output: 20, UncachedInput: 30, CacheWrite: 30, Reasoning: 20}, true, false},
	}
	for _, c := range cases {
		got, over := c.u.Within(ceiling)
		want := c.want
		if c.wantEquals {
			want = c.u
		}
		if got != want || over != c.wantOver {
			t.Errorf("%s: Within = (%+v, %v), want (%+v, %v)", c.name, got, over, want, c.wantOver)
		}
		if !partsWithinWholes(got) {
			t.Errorf("%s: a part over its whole in %+v", c.name, got)
		}
	}
	// A ceiling's own parts are not read: a ceiling of three counts bounds all.
	u := Usage{Total: 10, Input: 6, Output: 4, UncachedInput: 6, CacheRead: 6, Reasoning: 4, AudioInput: 6, AudioOutput: 4}
	if got, over := u.Within(Usage{Total: 10, Input: 6, Output: 4}); got != u || over {
		t.Errorf("Within its own counts: (%+v, %v), want (%+v, false)", got, over, u)
	}
}

func TestCappedMaxAndPlusCarryEveryPart(t *testing.T) {
	a := Usage{Total: 1, Input: 2, Output: 3, UncachedInput: 0, CacheRead: 4, CacheWrite: 5, Reasoning: 6, AudioInput: 7, AudioOutput: 8}
	b := Usage{Total: 8, Input: 7, Output: 6, UncachedInput: 9, CacheRead: 5, CacheWrite: 4, Reasoning: 3, AudioInput: 2, AudioOutput: 1}
	if got := a.plus(b); got != (Usage{9, 9, 9, 9, 9, 9, 9, 9, 9}) {
		t.Errorf("plus = %+v", got)
	}
	if got := a.max(b); got != (Usage{8, 7, 6, 9, 5, 5, 6, 7, 8}) {
		t.Errorf("max = %+v", got)
	}
	huge := Usage{2 * maxValue, 2 * maxValue, 2 * maxValue, 2 * maxValue, 2 * maxValue, 2 * maxValue, 2 * maxValue, 2 * maxValue, 2 * maxValue}
	if got := huge.capped(); got != (Usage{maxValue, maxValue, maxValue, maxValue, maxValue, maxValue, maxValue, maxValue, maxValue}) {
		t.Errorf("capped = %+v", got)
	}
}

func TestRealtimeTapCountsThePricedPartsOfEachResponse(t *testing.T) {
	done := func(usage string) []byte {
		return usagetest.Text(`{"type":"response.done","response":{"status":"completed","usage":` + usage + `}}`)
	}
	tap := NewRealtimeTap(MaxEvent, Usage{Total: 1000, Input: 600, Output: 500})
	usagetest.Feed(tap,
		done(`{"total_tokens":205,"input_tokens":41,"output_tokens":164,"input_token_details":{"text_tokens":14,"audio_tokens":27,"cached_tokens":0,`+
			`"cached_tokens_details":{"text_tokens":0,"audio_tokens":0}},"output_token_details":{"text_tokens":28,"audio_tokens":136}}`),
		done(`{"total_tokens":116,"input_tokens":103,"output_tokens":13,"input_token_details":{"text_tokens":103,"audio_tokens":0,"cached_tokens":64},`+
			`"output_token_details":{"text_tokens":13,"audio_tokens":0}}`),
		// A part is at most its whole as reported, and 0 without it.
		done(`{"total_tokens":10,"input_tokens":5,"input_token_details":{"cached_tokens":50,"audio_tokens":9},"output_token_details":{"audio_tokens":3}}`),
		// Over the ceiling: the parts with their wholes.
		done(`{"total_tokens":1e12,"input_tokens":1e12,"output_tokens":1e12,"input_token_details":{"cached_tokens":1e11,"audio_tokens":1e12},`+
			`"output_token_details":{"audio_tokens":1e12}}`),
	)
	want := Usage{
		Total: 205 + 116 + 10 + 1000, Input: 41 + 103 + 5 + 600, Output: 164 + 13 + 0 + 500,
		UncachedInput: (41 - 0) + (103 - 64) + (5 - 5) + 600,
		CacheRead:     0 + 64 + 5 + 600, AudioInput: 27 + 0 + 5 + 600, AudioOutput: 136 + 0 + 0 + 500,
	}
	usagetest.CheckTap(t, tap, want, 0)
	if tap.Clamped() != 1 {
		t.Errorf("clamped %d responses, want 1", tap.Clamped())
	}
}
