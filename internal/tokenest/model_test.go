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
		{"/model/us.anthropic.claude-sonnet-4-20250514-v1:0/converse", `{"messages":[]}`, "us.anthropic.claude-sonnet-4-20250514-v1:0"},
		{"/model/arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2/invoke", `{"model":"ignored"}`,
			"arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2"},
		{"/v2/chat", `{"model":"command-a-03-2025","messages":[]}`, "command-a-03-2025"},
	} {
		if got, ambiguous := Model(llmapi.Of(c.path), []byte(c.body)); got != c.want || ambiguous {
			t.Errorf("Model(llmapi.Of(%q), %s) = %q, %v, want %q, false", c.path, c.body, got, ambiguous, c.want)
		}
	}
}

// A body that names its model under two spellings of the key, which an
// upstream decoding into a Go struct reads without regard to case, is
// ambiguous, whichever comes last and whether or not "model" is one of
// them; keys of nested objects, and a model the path names, do not count.
func TestAModelKeySpelledTwoWaysIsAmbiguous(t *testing.T) {
	for _, c := range []struct {
		path, body string
		ambiguous  bool
	}{
		{"/v1/chat/completions", `{"model":"cheap","MODEL":"dear"}`, true},
		{"/v1/chat/completions", `{"Model":"dear","model":"cheap"}`, true},
		{"/v1/messages", `{"max_tokens":5,"mOdEl":"dear"}`, true},
		{"/v1/chat/completions", `{"model":"cheap","\u004dodel":"dear"}`, true},
		{"/v1/chat/completions", `{"model":"cheap","MODEL":null}`, true},
		{"/v1/chat/completions", `{"model":"cheap","mod\u0065l":"dear"}`, false}, // one key, as every decoder unescapes it
		{"/v1/chat/completions", `{"model":"cheap","model":"dear"}`, false},      // the last, for every decoder
		{"/v1/chat/completions", `{"model":"cheap","metadata":{"MODEL":"x"}}`, false},
		{"/v1/chat/completions", `{"model":"cheap","models":"x","modeI":"y"}`, false},
		{"/v1beta/models/gemini-2.5-flash:generateContent", `{"MODEL":"x","model":"y"}`, false},
	} {
		if _, ambiguous := Model(llmapi.Of(c.path), []byte(c.body)); ambiguous != c.ambiguous {
			t.Errorf("Model(llmapi.Of(%q), %s): ambiguous %v, want %v", c.path, c.body, ambiguous, c.ambiguous)
		}
	}
}

// The body's model is what encoding/json finds as the top-level "model"
// string of a valid JSON object (keys matched exactly; the last one wins),
// and nothing for anything else; it is ambiguous when encoding/json finds
// another top-level key that is "model" but for case, as a Go struct's
// field named Model matches.
func FuzzModelReadsTheBodyAsEncodingJSONDoes(f *testing.F) {
	f.Add("/v1beta/models/x:generateContent", []byte(`{"model":"m"}`))
	f.Add("/v1/chat/completions", []byte(`{"model":"a\u00e9\"b","messages":[{"content":"x"}]}`))
	f.Add("/v1/chat/completions", []byte(`{"model":"a","model":1}`))
	f.Add("/v1/chat/completions", []byte(`{"model":"a","MODEL":"b"}`))
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		got, ambiguous := Model(llmapi.Of("/v1/chat/completions"), body)
		want, wantAmbiguous := "", false
		var members map[string]json.RawMessage
		if json.Unmarshal(body, &members) == nil {
			if json.Unmarshal(members["model"], &want) != nil {
				want = ""
			}
			for k := range members {
				wantAmbiguous = wantAmbiguous || k != "model" && strings.EqualFold(k, "model")
			}
		}
		if got != want || ambiguous != wantAmbiguous {
			t.Fatalf("Model of %q = %q, ambiguous %v; encoding/json finds %q, ambiguous %v", body, got, ambiguous, want, wantAmbiguous)
		}
		Model(llmapi.Of(path), body) // never panics
	})
}

func BenchmarkModelOfALongConversation(b *testing.B) {
	body := []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("a long conversation ", 50_000) + `"}],"model":"gpt-4o"}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if m, _ := Model(llmapi.Of("/v1/chat/completions"), body); m != "gpt-4o" {
			b.Fatal("no model")
		}
	}
}
