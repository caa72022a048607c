package usage

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// meterUsage writes the chunks to a meter, each from a buffer that is
// overwritten right after the Write (the meter must not keep p), and finishes.
// A panic that the meter recovered from is a bug: it is raised again here.
func meterUsage(h http.Header, chunks [][]byte) (Usage, bool) {
	m := NewMeter(h)
	var buf []byte
	for _, c := range chunks {
		buf = append(buf[:0], c...)
		n, err := m.Write(buf)
		if n != len(buf) || err != nil {
			panic(fmt.Sprintf("Write(%d bytes) = %d, %v", len(buf), n, err))
		}
		for i := range buf {
			buf[i] = 'X'
		}
	}
	u, metered := m.Finish()
	if m.panicked != nil {
		panic(fmt.Sprintf("the meter recovered from a panic: %v", m.panicked))
	}
	return u, metered
}

// meterJSON meters a JSON body written in one piece.
func meterJSON(body string) (Usage, bool) {
	return meterUsage(usagetest.Header("application/json", ""), [][]byte{[]byte(body)})
}

// goldenUsage is what a golden sample must charge.
func goldenUsage(g usagetest.Golden) Usage {
	p := usagetest.GoldenParts[g.File]
	return Usage{Total: g.Tokens, Input: g.Input, Output: g.Output, UncachedInput: p.UncachedInput,
		CacheRead: p.CacheRead, CacheWrite: p.CacheWrite, Reasoning: p.Reasoning, AudioInput: p.AudioInput, AudioOutput: p.AudioOutput}
}

func TestUsageGoldenSamplesChargeWhatTheProviderReportsWhateverTheEncodingAndChunking(t *testing.T) {
	for _, g := range usagetest.Goldens {
		raw := usagetest.Read(t, g.File)
		for _, coding := range usagetest.Encodings {
			body := usagetest.Encode(t, coding, raw)
			h := usagetest.Header(usagetest.ContentType(g.File), usagetest.EncodingHeader(coding))
			for _, c := range usagetest.Chunkings() {
				u, metered := meterUsage(h, c.Split(body))
				if u != goldenUsage(g) || metered != g.Metered {
					t.Errorf("%s %s %s: got (%+v, %v), want (%+v, %v)", g.File, coding, c.Name, u, metered, goldenUsage(g), g.Metered)
				}
			}
		}
	}
}

func TestEveryGoldenSampleHasItsCharge(t *testing.T) {
	golden := map[string]bool{}
	for _, g := range usagetest.Goldens {
		golden[g.File] = true
	}
	for _, file := range usagetest.Files() {
		if !golden[file] {
			t.Errorf("%s has no entry in usagetest.Goldens", file)
		}
	}
}

func TestAnthropicInputCountsCacheWritesNotCacheReads(t *testing.T) {
	cases := []struct {
		name, usage string
		want        Usage
	}{
		{"cache writes", `{"input_tokens":20,"cache_creation_input_tokens":3000,"output_tokens":7}`, Usage{Total: 3027, Input: 3020, Output: 7, UncachedInput: 20, CacheWrite: 3000}},
		{"cache reads", `{"input_tokens":20,"cache_read_input_tokens":3000,"output_tokens":7}`, Usage{Total: 3027, Input: 20, Output: 7, UncachedInput: 20, CacheRead: 3000}},
		{"both, and the 5m/1h breakdown of the writes", `{"input_tokens":20,"cache_creation_input_tokens":100,"cache_read_input_tokens":3000,` +
			`"cache_creation":{"ephemeral_5m_input_tokens":60,"ephemeral_1h_input_tokens":40},"output_tokens":7}`, Usage{Total: 3127, Input: 120, Output: 7, UncachedInput: 20, CacheRead: 3000, CacheWrite: 100}},
		// Per iteration of a compacted response, summed.
		{"iterations", `{"input_tokens":5,"cache_creation_input_tokens":50,"cache_read_input_tokens":900,"output_tokens":2,"iterations":[` +
			`{"input_tokens":30,"cache_read_input_tokens":8000,"output_tokens":400},` +
			`{"input_tokens":5,"cache_creation_input_tokens":50,"cache_read_input_tokens":900,"output_tokens":2}]}`,
			Usage{Total: 30 + 8000 + 400 + 5 + 50 + 900 + 2, Input: 30 + 5 + 50, Output: 400 + 2, UncachedInput: 30 + 5, CacheRead: 8000 + 900, CacheWrite: 50}},
	}
	for _, c := range cases {
		for _, wrap := range []string{`{"usage":%s}`, `{"type":"message_start","message":{"usage":%s}}`} {
			body := fmt.Sprintf(wrap, c.usage)
			if u, metered := meterJSON(body); u != c.want || !metered {
				t.Errorf("%s: %s: got (%+v, %v), want (%+v, true)", c.name, body, u, metered, c.want)
			}
		}
	}
}

