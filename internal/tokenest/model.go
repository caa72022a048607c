package tokenest

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// Model is the model a request asks for: the path's for Gemini
// (…/models/<model>:generateContent, :streamGenerateContent, :countTokens)
// and Azure OpenAI (…/openai/deployments/<deployment>/…), else the JSON
// body's top-level "model" string (OpenAI, Anthropic); "" when there is none
// or the body is not a JSON object.
func Model(path string, body []byte) string {
	path, _, _ = strings.Cut(path, "?")
	if model, ok := GeminiCall(path); ok && model != "" && !strings.Contains(model, "/") {
		return model
	}
	if _, rest, ok := strings.Cut(path, "/openai/deployments/"); ok {
		if deployment, _, _ := strings.Cut(rest, "/"); deployment != "" {
			return deployment
		}
	}
	return bodyModel(body)
}

// GeminiCall reports whether path is a call of Gemini's API that this
// package reads, …/models/<model>:generateContent, :streamGenerateContent
// or :countTokens, and the model segment it names.
func GeminiCall(path string) (model string, ok bool) {
	_, rest, found := strings.Cut(path, "/models/")
	if !found {
		return "", false
	}
	model, method, _ := strings.Cut(rest, ":")
	switch method {
	case "generateContent", "streamGenerateContent", "countTokens":
		return model, true
	}
	return "", false
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
