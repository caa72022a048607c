package usage

import (
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

func TestIsUsageOnlyChunkRecognizesTheIncludeUsageChunkOnly(t *testing.T) {
	cases := []struct {
		data string
		want bool
	}{
		{`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, true},
		{` { "choices" : [ ] , "usage" : { } } `, true},
		{"{\"usage\":{\"total_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":0}},\n\"choices\":[\r\n]}", true},
		{`{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}`, false},
		{`{"choices":[],"usage":null}`, false},
		{`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"total_tokens":3}}`, false},
		{`{"choices":[],"x":{"usage":{"total_tokens":3}}}`, false},
		{`{"x":{"choices":[]},"usage":{"total_tokens":3}}`, false},
		{`{"choices":[],"usage":{"total_tokens":3}`, false}, // unclosed
		{`{"choices":[],"usage":{"total_tokens":3}} x`, false},
		{`{"choices":[],"usage":{"total_tokens":3]}`, false},
		{`{"choices":[],"usage":"{\"total_tokens\":3}"}`, false},
		{`{"choices":"[]","usage":{}}`, false},
		{`[{"choices":[],"usage":{}}]`, false},
		{`[DONE]`, false},
		{``, false},
		{`{"choices":[],"usage":{"a":"\"}"}}`, true},
		{`{"choices":[],"usage":{"a":"\\"}}`, true},
		{`{"choices":[],"usage":{"a":"\\\"}}`, false},
	}
	for _, c := range cases {
		if got := IsUsageOnlyChunk([]byte(c.data)); got != c.want {
			t.Errorf("IsUsageOnlyChunk(%s) = %v, want %v", c.data, got, c.want)
		}
	}
	// The golden stream has exactly one, its usage chunk.
	var found []string
	s := NewSSEScanner(MaxEvent, func(ev SSEEvent) {
		if IsUsageOnlyChunk(ev.Data) {
			found = append(found, string(ev.Data))
		}
	})
	s.Write(usagetest.Read(t, "openai_chat_stream.sse"))
	s.Flush()
	if len(found) != 1 || !strings.Contains(found[0], `"total_tokens":31`) {
		t.Fatalf("usage-only chunks in the golden stream: %q", found)
	}
}