func TestOpenAIOutputIsTheCompletionTokensWhichIncludeReasoning(t *testing.T) {
	for _, c := range []struct {
		usage string
		want  Usage
	}{
		{`{"prompt_tokens":75,"completion_tokens":1186,"total_tokens":1261,"completion_tokens_details":{"reasoning_tokens":1024,"audio_tokens":0}}`, Usage{Total: 1261, Input: 75, Output: 1186, UncachedInput: 75, Reasoning: 1024}},
		{`{"prompt_tokens":75,"completion_tokens":1186,"completion_tokens_details":{"reasoning_tokens":1024}}`, Usage{Total: 1261, Input: 75, Output: 1186, UncachedInput: 75, Reasoning: 1024}},
		// The Responses API: output_tokens likewise.
		{`{"input_tokens":40,"input_tokens_details":{"cached_tokens":32},"output_tokens":900,"output_tokens_details":{"reasoning_tokens":768},"total_tokens":940}`, Usage{Total: 940, Input: 40, Output: 900, UncachedInput: 40 - 32, CacheRead: 32, Reasoning: 768}},
	} {
		if u, _ := meterJSON(`{"usage":` + c.usage + `}`); u != c.want {
			t.Errorf("usage %s: got %+v, want %+v", c.usage, u, c.want)
		}
	}
}

func TestGeminiInputCountsToolUsePromptsAndOutputCountsThoughts(t *testing.T) {
	for _, c := range []struct {
		usage string
		want  Usage
	}{
		{`{"promptTokenCount":320,"toolUsePromptTokenCount":1450,"candidatesTokenCount":210,"thoughtsTokenCount":388,"totalTokenCount":2368}`, Usage{Total: 2368, Input: 1770, Output: 598, UncachedInput: 320 + 1450, Reasoning: 388}},
		{`{"promptTokenCount":320,"toolUsePromptTokenCount":1450,"candidatesTokenCount":210,"thoughtsTokenCount":388}`, Usage{Total: 2368, Input: 1770, Output: 598, UncachedInput: 320 + 1450, Reasoning: 388}},
		// The cached content is part of the prompt: it is not added again.
		{`{"promptTokenCount":1208,"cachedContentTokenCount":1024,"candidatesTokenCount":9,"totalTokenCount":1217}`, Usage{Total: 1217, Input: 1208, Output: 9, UncachedInput: 1208 - 1024, CacheRead: 1024}},
	} {
		if u, _ := meterJSON(`{"usageMetadata":` + c.usage + `}`); u != c.want {
			t.Errorf("usageMetadata %s: got %+v, want %+v", c.usage, u, c.want)
		}
	}
}

func TestUsageReportingOnlyATotalHasNoInputOrOutput(t *testing.T) {
	for _, body := range []string{
		`{"usage":{"total_tokens":30}}`,
		`{"usageMetadata":{"totalTokenCount":30}}`,
		`{"response":{"usage":{"total_tokens":30,"input_tokens_details":{"cached_tokens":10}}}}`,
	} {
		if u, metered := meterJSON(body); u != (Usage{Total: 30}) || !metered {
			t.Errorf("%s: got (%+v, %v), want ({30 0 0}, true)", body, u, metered)
		}
	}
}

// Compatible backends echo more than one family's names: the usage is
// charged once, each count its largest family's.
func TestMixedFamilyUsageTakesEachCountFromItsLargestFamily(t *testing.T) {
	for _, c := range []struct {
		usage string
		want  Usage
	}{
		// Charged once, not twice.
		{`{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"input_tokens":10,"output_tokens":5}`, Usage{Total: 15, Input: 10, Output: 5, UncachedInput: 10}},
		// Disagreeing counts: each from the family that reports more of it.
		{`{"prompt_tokens":10,"completion_tokens":5,"input_tokens":12,"output_tokens":3,"cache_read_input_tokens":100}`, Usage{Total: 115, Input: 12, Output: 5, UncachedInput: 12, CacheRead: 100}},
		{`{"prompt_tokens":10,"completion_tokens":5,"promptTokenCount":8,"candidatesTokenCount":2,"thoughtsTokenCount":6}`, Usage{Total: 16, Input: 10, Output: 8, UncachedInput: 10, Reasoning: 6}},
	} {
		if u, _ := meterJSON(`{"usage":` + c.usage + `}`); u != c.want {
			t.Errorf("usage %s: got %+v, want %+v", c.usage, u, c.want)
		}
	}
}

func TestAnthropicStreamIsChargedTheLatestValueOfEachField(t *testing.T) {
	// message_start reports input and 1 output token, message_delta the
	// cumulative usage: the fields it reports are final (even when lower), the
	// ones it omits keep their earlier value.
	body := "event: message_start\n" +
		`data: {"type":"message_start","message":{"usage":{"input_tokens":100,"cache_read_input_tokens":50,"output_tokens":1}}}` + "\n\n" +
		"event: message_delta\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":null},"usage":{"input_tokens":90,"output_tokens":40}}` + "\n\n" +
		"event: message_delta\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":70,"cache_creation_input_tokens":5}}` + "\n\n"
	for _, c := range usagetest.Chunkings() {
		u, metered := meterUsage(usagetest.Header("text/event-stream", ""), c.Split([]byte(body)))
		if want := (Usage{Total: 90 + 50 + 70 + 5, Input: 90 + 5, Output: 70, UncachedInput: 90, CacheRead: 50, CacheWrite: 5}); u != want || !metered {
			t.Fatalf("%s: got (%+v, %v), want (%+v, true)", c.Name, u, metered, want)
		}
	}
	// A compatible backend that reports input only on message_delta.
	late := "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}\n\n" +
		"data: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":30,\"output_tokens\":4}}\n\n"
	if u, metered := meterUsage(usagetest.Header("text/event-stream", ""), [][]byte{[]byte(late)}); u != (Usage{Total: 34, Input: 30, Output: 4, UncachedInput: 30}) || !metered {
		t.Fatalf("input reported late: got (%+v, %v), want ({34 30 4}, true)", u, metered)
	}
}

