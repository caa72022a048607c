package tokenest

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
)

func TestModelIsReadFromThePathOrTheBodyAsEachAPINamesIt(t *testing.T) {
	for _, c := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"model":"gpt-4o-2024-08-06","messages":[]}`, "gpt-4o-2024-08-06"},
		{"/v1/messages", `{"max_tokens":5,"model":"claude-sonnet-4-5"}`, "claude-sonnet-4-5"},
		{"/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[]}`, "gemini-2.5-flash"},
		{"/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", ``, "gemini-2.5-pro"},
		{"/v1beta/models/gemini-2.5-pro:countTokens", ``, "gemini-2.5-pro"},
		{"/openai/deployments/my-gpt4o/chat/completions", `{"messages":[]}`, "my-gpt4o"},
		{"/v1/models/gpt-4o", ``, ""}, // OpenAI's model listing: no method
		{"/v1/chat/completions", `{"model":42}`, ""},
		{"/v1/chat/completions", `not json`, ""},
		{"/v1/chat/completions", `{"model":"a\u002fb"}`, "a/b"},
		{"/v1/embeddings", ``, ""},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"{\"model\":\"inner\"}"}],"model":"outer"}`, "outer"},
		{"/v1/chat/completions", `{"model":"first","model":"second"}`, "second"},
		{"/v1/chat/completions", `{"model":"first","model":null}`, ""},
		{"/v1/chat/completions", `{"metadata":{"model":"nested"}}`, ""},
		{"/v1/chat/completions", `{"model":"gpt-4o"} trailing`, ""},
		{"/v1/chat/completions", `{"model":"gpt-4o",}`, ""},
	} {
		if got := Model(llmapi.Of(c.path), []byte(c.body)); got != c.want {
			t.Errorf("Model(llmapi.Of(%q), %s) = %q, want %q", c.path, c.body, got, c.want)
		}
	}
}

// The body's model is what encoding/json finds as the top-level "model"
// string of a valid JSON object (keys matched exactly; the last one wins),
// and nothing for anything else.
func FuzzModelReadsTheBodyAsEncodingJSONDoes(f *testing.F) {
	f.Add("/v1beta/models/x:generateContent", []byte(`{"model":"m"}`))
	f.Add("/v1/chat/completions", []byte(`{"model":"a\u00e9\"b","messages":[{"content":"x"}]}`))
	f.Add("/v1/chat/completions", []byte(`{"model":"a","model":1}`))
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		got := Model(llmapi.Of("/v1/chat/completions"), body)
		want := ""
		var members map[string]json.RawMessage
		if json.Unmarshal(body, &members) == nil {
			if json.Unmarshal(members["model"], &want) != nil {
				want = ""
			}
		}
		if got != want {
			t.Fatalf("Model of %q = %q, encoding/json finds %q", body, got, want)
		}
		Model(llmapi.Of(path), body) // never panics
	})
}

func BenchmarkModelOfALongConversation(b *testing.B) {
	body := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("a long conversation ", 50_000) + `"}],"model":"gpt-4o"}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if Model(llmapi.Of("/v1/chat/completions"), body) != "gpt-4o" {
			b.Fatal("no model")
		}
	}
}
