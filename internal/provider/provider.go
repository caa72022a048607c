// Package provider reads what an LLM provider's answer says of its own
// quota: the rate-limit headers of OpenAI (and Azure OpenAI) and of
// Anthropic, which report each quota's limit, what remains of it and when
// it is full again, and a refusal's wait (429 with retry-after-ms,
// retry-after or Gemini's RetryInfo; Anthropic's 529). It reads only what
// the provider sent: a quota missing one of its three headers, or with one
// that does not parse, is not reported.
package provider

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Kind is what a provider's quota counts.
type Kind uint8

const (
	Requests Kind = iota
	Tokens
	InputTokens
	OutputTokens
	NumKinds
)

// String is the kind's name in the live view and the logs.
func (k Kind) String() string {
	return [...]string{"requests", "tokens", "input_tokens", "output_tokens"}[k]
}

// Quota is one of a provider's quotas as an answer reports it: its limit,
// what remained of it when the provider answered, and how long from then
// until it is full again (OpenAI and Anthropic refill their quotas
// continuously). A zero Limit is a quota the answer did not report.
type Quota struct {
	Limit, Remaining int64
	Reset            time.Duration
	// Header is the header the limit came in, for the live view.
	Header string
}

// Report is what one answer says of the provider's quotas for the key and
// model its request used.
type Report struct {
	Quotas [NumKinds]Quota
	// Refused: the provider refused the request for its quota (a 429, or
	// Anthropic's 529, overloaded), and no request should reach it for
	// Wait.
	Refused bool
	Wait    time.Duration
	// WaitHeader is where the wait came from: a header's name,
	// "RetryInfo", or "" for DefaultWait.
	WaitHeader string
}

// Reports reports whether r says anything of the provider's quotas.
func (r Report) Reports() bool {
	if r.Refused {
		return true
	}
	for _, q := range r.Quotas {
		if q.Limit > 0 {
			return true
		}
	}
	return false
}

// DefaultWait is how long a refusal that gives no wait of its own, and
// Anthropic's 529, keep requests from the provider.
const DefaultWait = time.Second

// MaxWait bounds every wait and reset read: a provider's longest window is
// a day.
const MaxWait = 24 * time.Hour

// StatusOverloaded is Anthropic's status for an API overloaded for everyone.
const StatusOverloaded = 529

// Header is what Of reads of an answer's headers: an http.Header, or a view
// of one. The names it asks for are canonical.
type Header interface{ Get(name string) string }

// Of reads the report of an answer's status and headers, which arrived at
// now: Anthropic's resets are moments, read against the answer's Date when
// it has one (the provider's clock, as its resets are), else against now.
// A refusal's wait from a body (Gemini's RetryInfo) is WaitInBody's. A
// header absent is not parsed: an answer without a report costs a few map
// lookups.
func Of(status int, h Header, now time.Time) Report {
	var r Report
	readOpenAI(&r, h)
	readAnthropic(&r, h, now)
	if status == http.StatusTooManyRequests || status == StatusOverloaded {
		r.Refused, r.Wait = true, DefaultWait
		if wait, header, ok := retryAfter(h, now); ok && status == http.StatusTooManyRequests {
			r.Wait, r.WaitHeader = wait, header
		}
	}
	return r
}

// quotaHeaders are the canonical names of one quota's headers, and its
// limit's as the live view names it.
type quotaHeaders struct {
	kind                    Kind
	limit, remaining, reset string
	name                    string
}

// headersOf are the headers of kinds' quotas, named by format, whose %k is
// the kind ("Input-Tokens") and %f the field ("Limit").
func headersOf(format string, kinds ...Kind) []quotaHeaders {
	names := map[Kind]string{Requests: "Requests", Tokens: "Tokens", InputTokens: "Input-Tokens", OutputTokens: "Output-Tokens"}
	out := make([]quotaHeaders, 0, len(kinds))
	for _, k := range kinds {
		h := func(field string) string {
			return http.CanonicalHeaderKey(strings.NewReplacer("%k", names[k], "%f", field).Replace(format))
		}
		out = append(out, quotaHeaders{kind: k, limit: h("Limit"), remaining: h("Remaining"), reset: h("Reset"), name: strings.ToLower(h("Limit"))})
	}
	return out
}

var (
	openAIHeaders    = headersOf("X-Ratelimit-%f-%k", Requests, Tokens)
	anthropicHeaders = headersOf("Anthropic-Ratelimit-%k-%f", Requests, Tokens, InputTokens, OutputTokens)
)