func TestGeminiStreamIsChargedItsLastUsageReport(t *testing.T) {
	cases := []struct {
		name   string
		chunks []string // usageMetadata values, one per chunk
		want   Usage
	}{
		{"running total", []string{
			`{"promptTokenCount":10,"totalTokenCount":10}`,
			`{"promptTokenCount":10,"candidatesTokenCount":5,"totalTokenCount":15}`,
			`{"promptTokenCount":10,"candidatesTokenCount":9,"thoughtsTokenCount":20,"totalTokenCount":39}`,
		}, Usage{Total: 39, Input: 10, Output: 29, UncachedInput: 10, Reasoning: 20}},
		// The prompt count goes down on the last chunk: its total is the
		// count, not the largest prompt plus the candidates.
		{"counts going down", []string{
			`{"promptTokenCount":15,"totalTokenCount":15}`,
			`{"promptTokenCount":15,"totalTokenCount":15}`,
			`{"promptTokenCount":13,"candidatesTokenCount":8,"totalTokenCount":21}`,
		}, Usage{Total: 21, Input: 13, Output: 8, UncachedInput: 13}},
		// A field the last snapshot leaves out is gone, not kept from earlier.
		{"field absent from the last snapshot", []string{
			`{"promptTokenCount":10,"toolUsePromptTokenCount":50,"candidatesTokenCount":2}`,
			`{"promptTokenCount":10,"candidatesTokenCount":6}`,
		}, Usage{Total: 16, Input: 10, Output: 6, UncachedInput: 10}},
		{"total absent from the last snapshot", []string{
			`{"promptTokenCount":10,"totalTokenCount":90}`,
			`{"promptTokenCount":10,"candidatesTokenCount":6}`,
		}, Usage{Total: 16, Input: 10, Output: 6, UncachedInput: 10}},
		// A usageMetadata without Gemini counts is no snapshot of them.
		{"empty usageMetadata last", []string{
			`{"promptTokenCount":10,"candidatesTokenCount":6,"totalTokenCount":16}`,
			`{}`,
			`{"trafficType":"ON_DEMAND"}`,
		}, Usage{Total: 16, Input: 10, Output: 6, UncachedInput: 10}},
	}
	for _, c := range cases {
		var sse, array strings.Builder
		array.WriteString("[")
		for i, u := range c.chunks {
			doc := `{"candidates":[{"content":{"parts":[{"text":"x"}],"role":"model"}}],"usageMetadata":` + u + `,"modelVersion":"gemini-2.5-flash"}`
			sse.WriteString("data: " + doc + "\r\n\r\n")
			if i > 0 {
				array.WriteString(",\r\n")
			}
			array.WriteString(doc)
		}
		array.WriteString("]")
		for _, body := range []struct{ contentType, text string }{
			{"text/event-stream", sse.String()},
			{"application/json", array.String()},
		} {
			for _, ch := range usagetest.Chunkings() {
				u, metered := meterUsage(usagetest.Header(body.contentType, ""), ch.Split([]byte(body.text)))
				if u != c.want || !metered {
					t.Errorf("%s (%s, %s): got (%+v, %v), want (%+v, true)", c.name, body.contentType, ch.Name, u, metered, c.want)
				}
			}
		}
	}
}

