package usage

import (
	"bytes"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// finalOf meters body cut after its first n bytes and reports whether the
// meter calls what it read the final report.
func finalOf(h http.Header, body []byte, n int) bool {
	m := NewMeter(h)
	m.Write(body[:n])
	return m.Final()
}

// terminalLine matches each API's terminal event in a stream, as the
// providers document it: Anthropic's message_delta, the Responses API's
// response.completed (or incomplete, failed), Gemini's chunk with a
// finishReason, OpenAI's usage chunk (its choices empty), Cohere's
// message-end.
var (
	terminalLine = regexp.MustCompile(`"type":\s*"(message_delta|message-end|response\.(completed|incomplete|failed))"|"finishReason":\s*"`)
	noChoices    = regexp.MustCompile(`"choices":\s*\[\s*\]`)
	usageOpens   = regexp.MustCompile(`"usage":\s*\{`)
)

// isTerminalLine reports whether a stream's line is its terminal event's.
func isTerminalLine(line []byte) bool {
	return terminalLine.Match(line) || noChoices.Match(line) && usageOpens.Match(line)
}

// finalAt is the length of the shortest cut of body that holds a final
// report whole, and of the shortest that holds its last: a JSON body's last
// closing brace (a top-level array's last element closes there), a
// stream's first and last terminal events' (the end of each one's data
// line's JSON; a compatible backend may send a second message_delta). -1
// for a stream without a terminal event.
func finalAt(body []byte, stream bool) (first, last int) {
	if !stream {
		at := bytes.LastIndexByte(body, '}') + 1
		return at, at
	}
	first, last = -1, -1
	off := 0
	for line := range bytes.Lines(body) {
		if isTerminalLine(line) {
			last = off + bytes.LastIndexByte(line, '}') + 1
			if first < 0 {
				first = last
			}
		}
		off += len(line)
	}
	return first, last
}

// checkFinalFromItsTerminalEvent checks that body, cut after each of cuts
// bytes, is not final before its first final report is whole, and is from
// its last on.
func checkFinalFromItsTerminalEvent(t *testing.T, name, contentType string, body []byte, cuts []int) {
	t.Helper()
	h := usagetest.Header(contentType, "")
	first, last := finalAt(body, strings.EqualFold(MediaType(contentType), "text/event-stream"))
	if strings.HasSuffix(name, ".eventstream.json") {
		ends := usagetest.EventStreamTerminals(t, name)
		first, last = ends[0], ends[len(ends)-1]
	}
	if first < 0 {
		t.Fatalf("%s: no terminal event", name)
	}
	for _, n := range cuts {
		if n >= first && n < last {
			continue
		}
		if got, want := finalOf(h, body, n), n >= last; got != want {
			t.Fatalf("%s cut after %d bytes (its final report ends at %d): Final %v, want %v; the cut ends in %q",
				name, n, last, got, want, body[max(n-80, 0):n])
		}
	}
}

// Every golden sample is final exactly from the byte that ends its final
// report (each API's terminal event, or a JSON body's last brace) on, cut
// anywhere: a stream cut before it reported a running count (Anthropic's
// message_start, Gemini's prompt-only chunks) that is no final count.
// Between two terminal events (a compatible backend's two message_delta)
// either may hold.
func TestAResponseIsFinalExactlyOnceItsTerminalEventIsReadWhole(t *testing.T) {
	for _, g := range usagetest.Goldens {
		if !g.Metered || usagetest.CutShort[g.File] {
			continue
		}
		body := usagetest.Read(t, g.File)
		cuts := make([]int, len(body)+1)
		for n := range cuts {
			cuts[n] = n
		}
		checkFinalFromItsTerminalEvent(t, g.File, usagetest.ContentType(g.File), body, cuts)
	}
	for file := range usagetest.CutShort {
		body := usagetest.Read(t, file)
		if finalOf(usagetest.Header(usagetest.ContentType(file), ""), body, len(body)) {
			t.Errorf("%s ends before its final report, and is final", file)
		}
	}
}

// A document is a final report only as its API's terminal event, read
// whole: not a terminal type or a finish reason written in the text the
// model generates, nor a terminal event cut short, nor a running count that
// follows a final one.
func TestOnlyATerminalEventReadWholeIsAFinalReport(t *testing.T) {
	for _, c := range []struct {
		what, events string
		final        bool
	}{
		{"Anthropic's message_delta", `{"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":1}}}` + "\n" +
			`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9}}`, true},
		{"Anthropic's message_start alone", `{"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":1}}}`, false},
		{"message_delta's name in the text", `{"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":1}}}` + "\n" +
			`{"type":"content_block_delta","delta":{"type":"text_delta","text":"{\"type\":\"message_delta\",\"usage\":{\"output_tokens\":1}}"}}`, false},
		{"an escaped type names nothing", `{"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":1}}}` + "\n" +
			`{"type":"message\u005fdelta","usage":{"output_tokens":9},"choices":[{"index":0}]}`, false},
		{"a message_delta without usage", `{"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":1}}}` + "\n" +
			`{"type":"message_delta","delta":{"stop_reason":"end_turn"}}`, false},
		{"the Responses API's response.completed", `{"type":"response.created","response":{"usage":null}}` + "\n" +
			`{"type":"response.completed","response":{"usage":{"input_tokens":5,"output_tokens":9,"total_tokens":14}}}`, true},
		{"response.incomplete", `{"type":"response.incomplete","response":{"usage":{"input_tokens":5,"output_tokens":9,"total_tokens":14}}}`, true},
		{"response.failed", `{"type":"response.failed","response":{"usage":{"input_tokens":5,"output_tokens":0,"total_tokens":5}}}`, true},
		{"response.failed without usage", `{"type":"response.failed","response":{"usage":null}}`, false},
		{"Gemini's chunks before a finishReason", `{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":15,"totalTokenCount":15}}`, false},
		{"Gemini's chunk with a finishReason", `{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":15,"totalTokenCount":15}}` + "\n" +
			`{"candidates":[{"content":{"parts":[{"text":"b"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":15,"candidatesTokenCount":8,"totalTokenCount":23}}`, true},
		{"a finishReason in Gemini's text", `{"candidates":[{"content":{"parts":[{"text":"\"finishReason\":\"STOP\""}]}}],"usageMetadata":{"promptTokenCount":15,"totalTokenCount":15}}`, false},
		{"a null finishReason", `{"candidates":[{"finishReason":null}],"usageMetadata":{"promptTokenCount":15,"totalTokenCount":15}}`, false},
		{"a running count after a final one", `{"candidates":[{"index":0,"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":15,"candidatesTokenCount":8,"totalTokenCount":23}}` + "\n" +
			`{"candidates":[{"index":1}],"usageMetadata":{"promptTokenCount":15,"candidatesTokenCount":9,"totalTokenCount":24}}`, false},
		{"OpenAI's usage chunk", `{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}` + "\n" +
			`{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}`, true},
		{"OpenAI's finish_reason without the usage chunk", `{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}`, false},
		{"a compatible backend's usage beside its finish_reason", `{"choices":[{"index":0,"delta":{},"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}`, true},
		{"a running usage beside an unfinished choice", `{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`, false},
	} {
		var stream strings.Builder
		for ev := range strings.Lines(c.events) {
			stream.WriteString("data: " + strings.TrimSuffix(ev, "\n") + "\n\n")
		}
		body := []byte(stream.String())
		h := usagetest.Header("text/event-stream", "")
		if got := finalOf(h, body, len(body)); got != c.final {
			t.Errorf("%s: Final %v, want %v", c.what, got, c.final)
		}
		if c.final {
			// Cut inside the last event's JSON: not final.
			last := bytes.LastIndexByte(body, '}')
			if finalOf(h, body, last) {
				t.Errorf("%s: final with its terminal event cut short", c.what)
			}
		}
	}
	// A JSON body is final once its top-level value is read whole, and only
	// then: a Gemini stream answered as a JSON array, cut between chunks
	// that reported only the prompt, is not.
	h := usagetest.Header("application/json", "")
	array := []byte(`[{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":15,"totalTokenCount":15}},` +
		`{"candidates":[{"content":{"parts":[{"text":"b"}]}}],"usageMetadata":{"promptTokenCount":15,"totalTokenCount":15}}]`)
	if cut := bytes.LastIndexByte(array, ','); finalOf(h, array, cut) || !finalOf(h, array, len(array)) {
		t.Errorf("a JSON array of chunks: final cut after its first chunk %v, whole %v; want false, true", finalOf(h, array, cut), finalOf(h, array, len(array)))
	}
	object := []byte(`{"object":"chat.completion","choices":[{"index":0,"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}`)
	if finalOf(h, object, len(object)-1) || !finalOf(h, object, len(object)) {
		t.Error("a JSON body: final before its last brace, or not once read whole")
	}
}
