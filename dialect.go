package ratelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
)

// dialect is the API shape a request speaks, which the handler's own
// answers take, so that each provider's SDK reads them as its own errors.
type dialect uint8

const (
	dialectOpenAI dialect = iota
	dialectAnthropic
	dialectGemini
)

// dialectOf is the dialect of a request of the call: the configured one (the
// dialect option), or its API's provider's (llmapi: Anthropic Messages, on
// any mount and on Vertex AI; Gemini; else OpenAI).
func dialectOf(configured string, call llmapi.Call) dialect {
	switch configured {
	case "openai":
		return dialectOpenAI
	case "anthropic":
		return dialectAnthropic
	case "gemini":
		return dialectGemini
	}
	switch call.Provider() {
	case llmapi.Anthropic:
		return dialectAnthropic
	case llmapi.Google:
		return dialectGemini
	}
	return dialectOpenAI
}

// errorAnswer is one of the handler's own error answers.
type errorAnswer struct {
	status      int
	message     string
	typ, code   string // OpenAI's error type and code
	scope       string // the refusing scope, if any: the quota's subject
	retryMillis int64  // the wait the answer announces; 0: none
	// quota: a spent budget, answered as each provider answers an
	// exhausted quota, which its SDK classifies as one: OpenAI's
	// insufficient_quota (typ and code), Anthropic's
	// enforced_spend_limit_reached, Google's QuotaFailure.
	quota bool
}

// anthropicSpendLimit is the error_code of Anthropic's answer to a spend
// limit reached, which its SDKs raise as EnforcedSpendLimitReachedError.
const anthropicSpendLimit = "enforced_spend_limit_reached"

// write writes e in the dialect's error shape: OpenAI's {"error":{message,
// type, param, code}}; Anthropic's {"type":"error","error":{type, message}},
// with details.error_code for a quota; or Google's {"error":{code, message,
// status, details}}, with a QuotaFailure for a quota and a RetryInfo
// carrying the wait.
func (d dialect) write(w http.ResponseWriter, e errorAnswer) error {
	var v any
	switch d {
	case dialectAnthropic:
		body := map[string]any{"type": anthropicErrorType(e.status), "message": e.message}
		if e.quota {
			body["details"] = map[string]any{"error_code": anthropicSpendLimit}
		}
		v = map[string]any{"type": "error", "error": body}
	case dialectGemini:
		body := map[string]any{"code": e.status, "message": e.message, "status": googleStatus(e.status)}
		var details []any
		if e.quota {
			details = append(details, map[string]any{
				"@type":      "type.googleapis.com/google.rpc.QuotaFailure",
				"violations": []any{map[string]any{"subject": e.scope, "description": e.message}},
			})
		}
		if e.retryMillis > 0 {
			details = append(details, map[string]any{
				"@type":      "type.googleapis.com/google.rpc.RetryInfo",
				"retryDelay": fmt.Sprintf("%d.%03ds", e.retryMillis/1000, e.retryMillis%1000),
			})
		}
		if details != nil {
			body["details"] = details
		}
		v = map[string]any{"error": body}
	default:
		v = map[string]any{"error": map[string]any{"message": e.message, "type": e.typ, "param": nil, "code": e.code}}
	}
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(e.status)
	_, err = w.Write(body)
	return err
}

// anthropicErrorType is the error type Anthropic's API gives a status.
func anthropicErrorType(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusServiceUnavailable:
		return "overloaded_error"
	case status >= 500:
		return "api_error"
	}
	return "invalid_request_error"
}

// googleStatus is the google.rpc.Code name of a status.
func googleStatus(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case status == http.StatusForbidden:
		return "PERMISSION_DENIED"
	case status == http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	case status >= 500:
		return "INTERNAL"
	case status == http.StatusBadRequest:
		return "INVALID_ARGUMENT" // as Gemini answers a request it cannot serve as sent
	}
	return "FAILED_PRECONDITION"
}
