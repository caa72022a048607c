package tokenest

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
)

// Model is the model a request of the call asks for: the one its path
// names (Gemini, Vertex AI, Azure OpenAI), else the JSON body's top-level
// "model" string (OpenAI, Anthropic); "" when there is none or the body is
// not a JSON object. ambiguous reports a body that also has a top-level key
// that is "model" but for case ("MODEL", "Model"): an upstream that decodes
// JSON into a Go struct matches keys without regard to case and reads the
// last of them, where Python and JavaScript read "model" alone, so the
// client would choose which model a limiter that read one of them counts.
func Model(call llmapi.Call, body []byte) (model string, ambiguous bool) {
	if call.Model != "" {
		return call.Model, false
	}
	return bodyModel(body)
}

// bodyModel is the top-level "model" string of a JSON object (the last, if
// the key repeats), read with the estimator's own parser, which skips the
// rest of a body of any size without allocating: encoding/json would take
// milliseconds over a long conversation. Only a model string with escapes
// or invalid UTF-8 is decoded by encoding/json, as it would be.
func bodyModel(body []byte) (model string, ambiguous bool) {
	p := parser{b: body}
	if p.peek() != '{' {
		return "", false
	}
	p.members(func(key word) {
		ambiguous = ambiguous || string(key.bytes()) != "model" && sameFolded(key.bytes(), "model")
		if string(key.bytes()) != "model" || p.peek() != '"' {
			if string(key.bytes()) == "model" {
				model = "" // not a string: no model, as a later key wins
			}
			p.skip()
			return
		}
		start := p.i
		_, raw, esc := p.str(false)
		model = string(raw)
		if (esc || !utf8.Valid(raw)) && json.Unmarshal(p.b[start:p.i], &model) != nil {
			model = ""
		}
	})
	if p.bad || p.ws() {
		return "", false
	}
	return model, ambiguous
}
