package provider

import (
	"net/http"
	"testing"
	"time"
)

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

var now = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

// OpenAI's (and Azure OpenAI's) headers report its requests and tokens
// quotas, each with the duration until it is full again as Go writes
// durations.
func TestOpenAIsHeadersReportEachQuotaWithItsReset(t *testing.T) {
	r := Of(200, header(
		"x-ratelimit-limit-requests", "10000", "x-ratelimit-remaining-requests", "9999", "x-ratelimit-reset-requests", "6ms",
		"x-ratelimit-limit-tokens", "2000000", "x-ratelimit-remaining-tokens", "1999000", "x-ratelimit-reset-tokens", "6m0s",
	), now)
	want := Report{Quotas: [NumKinds]Quota{
		Requests: {Limit: 10000, Remaining: 9999, Reset: 6 * time.Millisecond, Header: "x-ratelimit-limit-requests"},
		Tokens:   {Limit: 2000000, Remaining: 1999000, Reset: 6 * time.Minute, Header: "x-ratelimit-limit-tokens"},
	}}
	if r != want || !r.Reports() || r.Refused {
		t.Fatalf("report %+v, want %+v", r, want)
	}
	for text, want := range map[string]time.Duration{"1s": time.Second, "20ms": 20 * time.Millisecond, "2m59.56s": 2*time.Minute + 59560*time.Millisecond, "0s": 0, "48h": MaxWait} {
		r := Of(200, header("x-ratelimit-limit-tokens", "10", "x-ratelimit-remaining-tokens", "5", "x-ratelimit-reset-tokens", text), now)
		if got := r.Quotas[Tokens].Reset; got != want {
			t.Errorf("reset %q read as %v, want %v", text, got, want)
		}
	}
}

// Anthropic's headers report four quotas, each full again at an RFC 3339
// moment of the provider's clock, read against the answer's Date.
func TestAnthropicsHeadersReportFourQuotasFullAgainAtTheirMoments(t *testing.T) {
	h := header("Date", "Sun, 06 Dec 2026 11:59:58 GMT")
	for _, k := range []string{"requests", "tokens", "input-tokens", "output-tokens"} {
		h.Set("anthropic-ratelimit-"+k+"-limit", "1000")
		h.Set("anthropic-ratelimit-"+k+"-remaining", "400")
		h.Set("anthropic-ratelimit-"+k+"-reset", "2026-12-06T12:00:28Z")
	}
	r := Of(200, h, now)
	for k := range NumKinds {
		q := r.Quotas[k]
		if q.Limit != 1000 || q.Remaining != 400 || q.Reset != 30*time.Second {
			t.Errorf("%s: %+v, want 1000, 400 remaining, full again in 30 s from the answer's Date", k, q)
		}
	}
	h.Del("Date")
	if got := Of(200, h, now).Quotas[Tokens].Reset; got != 28*time.Second {
		t.Errorf("without a Date, reset in %v, want 28 s from its arrival", got)
	}
}

