package tokenest

import (
	"encoding/json"
	"strings"
)

// Model is the model a request asks for: the path's for Gemini
// (…/models/<model>:generateContent, :streamGenerateContent, :countTokens)
// and Azure OpenAI (…/openai/deployments/<deployment>/…), else the JSON
// body's top-level "model" string (OpenAI, Anthropic); "" when there is none
// or the body is not a JSON object.
func Model(path string, body []byte) string {
	path, _, _ = strings.Cut(path, "?")
	if _, rest, ok := strings.Cut(path, "/models/"); ok {
		if model, method, ok := strings.Cut(rest, ":"); ok && model != "" && !strings.Contains(model, "/") &&
			(method == "generateContent" || method == "streamGenerateContent" || method == "countTokens") {
			return model
		}
	}
	if _, rest, ok := strings.Cut(path, "/openai/deployments/"); ok {
		if deployment, _, _ := strings.Cut(rest, "/"); deployment != "" {
			return deployment
		}
	}
	if len(body) == 0 {
		return ""
	}
	var req struct {
		Model json.RawMessage `json:"model"`
	}
	var model string
	if json.Unmarshal(body, &req) != nil || json.Unmarshal(req.Model, &model) != nil {
		return ""
	}
	return model
}