func TestCompactedAnthropicResponseIsChargedTheUsageOfEveryIteration(t *testing.T) {
	iteration := func(typ string, in, out, cacheCreate, cacheRead int) string {
		return fmt.Sprintf(`{"type":%q,"input_tokens":%d,"output_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,`+
			`"cache_creation":{"ephemeral_5m_input_tokens":%d,"ephemeral_1h_input_tokens":0}}`, typ, in, out, cacheCreate, cacheRead, cacheCreate)
	}
	compaction, message := iteration("compaction", 100, 83, 0, 55096), iteration("message", 181, 8, 40, 0)
	sum := Usage{Total: 100 + 83 + 55096 + 181 + 8 + 40, Input: 100 + 181 + 40, Output: 83 + 8, UncachedInput: 100 + 181, CacheRead: 55096, CacheWrite: 40}
	start := `data: {"type":"message_start","message":{"usage":{"input_tokens":100,"cache_read_input_tokens":55096,"output_tokens":7}}}` + "\n\n"
	delta := func(usage string) string {
		return `data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":` + usage + `,"context_management":{"applied_edits":[]}}` + "\n\n"
	}
	last := `{"input_tokens":181,"cache_creation_input_tokens":40,"cache_read_input_tokens":0,"output_tokens":8,"iterations":[` + compaction + `,` + message + `]}`
	cases := []struct {
		name, contentType, body string
		want                    Usage
	}{
		{"stream", "text/event-stream", start + delta(last), sum},
		{"JSON body", "application/json", `{"type":"message","usage":` + last + `}`, sum},
		{"iterations before the top-level fields", "application/json",
			`{"usage":{"iterations":[` + compaction + `,` + message + `],"input_tokens":181,"output_tokens":8,"cache_creation_input_tokens":40}}`, sum},
		{"iterations in message.usage", "application/json", `{"message":{"usage":` + last + `}}`, sum},
		// A later usage object without iterations leaves their sum; a later
		// one with them replaces it (latest wins, even when lower).
		{"later usage without iterations", "text/event-stream", start + delta(last) + delta(`{"output_tokens":9}`), sum},
		{"later iterations", "text/event-stream",
			start + delta(last) + delta(`{"input_tokens":181,"output_tokens":8,"iterations":[`+iteration("compaction", 100, 83, 0, 50000)+`,`+message+`]}`),
			Usage{Total: 100 + 83 + 50000 + 181 + 8 + 40, Input: 100 + 181 + 40, Output: 83 + 8, UncachedInput: 100 + 181, CacheRead: 50000, CacheWrite: 40}},
		// Within an iteration, as in a usage object, a repeated key's latest value wins.
		{"repeated key in an iteration", "application/json",
			`{"usage":{"input_tokens":5,"iterations":[{"input_tokens":1000,"input_tokens":3,"output_tokens":2},{"input_tokens":5}]}}`, Usage{Total: 3 + 2 + 5, Input: 3 + 5, Output: 2, UncachedInput: 3 + 5}},
		// The sum is a total: if it is smaller than the top-level fields beside
		// it, those are charged; and so for each part.
		{"iterations smaller than the top level", "application/json",
			`{"usage":{"input_tokens":500,"output_tokens":20,"iterations":[{"input_tokens":1,"output_tokens":1}]}}`, Usage{Total: 520, Input: 500, Output: 20, UncachedInput: 500}},
		{"iterations smaller in one part", "application/json",
			`{"usage":{"input_tokens":5,"output_tokens":50,"iterations":[{"input_tokens":30,"output_tokens":1}]}}`, Usage{Total: 55, Input: 30, Output: 50, UncachedInput: 30}},
		{"empty iterations", "application/json", `{"usage":{"input_tokens":500,"output_tokens":20,"iterations":[]}}`, Usage{Total: 520, Input: 500, Output: 20, UncachedInput: 500}},
		{"only empty iterations is metered", "application/json", `{"usage":{"iterations":[]}}`, Usage{}},
		// Elements that are not iterations, and iterations that are not a list.
		{"odd elements", "application/json",
			`{"usage":{"iterations":[1,"two",null,[{"input_tokens":900}],{"input_tokens":7,"nested":{"input_tokens":900}},{}]}}`, Usage{Total: 7, Input: 7, Output: 0, UncachedInput: 7}},
		{"huge counts are capped", "application/json",
			`{"usage":{"iterations":[{"input_tokens":1e30,"output_tokens":1e30,"cache_read_input_tokens":1e30}]}}`, Usage{Total: maxValue, Input: maxValue, Output: maxValue, UncachedInput: maxValue, CacheRead: maxValue}},
		{"iterations not a list", "application/json", `{"usage":{"input_tokens":4,"iterations":{"input_tokens":900}}}`, Usage{Total: 4, Input: 4, Output: 0, UncachedInput: 4}},
		{"iterations outside usage", "application/json", `{"iterations":[{"input_tokens":900}],"usage":{"input_tokens":4}}`, Usage{Total: 4, Input: 4, Output: 0, UncachedInput: 4}},
	}
	for _, c := range cases {
		for _, ch := range usagetest.Chunkings() {
			u, metered := meterUsage(usagetest.Header(c.contentType, ""), ch.Split([]byte(c.body)))
			if u != c.want || !metered {
				t.Errorf("%s (%s): got (%+v, %v), want (%+v, true)", c.name, ch.Name, u, metered, c.want)
			}
		}
	}
}

// shrank reports whether any count of u is below prev's.
func shrank(u, prev Usage) bool {
	return u.Total < prev.Total || u.Input < prev.Input || u.Output < prev.Output
}