// A quota is reported only whole: a missing header, or one that does not
// parse, leaves it out, and nothing is made up for it.
func TestAQuotaIsReportedOnlyWithItsThreeHeadersValid(t *testing.T) {
	for name, h := range map[string]http.Header{
		"no reset":           header("x-ratelimit-limit-tokens", "10", "x-ratelimit-remaining-tokens", "5"),
		"no limit":           header("x-ratelimit-remaining-tokens", "5", "x-ratelimit-reset-tokens", "1s"),
		"no remaining":       header("x-ratelimit-limit-tokens", "10", "x-ratelimit-reset-tokens", "1s"),
		"a limit of 0":       header("x-ratelimit-limit-tokens", "0", "x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "1s"),
		"negative remaining": header("x-ratelimit-limit-tokens", "10", "x-ratelimit-remaining-tokens", "-1", "x-ratelimit-reset-tokens", "1s"),
		"a reset in words":   header("x-ratelimit-limit-tokens", "10", "x-ratelimit-remaining-tokens", "5", "x-ratelimit-reset-tokens", "soon"),
		"a negative reset":   header("x-ratelimit-limit-tokens", "10", "x-ratelimit-remaining-tokens", "5", "x-ratelimit-reset-tokens", "-1s"),
		"a decimal limit":    header("x-ratelimit-limit-tokens", "10.5", "x-ratelimit-remaining-tokens", "5", "x-ratelimit-reset-tokens", "1s"),
		"a reset not RFC 3339": header("anthropic-ratelimit-tokens-limit", "10", "anthropic-ratelimit-tokens-remaining", "5",
			"anthropic-ratelimit-tokens-reset", "Sun, 06 Dec 2026 12:00:28 GMT"),
	} {
		if r := Of(200, h, now); r.Reports() {
			t.Errorf("%s: reported %+v", name, r)
		}
	}
	r := Of(200, header("x-ratelimit-limit-tokens", "10", "x-ratelimit-remaining-tokens", "50", "x-ratelimit-reset-tokens", "1s"), now)
	if q := r.Quotas[Tokens]; q.Remaining != 10 {
		t.Errorf("more remaining than the limit: %+v, want what remains capped at the limit", q)
	}
}

// A provider's refusal keeps requests from it for the wait its headers
// give, read as the OpenAI SDK reads it: retry-after-ms first, then
// retry-after in seconds or as an HTTP date; without one, DefaultWait.
// Anthropic's 529 waits DefaultWait.
func TestARefusalWaitsWhatItsHeadersSayAsTheSDKsRead(t *testing.T) {
	for _, c := range []struct {
		name   string
		status int
		h      http.Header
		wait   time.Duration
		header string
	}{
		{"retry-after-ms", 429, header("retry-after-ms", "1234.5", "retry-after", "9"), 1234500 * time.Microsecond, "retry-after-ms"},
		{"retry-after seconds", 429, header("retry-after", "2"), 2 * time.Second, "retry-after"},
		{"retry-after a decimal", 429, header("retry-after", "0.25"), 250 * time.Millisecond, "retry-after"},
		{"retry-after a date", 429, header("retry-after", "Sun, 06 Dec 2026 12:00:07 GMT"), 7 * time.Second, "retry-after"},
		{"retry-after a past date", 429, header("retry-after", "Sun, 06 Dec 2026 11:00:00 GMT"), 0, "retry-after"},
		{"retry-after-ms not a number", 429, header("retry-after-ms", "soon", "retry-after", "3"), 3 * time.Second, "retry-after"},
		{"no wait", 429, header(), DefaultWait, ""},
		{"a wait in words", 429, header("retry-after", "later"), DefaultWait, ""},
		{"a wait of a week", 429, header("retry-after", "604800"), MaxWait, "retry-after"},
		{"a negative wait", 429, header("retry-after-ms", "-5"), DefaultWait, ""},
		{"not a number at all", 429, header("retry-after-ms", "NaN"), DefaultWait, ""},
		{"Anthropic overloaded", StatusOverloaded, header("retry-after", "30"), DefaultWait, ""},
	} {
		r := Of(c.status, c.h, now)
		if !r.Refused || r.Wait != c.wait || r.WaitHeader != c.header || !r.Reports() {
			t.Errorf("%s: refused %v, wait %v from %q, want %v from %q", c.name, r.Refused, r.Wait, r.WaitHeader, c.wait, c.header)
		}
	}
	for _, status := range []int{200, 400, 500, 503} {
		if r := Of(status, header("retry-after", "5"), now); r.Refused || r.Reports() {
			t.Errorf("status %d: refused %v", status, r.Refused)
		}
	}
}

// A Gemini or Vertex AI refusal gives its wait in its body's RetryInfo,
// alone or wrapped in an array.
func TestGeminisRetryInfoGivesItsWait(t *testing.T) {
	body := `{"error":{"code":429,"message":"You exceeded your current quota","status":"RESOURCE_EXHAUSTED","details":[
		{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"m","quotaValue":"250"}]},
		{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"22.5s"}]}}`
	for name, b := range map[string]string{"alone": body, "in an array": "[" + body + "]"} {
		if wait, ok := WaitInBody([]byte(b)); !ok || wait != 22500*time.Millisecond {
			t.Errorf("%s: %v %v, want 22.5 s", name, wait, ok)
		}
	}
	for name, b := range map[string]string{
		"no RetryInfo":     `{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[]}}`,
		"a delay in words": `{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"soon"}]}}`,
		"no unit":          `{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"22"}]}}`,
		"not JSON":         `Too Many Requests`,
		"an empty array":   `[]`,
	} {
		if wait, ok := WaitInBody([]byte(b)); ok {
			t.Errorf("%s: a wait of %v", name, wait)
		}
	}
}

// Whatever an answer's headers hold, reading them never panics, and what
// is reported stays within its bounds.
func FuzzOf(f *testing.F) {
	f.Add(429, "6m0s", "2026-12-06T12:00:28Z", "1.5", "Sun, 06 Dec 2026 12:00:07 GMT", "10", "5")
	f.Fuzz(func(t *testing.T, status int, reset, moment, ms, after, limit, remaining string) {
		r := Of(status, header("x-ratelimit-limit-tokens", limit, "x-ratelimit-remaining-tokens", remaining, "x-ratelimit-reset-tokens", reset,
			"anthropic-ratelimit-requests-limit", limit, "anthropic-ratelimit-requests-remaining", remaining, "anthropic-ratelimit-requests-reset", moment,
			"retry-after-ms", ms, "retry-after", after), now)
		for _, q := range r.Quotas {
			if q.Limit < 0 || q.Remaining < 0 || q.Remaining > q.Limit || q.Reset < 0 || q.Reset > MaxWait {
				t.Fatalf("quota out of bounds: %+v", q)
			}
		}
		if r.Wait < 0 || r.Wait > MaxWait {
			t.Fatalf("wait %v", r.Wait)
		}
		WaitInBody([]byte(ms + after))
	})
}
