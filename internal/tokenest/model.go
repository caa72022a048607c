package tokenest

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
)

// Model is the model a request of the call asks for: the one its path
// names (Gemini, Vertex AI, Azure OpenAI), else the JSON body's top-level
// "model" string (OpenAI, Anthropic); "" when there is none or the body is
// not a JSON object.
func Model(call llmapi.Call, body []byte) string {
	if call.Model != "" {
		return call.Model
	}
	return bodyModel(body)
}

// bodyModel is the top-level "model" string of a JSON object (the last, if
// the key repeats), read with the estimator's own parser, which skips the
// rest of a body of any size without allocating: encoding/json would take
// milliseconds over a long conversation. Only a model string with escapes
// or invalid UTF-8 is decoded by encoding/json, as it would be.
func bodyModel(body []byte) string {
	p := parser{b: body}
	if p.peek() != '{' {
		return ""
	}
	var model string
	p.members(func(key word) {
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
		return ""
	}
	return model
}