func TestUsageReportCutShortIsChargedWhatItAndTheReportBeforeItSaid(t *testing.T) {
	// A cut inside a Gemini snapshot: the counts it has reported count, and
	// the earlier snapshot's fields it has not replaced yet still stand.
	raw := usagetest.Read(t, "gemini_stream_down.sse")
	lastEvent := bytes.LastIndex(raw, []byte("data: "))
	lastUsage := lastEvent + bytes.Index(raw[lastEvent:], []byte(`"usageMetadata"`))
	for cut := lastEvent; cut <= len(raw); cut++ {
		u, metered := meterUsage(usagetest.Header("text/event-stream", ""), [][]byte{raw[:cut]})
		switch {
		case !metered || u.Total < 42 || u.Total > 79 || u.Input < 38 || u.Input > 42 || u.Output > 17+24 || u.UncachedInput < 38 || u.UncachedInput > 42:
			t.Fatalf("cut at %d: got (%+v, %v), want between the last two reports' {42 42 0} and {79 38 41}", cut, u, metered)
		case cut <= lastUsage && u != (Usage{Total: 42, Input: 42, Output: 0, UncachedInput: 42}):
			t.Fatalf("cut at %d (before the last report): got %+v, want {42 42 0}", cut, u)
		}
	}
	// A cut inside an iterations list: the top-level fields beside it, until
	// its iterations sum to more, count by count; the sum grows with each
	// count read.
	raw = usagetest.Read(t, "anthropic_compaction_stream.sse")
	list := bytes.Index(raw, []byte(`"iterations":[`)) + len(`"iterations":[`)
	second := list + bytes.Index(raw[list:], []byte(`},{`)) + 1
	var prev Usage
	for cut := list; cut <= len(raw); cut++ {
		u, metered := meterUsage(usagetest.Header("text/event-stream", ""), [][]byte{raw[:cut]})
		var want Usage
		switch cut {
		case list:
			want = Usage{Total: 315 + 12 + 1200 + 0, Input: 315 + 1200, Output: 12, UncachedInput: 315, CacheWrite: 1200}
		case second: // the first iteration, but the top level's larger input
			want = Usage{Total: 240 + 410 + 0 + 31200, Input: 315 + 1200, Output: 410, UncachedInput: 315, CacheRead: 31200, CacheWrite: 1200}
		case len(raw):
			want = Usage{Total: (240 + 410 + 0 + 31200) + (315 + 12 + 1200 + 0), Input: (240 + 0) + (315 + 1200), Output: 410 + 12, UncachedInput: 240 + 315, CacheRead: 31200, CacheWrite: 1200}
		}
		if !metered || shrank(u, prev) || (want != Usage{} && u != want) {
			t.Fatalf("cut at %d: got (%+v, %v), want %+v (zero: any, not below the shorter cut's %+v)", cut, u, metered, want, prev)
		}
		prev = u
	}
	// A cut inside a later iterations array: until it closes, the array it
	// replaces is charged where that is larger, count by count.
	first := `data: {"type":"message_delta","usage":{"iterations":[{"input_tokens":100,"output_tokens":10},{"input_tokens":5,"output_tokens":300}]}}` + "\n\n"
	later := `data: {"type":"message_delta","usage":{"iterations":[{"input_tokens":100,"output_tokens":10},{"input_tokens":5,"output_tokens":290}]}}` + "\n\n"
	body := first + later
	closed := strings.LastIndex(body, "]") + 1
	for cut := len(first); cut <= len(body); cut++ {
		u, _ := meterUsage(usagetest.Header("text/event-stream", ""), [][]byte{[]byte(body[:cut])})
		want := Usage{Total: 100 + 10 + 5 + 300, Input: 100 + 5, Output: 10 + 300, UncachedInput: 100 + 5}
		if cut >= closed {
			want = Usage{Total: 100 + 10 + 5 + 290, Input: 100 + 5, Output: 10 + 290, UncachedInput: 100 + 5}
		}
		if u != want {
			t.Fatalf("cut at %d of the later array: got %+v, want %+v", cut-len(first), u, want)
		}
	}
}

func TestUsageChargeIsTheReportedTotalOrElseTheSumOfTheParts(t *testing.T) {
	cases := []struct {
		usage string
		want  Usage
	}{
		{`{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}`, Usage{Total: 15, Input: 10, Output: 5, UncachedInput: 10}},
		{`{"prompt_tokens":10,"completion_tokens":5}`, Usage{Total: 15, Input: 10, Output: 5, UncachedInput: 10}},
		{`{"prompt_tokens":10,"completion_tokens":5,"total_tokens":0}`, Usage{Total: 15, Input: 10, Output: 5, UncachedInput: 10}},
		{`{"prompt_tokens":10,"completion_tokens":5,"total_tokens":20}`, Usage{Total: 20, Input: 10, Output: 5, UncachedInput: 10}},
		{`{"prompt_tokens":8,"total_tokens":8}`, Usage{Total: 8, Input: 8, Output: 0, UncachedInput: 8}},
		{`{"input_tokens":3,"output_tokens":4,"total_tokens":7,"input_tokens_details":{"cached_tokens":2}}`, Usage{Total: 7, Input: 3, Output: 4, UncachedInput: 3 - 2, CacheRead: 2}},
		{`{"input_tokens":3,"output_tokens":4,"total_tokens":20}`, Usage{Total: 20, Input: 3, Output: 4, UncachedInput: 3}},
		{`{"input_tokens":3,"output_tokens":4,"cache_creation_input_tokens":5,"cache_read_input_tokens":6,"cache_creation":{"ephemeral_5m_input_tokens":5}}`, Usage{Total: 18, Input: 8, Output: 4, UncachedInput: 3, CacheRead: 6, CacheWrite: 5}},
		{`{"promptTokenCount":100,"cachedContentTokenCount":80,"candidatesTokenCount":7,"totalTokenCount":107}`, Usage{Total: 107, Input: 100, Output: 7, UncachedInput: 100 - 80, CacheRead: 80}},
		{`{"promptTokenCount":100,"candidatesTokenCount":7,"thoughtsTokenCount":3,"toolUsePromptTokenCount":4}`, Usage{Total: 114, Input: 104, Output: 10, UncachedInput: 100 + 4, Reasoning: 3}},
		// Counts as JSON may write them.
		{`{"total_tokens":1.5e3}`, Usage{Total: 1500, Input: 0, Output: 0}},
		{`{"total_tokens":12.0}`, Usage{Total: 12, Input: 0, Output: 0}},
		{`{"total_tokens":-5,"prompt_tokens":2}`, Usage{Total: 2, Input: 2, Output: 0, UncachedInput: 2}},
		{`{"total_tokens":99999999999999999999999}`, Usage{Total: maxValue, Input: 0, Output: 0}},
		{`{"prompt_tokens":99999999999999999999999,"completion_tokens":1e30}`, Usage{Total: 2 * maxValue, Input: maxValue, Output: maxValue, UncachedInput: maxValue}},
		{`{"total_tokens":"15","prompt_tokens":true,"completion_tokens":null}`, Usage{}},
	}
	for _, c := range cases {
		if u, _ := meterJSON(`{"id":"x","usage":` + c.usage + `}`); u != c.want {
			t.Errorf("usage %s: got %+v, want %+v", c.usage, u, c.want)
		}
	}
}