// readOpenAI reads x-ratelimit-{limit,remaining,reset}-{requests,tokens}:
// integers, and a reset as Go writes a duration ("6m0s", "1s", "20ms").
func readOpenAI(r *Report, h Header) {
	for _, q := range openAIHeaders {
		limit, remaining, ok := counts(h.Get(q.limit), h.Get(q.remaining))
		if !ok {
			continue
		}
		if reset, err := time.ParseDuration(h.Get(q.reset)); err == nil && reset >= 0 {
			r.Quotas[q.kind] = Quota{Limit: limit, Remaining: remaining, Reset: min(reset, MaxWait), Header: q.name}
		}
	}
}

// readAnthropic reads anthropic-ratelimit-{requests,tokens,input-tokens,
// output-tokens}-{limit,remaining,reset}: integers, and a reset as an RFC
// 3339 moment. Its tokens quota, where it sends one, is the most
// restrictive of its token quotas now.
func readAnthropic(r *Report, h Header, now time.Time) {
	dated := false
	for _, q := range anthropicHeaders {
		limit, remaining, ok := counts(h.Get(q.limit), h.Get(q.remaining))
		if !ok {
			continue
		}
		if !dated {
			if date, err := http.ParseTime(h.Get("Date")); err == nil {
				now = date
			}
			dated = true
		}
		if at, err := time.Parse(time.RFC3339, h.Get(q.reset)); err == nil {
			r.Quotas[q.kind] = Quota{Limit: limit, Remaining: remaining, Reset: min(max(at.Sub(now), 0), MaxWait), Header: q.name}
		}
	}
}

// counts reads a quota's limit and what remains of it: whole numbers, the
// limit above 0; what remains is at most the limit. An absent limit is not
// parsed.
func counts(limitText, remainingText string) (limit, remaining int64, ok bool) {
	if limitText == "" {
		return 0, 0, false
	}
	limit, err := strconv.ParseInt(limitText, 10, 64)
	if err != nil || limit <= 0 {
		return 0, 0, false
	}
	remaining, err = strconv.ParseInt(remainingText, 10, 64)
	if err != nil || remaining < 0 {
		return 0, 0, false
	}
	return limit, min(remaining, limit), true
}

// retryAfter is a refusal's wait as the providers' SDKs read it (the
// OpenAI SDK's retryRequest): retry-after-ms, milliseconds, a decimal;
// else retry-after, seconds, a decimal, or an HTTP date.
func retryAfter(h Header, now time.Time) (time.Duration, string, bool) {
	if ms, err := strconv.ParseFloat(h.Get("Retry-After-Ms"), 64); err == nil && ms >= 0 && !math.IsInf(ms, 0) {
		return bounded(ms * float64(time.Millisecond)), "retry-after-ms", true
	}
	text := h.Get("Retry-After")
	if seconds, err := strconv.ParseFloat(text, 64); err == nil && seconds >= 0 && !math.IsInf(seconds, 0) {
		return bounded(seconds * float64(time.Second)), "retry-after", true
	}
	if at, err := http.ParseTime(text); err == nil {
		return min(max(at.Sub(now), 0), MaxWait), "retry-after", true
	}
	return 0, "", false
}

// bounded is a wait of d nanoseconds, at most MaxWait.
func bounded(d float64) time.Duration {
	if d >= float64(MaxWait) {
		return MaxWait
	}
	return time.Duration(d)
}

// googleError is the part of a Gemini or Vertex AI error body that gives
// its wait; Vertex may wrap it in an array.
type googleError struct {
	Error struct {
		Status  string `json:"status"`
		Details []struct {
			Type       string `json:"@type"`
			RetryDelay string `json:"retryDelay"`
		} `json:"details"`
	} `json:"error"`
}

const retryInfoType = "type.googleapis.com/google.rpc.RetryInfo"

// WaitInBody is the wait that a Gemini or Vertex AI refusal's body gives
// in its RetryInfo ("retryDelay": "22s", a protobuf Duration's JSON).
func WaitInBody(body []byte) (time.Duration, bool) {
	var e googleError
	if err := json.Unmarshal(body, &e); err != nil {
		var wrapped []googleError
		if json.Unmarshal(body, &wrapped) != nil || len(wrapped) == 0 {
			return 0, false
		}
		e = wrapped[0]
	}
	for _, d := range e.Error.Details {
		if d.Type != retryInfoType {
			continue
		}
		seconds, err := strconv.ParseFloat(strings.TrimSuffix(d.RetryDelay, "s"), 64)
		if err == nil && strings.HasSuffix(d.RetryDelay, "s") && seconds >= 0 && !math.IsInf(seconds, 0) {
			return bounded(seconds * float64(time.Second)), true
		}
	}
	return 0, false
}
