package tokenest

import "testing"

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
	} {
		if got := Model(c.path, []byte(c.body)); got != c.want {
			t.Errorf("Model(%q, %s) = %q, want %q", c.path, c.body, got, c.want)
		}
	}
}

func FuzzModel(f *testing.F) {
	f.Add("/v1beta/models/x:generateContent", []byte(`{"model":"m"}`))
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		Model(path, body) // never panics
	})
}