func TestUsageOnlyJSONAndEventStreamBodiesInKnownEncodingsAreMetered(t *testing.T) {
	jsonBody := []byte(`{"usage":{"total_tokens":5}}`)
	sseBody := []byte("data: {\"usage\":{\"total_tokens\":5}}\n\n")
	cases := []struct {
		contentType, encoding string
		body                  []byte
		metered               bool
	}{
		{"application/json", "", jsonBody, true},
		{"Application/JSON; charset=UTF-8", "", jsonBody, true},
		{"application/problem+json", "", jsonBody, true},
		{"application/vnd.api+json", "identity", jsonBody, true},
		{"text/event-stream", "", sseBody, true},
		{"TEXT/EVENT-STREAM;charset=utf-8", "", sseBody, true},
		{"", "", jsonBody, false},
		{"text/plain", "", jsonBody, false},
		{"application/x-ndjson", "", jsonBody, false},
		{"+json", "", jsonBody, false},
		{"application/json", "compress", jsonBody, false},
		{"application/json", "gzip, br", jsonBody, false}, // layered codings
		{"application/json", "identity, identity", jsonBody, true},
		{"application/json", "snappy", jsonBody, false},
	}
	for _, c := range cases {
		u, metered := meterUsage(usagetest.Header(c.contentType, c.encoding), [][]byte{c.body})
		if metered != c.metered || (metered && u != Usage{Total: 5}) {
			t.Errorf("Content-Type %q, Content-Encoding %q: got (%+v, %v), want metered=%v", c.contentType, c.encoding, u, metered, c.metered)
		}
	}
	// The SSE reading of a JSON body, and the other way round, finds nothing.
	if _, metered := meterUsage(usagetest.Header("text/event-stream", ""), [][]byte{jsonBody}); metered {
		t.Error("a JSON body read as an event stream was metered")
	}
	if u, metered := meterUsage(nil, [][]byte{jsonBody}); metered || u != (Usage{}) {
		t.Error("a response without a header was metered")
	}
}

func TestUsageTruncatedStreamChargesWhatWasReportedBeforeTheCut(t *testing.T) {
	raw := usagetest.Read(t, "anthropic_messages_stream.sse")
	afterStart := bytes.Index(raw, []byte("event: content_block_start"))
	beforeDelta := bytes.Index(raw, []byte("event: message_delta"))
	deltaEnd := beforeDelta + bytes.Index(raw[beforeDelta:], []byte("\n\n")) + 1 // after its data line
	afterStartUsage, final := Usage{Total: 472 + 1024 + 2, Input: 472, Output: 2, UncachedInput: 472, CacheRead: 1024}, Usage{Total: 472 + 1024 + 89, Input: 472, Output: 89, UncachedInput: 472, CacheRead: 1024}
	var prev Usage
	for cut := 0; cut <= len(raw); cut++ {
		u, metered := meterUsage(usagetest.Header("text/event-stream", ""), [][]byte{raw[:cut]})
		switch {
		case shrank(u, prev):
			t.Fatalf("cut at %d: %+v, less than a shorter cut's %+v", cut, u, prev)
		case cut >= afterStart && cut < beforeDelta && (u != afterStartUsage || !metered):
			t.Fatalf("cut at %d (after message_start): got (%+v, %v), want (%+v, true)", cut, u, metered, afterStartUsage)
		case cut >= deltaEnd && u != final:
			t.Fatalf("cut at %d (after message_delta): got %+v, want %+v", cut, u, final)
		}
		prev = u
	}
	// An OpenAI stream cut before its usage chunk reported nothing.
	raw = usagetest.Read(t, "openai_chat_stream.sse")
	cut := bytes.Index(raw, []byte(`"choices":[],`))
	if u, metered := meterUsage(usagetest.Header("text/event-stream", ""), [][]byte{raw[:cut]}); metered {
		t.Fatalf("OpenAI stream cut before its usage: got (%+v, true), want unmetered", u)
	}
}

