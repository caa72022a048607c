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
	dialectBedrock
	dialectCohere
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
	case "bedrock":
		return dialectBedrock
	case "cohere":
		return dialectCohere
	}
	switch call.Provider() {
	case llmapi.Anthropic:
		return dialectAnthropic
	case llmapi.Google:
		return dialectGemini
	case llmapi.Bedrock:
		return dialectBedrock
	case llmapi.Cohere:
		return dialectCohere
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
	// enforced_spend_limit_reached, Google's QuotaFailure, Bedrock's
	// ServiceQuotaExceededException.
	quota bool
	// tooLarge: a request no wait would admit (Bedrock's
	// ValidationException).
	tooLarge bool
}

// anthropicSpendLimit is the error_code of Anthropic's answer to a spend
// limit reached, which its SDKs raise as EnforcedSpendLimitReachedError.
const anthropicSpendLimit = "enforced_spend_limit_reached"

// write writes e in the dialect's error shape: OpenAI's {"error":{message,
// type, param, code}}; Anthropic's {"type":"error","error":{type, message}},
// with details.error_code for a quota; or Google's {"error":{code, message,
// status, details}}, with a QuotaFailure for a quota and a RetryInfo
// carrying the wait; or Bedrock's and Cohere's {"message"}, Bedrock's with
// its error code in x-amzn-ErrorType, which the AWS SDKs read, and the
// wait in x-amz-retry-after, in milliseconds.
func (d dialect) write(w http.ResponseWriter, e errorAnswer) error {
	h := w.Header()
	var v any
	switch d {
	case dialectBedrock:
		h.Set("X-Amzn-Errortype", bedrockErrorCode(e))
		if e.retryMillis > 0 {
			h.Set("X-Amz-Retry-After", strconv.FormatInt(e.retryMillis, 10))
		}
		v = map[string]any{"message": e.message}
	case dialectCohere:
		v = map[string]any{"message": e.message}
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
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(e.status)
	_, err = w.Write(body)
	return err
}

// limitStatus is the status of a refusal by a limit in the dialect (a
// spent budget's, quota; a request too large's, tooLarge), unless the
// status option sets one: 429, the status every SDK reads as a rate
// limit; but the AWS SDKs for JavaScript retry every 429
// whatever its code, and Cohere's retry every 429 whatever its headers,
// so where no wait would help (a spent budget, a request too large) those
// dialects answer as their providers do: Bedrock 400 (its
// ServiceQuotaExceededException and ValidationException), Cohere 402 for
// a spent budget (its billing limit reached) and 400 for a request too
// large ("too many tokens").
func (d dialect) limitStatus(quota, tooLarge bool) int {
	switch {
	case d == dialectCohere && quota:
		return http.StatusPaymentRequired
	case (d == dialectBedrock || d == dialectCohere) && (quota || tooLarge):
		return http.StatusBadRequest
	}
	return http.StatusTooManyRequests
}

// bedrockErrorCode is the Bedrock error code of an answer, which the AWS
// SDKs read from x-amzn-ErrorType to decide whether to retry: they retry
// ThrottlingException (after x-amz-retry-after) and 5xx answers, never
// ServiceQuotaExceededException or ValidationException.
func bedrockErrorCode(e errorAnswer) string {
	switch {
	case e.quota:
		return "ServiceQuotaExceededException"
	case e.tooLarge:
		return "ValidationException"
	case e.status == http.StatusTooManyRequests:
		return "ThrottlingException"
	case e.status == http.StatusUnauthorized || e.status == http.StatusForbidden:
		return "AccessDeniedException"
	case e.status == http.StatusServiceUnavailable:
		return "ServiceUnavailableException"
	case e.status >= 500:
		return "InternalServerException"
	}
	return "ValidationException"
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