func TestOversizeEventIsSkippedAndLeavesTheResponseUnmeteredIfItAloneCarriedUsage(t *testing.T) {
	big := `data: {"pad":"` + strings.Repeat("a", MaxEvent) + `","usage":{"total_tokens":5}}` + "\n\n"
	small := "data: {\"usage\":{\"total_tokens\":7}}\n\n"
	for _, c := range usagetest.Chunkings() {
		if c.Name == "1-byte" {
			continue // a megabyte one byte at a time is slow under -race, and 7 max covers it
		}
		if u, metered := meterUsage(usagetest.Header("text/event-stream", ""), c.Split([]byte(big))); metered {
			t.Errorf("%s: an oversize event was metered (%+v)", c.Name, u)
		}
		if u, metered := meterUsage(usagetest.Header("text/event-stream", ""), c.Split([]byte(big+small))); u != (Usage{Total: 7}) || !metered {
			t.Errorf("%s: the event after an oversize one: got (%+v, %v), want ({7 0 0}, true)", c.Name, u, metered)
		}
	}
	// The meter holds no more than the maximum for it.
	m := NewMeter(usagetest.Header("text/event-stream", ""))
	m.Write([]byte(big[:len(big)-2]))
	if n := cap(m.sse.data) + cap(m.sse.line); n > 2*MaxEvent {
		t.Errorf("the meter holds %d bytes for an event of %d", n, len(big))
	}
	m.Finish()
}

func TestUsageFinishIsIdempotentAndWritesAfterItAreIgnored(t *testing.T) {
	for _, coding := range []string{"identity", "gzip"} {
		body := usagetest.Encode(t, coding, []byte(`{"usage":{"total_tokens":5}}`))
		m := NewMeter(usagetest.Header("application/json", usagetest.EncodingHeader(coding)))
		m.Write(body)
		a, am := m.Finish()
		if n, err := m.Write(body); n != len(body) || err != nil {
			t.Fatalf("Write after Finish = %d, %v", n, err)
		}
		b, bm := m.Finish()
		if a != (Usage{Total: 5}) || !am || a != b || am != bm {
			t.Fatalf("%s: Finish = (%+v, %v) then (%+v, %v), want ({5 0 0}, true) twice", coding, a, am, b, bm)
		}
	}
}

func TestEventsWithoutUsageCostNoAllocation(t *testing.T) {
	stream := usagetest.Read(t, "openai_chat_stream.sse")
	noUsage := stream[:bytes.Index(stream, []byte(`data: {"id":"chatcmpl-B1xK9qW2eR3tY4uI5oP6aS7dF8","object":"chat.completion.chunk","created":1739812400,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0aa8d3e20b","choices":[],`))]
	withUsage := stream[len(noUsage):]
	m := NewMeter(usagetest.Header("text/event-stream", ""))
	m.Write(stream) // grows the scratch buffers once
	if a := testing.AllocsPerRun(100, func() { m.Write(noUsage) }); a != 0 {
		t.Errorf("events without usage: %v allocations per Write, want 0", a)
	}
	if a := testing.AllocsPerRun(100, func() { m.Write(withUsage) }); a != 0 {
		t.Errorf("events with usage: %v allocations per Write, want 0", a)
	}
	// Cut lines and events: still none once the buffers have grown.
	if a := testing.AllocsPerRun(100, func() {
		for b := noUsage; len(b) > 0; {
			n := min(37, len(b))
			m.Write(b[:n])
			b = b[n:]
		}
	}); a != 0 {
		t.Errorf("events cut across Writes: %v allocations, want 0", a)
	}
	if u, metered := m.Finish(); u != (Usage{Total: 31, Input: 19, Output: 12, UncachedInput: 19}) || !metered {
		t.Errorf("got (%+v, %v), want ({31 19 12 19}, true)", u, metered)
	}
	j := NewMeter(usagetest.Header("application/json", ""))
	body := usagetest.Read(t, "openai_chat.json")
	if a := testing.AllocsPerRun(100, func() { j.json.reset(); j.Write(body) }); a != 0 {
		t.Errorf("a JSON body: %v allocations per Write, want 0", a)
	}
	chunk := []byte(`{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`)
	if a := testing.AllocsPerRun(100, func() { IsUsageOnlyChunk(chunk) }); a != 0 {
		t.Errorf("IsUsageOnlyChunk: %v allocations, want 0", a)
	}
}

func TestOnlyEventsThatMayCarryUsageAreScanned(t *testing.T) {
	cases := []struct {
		data string
		want bool
	}{
		{`{"usage":{"total_tokens":1}}`, true},
		{`{"usageMetadata":{"totalTokenCount":1}}`, true},
		{`{"a":1,"usage" :` + "\n" + ` {}}`, true},
		{`{"x":{"usage":5}}`, true}, // the scan decides
		{`"usage":`, true},
		{`{"usage":null}`, false},
		{`{"usage": null,"usageMetadata" :null}`, false},
		{`{"usage":null,"message":{"usage":{"input_tokens":1}}}`, true},
		{`{"text":"the usage of \"usage\" is text"}`, false},
		{`{"usages":{}}`, false},
		{`{"my_usage":{}}`, false},
		{`usage`, false},
		{`"usage`, false},
		{`"usage"`, false},
		{`"usage" `, false},
		{``, false},
		{`ggggg`, false},
	}
	for _, c := range cases {
		if got := mayCarryUsage([]byte(c.data)); got != c.want {
			t.Errorf("mayCarryUsage(%s) = %v, want %v", c.data, got, c.want)
		}
	}
}

// FuzzUsageMeter feeds arbitrary bodies, as JSON, SSE or an AWS event
// stream (fuzzShapes), in any of the codings, split at arbitrary points: the
// meter must not panic, must charge the same whatever the split, must charge
// no part above the total, and must stay within its memory bounds.
func FuzzUsageMeter(f *testing.F) {
	for i, file := range usagetest.Files() {
		raw := usagetest.Read(f, file)
		shape := uint8(slices.Index(fuzzShapes, usagetest.ContentType(file)))
		for c, coding := range usagetest.Encodings {
			f.Add(shape, uint8(c), usagetest.Encode(f, coding, raw), uint64(i*31+c))
		}
		f.Add(shape+1, uint8(0), raw, uint64(i))
	}
	f.Add(uint8(1), uint8(0), []byte("data: {\"usage\":{\"total_tokens\":5}}\r\rdata: x\r"), uint64(3))
	f.Add(uint8(0), uint8(0), []byte(`[{"usage":{"total_tokens":5}},{"message":{"usage":{"input_tokens":1e400}}}]`), uint64(5))
	f.Add(uint8(0), uint8(0), []byte(`[{"message":{"usage":{"iterations":[{"input_tokens":1,"cache_creation":{}},[{}],{"output_tokens":2}]}}},{"usageMetadata":{"promptTokenCount":3}}]`), uint64(7))
	f.Add(uint8(2), uint8(0), []byte("\xff\xff\xff\xff\x00\x00\x00\x10\x00\x00\x00\x00"), uint64(9))
	f.Fuzz(func(t *testing.T, shape, coding uint8, body []byte, seed uint64) {
		ct := fuzzShapes[int(shape)%len(fuzzShapes)]
		h := usagetest.Header(ct, usagetest.EncodingHeader(usagetest.Encodings[int(coding)%len(usagetest.Encodings)]))
		whole, wholeMetered := meterUsage(h, [][]byte{body})
		r := rand.New(rand.NewPCG(seed, seed>>32))
		var chunks [][]byte
		for b := body; len(b) > 0; {
			n := min(1+r.IntN(1+int(seed%64)), len(b))
			chunks = append(chunks, b[:n])
			b = b[n:]
		}
		m := NewMeter(h)
		for _, c := range chunks {
			m.Write(c)
			if m.sse != nil && (cap(m.sse.data) > 2*MaxEvent || cap(m.sse.line) > 2*MaxEvent) {
				t.Fatalf("SSE buffers grew to %d and %d", cap(m.sse.data), cap(m.sse.line))
			}
			if m.es != nil && !m.es.withinBounds() {
				t.Fatalf("event stream buffers grew to %d, %d and %d", cap(m.es.msg), cap(m.es.payload), cap(m.es.chunk))
			}
		}
		split, splitMetered := m.Finish()
		if m.panicked != nil {
			t.Fatalf("the meter recovered from a panic: %v", m.panicked)
		}
		if whole != split || wholeMetered != splitMetered {
			t.Fatalf("whole body: (%+v, %v); split in %d: (%+v, %v)", whole, wholeMetered, len(chunks), split, splitMetered)
		}
		// Input and Output are parts of Total, and each priced part of its whole.
		if whole.Input < 0 || whole.Output < 0 || whole.Input > whole.Total || whole.Output > whole.Total ||
			!partsWithinWholes(whole) || (!wholeMetered && whole != Usage{}) {
			t.Fatalf("got (%+v, %v)", whole, wholeMetered)
		}
		if IsUsageOnlyChunk(body) && !bytes.Contains(body, []byte(`"usage"`)) {
			t.Fatal("a usage-only chunk without usage")
		}
	})
}

// fuzzShapes are the Content-Types FuzzUsageMeter reads a body as.
var fuzzShapes = []string{usagetest.ContentType("x.json"), usagetest.ContentType("x.sse"), usagetest.ContentType("x.eventstream.json")}

// partsWithinWholes reports whether each priced part of u is at most its
// whole, and none is negative.
func partsWithinWholes(u Usage) bool {
	return u.UncachedInput >= 0 && u.CacheRead >= 0 && u.CacheWrite >= 0 && u.Reasoning >= 0 && u.AudioInput >= 0 && u.AudioOutput >= 0 &&
		u.UncachedInput <= u.Input && u.CacheRead <= u.Total && u.CacheWrite <= u.Input && u.AudioInput <= u.Input &&
		u.Reasoning <= u.Output && u.AudioOutput <= u.Output
}
