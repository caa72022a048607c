package ratelimit

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// The providers' own SDKs, with their default retries, read a spent budget
// as each provider's quota error and do not retry it: OpenAI's as a
// RateLimitError of code insufficient_quota, for a day budget and a month
// budget; Anthropic's as its EnforcedSpendLimitReachedError, a
// RateLimitError; Google's as an ApiError 429 whose body is
// RESOURCE_EXHAUSTED with a QuotaFailure naming the scope and a RetryInfo.
// Each sent one request, whose answer carried the exact wait until the
// budget renews and, as that is hours off, x-should-retry: false. A model
// without a price is each SDK's 400, not retried either. The upstream sees
// only the first request of each key, which the budget fits.
//
// Not tested here: an SDK's retry of a budget whose renewal is less than a
// minute off (no x-should-retry then). The gateway's store reads this
// machine's clock, and every time zone's midnight falls on a quarter hour
// of UTC, so no test can put a real Caddy a minute before a renewal
// without waiting for one.
func TestEachProvidersSDKReadsASpentBudgetAsItsQuotaErrorAndRetriesNeitherItNorAnUnpricedModel(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFakeUpstream(t, answerAsEachAPI)
		now := time.Now()
		zone, loc := zoneFarFromMidnight(t, now)
		y, m, d := now.In(loc).Date()
		renews := map[string]time.Time{"day": time.Date(y, m, d+1, 0, 0, 0, 0, loc), "month": time.Date(y, m+1, 1, 0, 0, 0, 0, loc)}
		gw := startGateway(t, up.URL, budgetSDKRoutes(store, zone))

		// run runs script with a new key, and checks what every SDK shows
		// alike: the first request of each of budgets passed, the next was
		// refused by the budget, in one response with the exact wait, and
		// the unpriced model in one 400, neither reaching the upstream.
		run := func(t *testing.T, script string, budgets ...string) sdkBudgetReport {
			t.Helper()
			before, hits := scrape(t), up.hits.Load()
			var report sdkBudgetReport
			runSDK(t, script, gw.url, redistest.UniqueID(t), &report)
			after := scrape(t)
			if got := up.hits.Load() - hits; got != int64(len(budgets)) {
				t.Errorf("the upstream saw %d requests, want %d: the first of each budget's key only", got, len(budgets))
			}
			for _, p := range budgets {
				r := report.of(p)
				metric := fmt.Sprintf(`caddy_rolter_ratelimit_refusals_total{kind="budget",scope="sdk_budget_%s",shadow="false",window="%s"}`, p, p)
				if got := after[metric] - before[metric]; got != 1 {
					t.Errorf("%s: the gateway counted %v refusals by the %s budget, want 1", script, got, p)
				}
				if !r.Answered || !r.Refused {
					t.Fatalf("%s, %s budget: %+v, want the first request answered and the second refused", script, p, r)
				}
				r.checkOneResponse(t, script+", "+p+" budget", 429)
				// The second request may cost more than the budget has left.
				if !strings.Contains(r.Message, "Not enough budget left for sdk_budget_"+p+": this request may cost up to $") {
					t.Errorf("%s, %s budget: the SDK's message %q is not the budget's refusal", script, p, r.Message)
				}
				res, renewal := r.Responses[0], renews[p]
				ms, err := strconv.ParseInt(res.RetryAfterMs, 10, 64)
				if earliest, latest := renewal.UnixMilli()-r.End, renewal.UnixMilli()-r.Start; err != nil || ms < earliest || ms > latest {
					t.Errorf("%s, %s budget: retry-after-ms %q, want the wait until %v, %d to %d", script, p, res.RetryAfterMs, renewal, earliest, latest)
				}
				if want := strconv.FormatInt((ms+999)/1000, 10); res.RetryAfter != want {
					t.Errorf("%s, %s budget: Retry-After %q, want %s", script, p, res.RetryAfter, want)
				}
				if res.ShouldRetry != "false" {
					t.Errorf("%s, %s budget: x-should-retry %q, want false: the renewal is hours off", script, p, res.ShouldRetry)
				}
			}
			u := report.Unpriced
			if !u.Refused {
				t.Fatalf("%s, unpriced model: %+v, want it refused", script, u)
			}
			u.checkOneResponse(t, script+", unpriced model", 400)
			if !strings.Contains(u.Message, "no price for the model") {
				t.Errorf("%s, unpriced model: the SDK's message %q does not say the model has no price", script, u.Message)
			}
			return report
		}

		t.Run("openai", func(t *testing.T) {
			report := run(t, "openai-budget.mjs", "day", "month")
			for p, r := range map[string]sdkRefusal{"day": report.Day, "month": report.Month} {
				if r.Name != "RateLimitError" || !r.RateLimitError || r.Code != "insufficient_quota" || r.Type != "insufficient_quota" || r.ErrorCode != "insufficient_quota" {
					t.Errorf("%s budget: the SDK raised %s (RateLimitError %v) of code %q, type %q, error.code %q; want a RateLimitError of insufficient_quota",
						p, r.Name, r.RateLimitError, r.Code, r.Type, r.ErrorCode)
				}
			}
			if u := report.Unpriced; !u.BadRequestError || u.Code != "model_not_priced" {
				t.Errorf("unpriced model: the SDK raised %s (BadRequestError %v) of code %q, want a BadRequestError of model_not_priced", u.Name, u.BadRequestError, u.Code)
			}
		})

		t.Run("anthropic", func(t *testing.T) {
			report := run(t, "anthropic-budget.mjs", "day")
			if r := report.Day; r.Name != "EnforcedSpendLimitReachedError" || !r.EnforcedSpendLimitReachedError || !r.RateLimitError ||
				r.ErrorCode != "enforced_spend_limit_reached" || r.Type != "rate_limit_error" {
				t.Errorf("the SDK raised %s (EnforcedSpendLimitReachedError %v, RateLimitError %v) of errorCode %q, type %q; want EnforcedSpendLimitReachedError of enforced_spend_limit_reached",
					r.Name, r.EnforcedSpendLimitReachedError, r.RateLimitError, r.ErrorCode, r.Type)
			}
			if u := report.Unpriced; !u.BadRequestError || u.Type != "invalid_request_error" {
				t.Errorf("unpriced model: the SDK raised %s (BadRequestError %v) of type %q, want a BadRequestError of invalid_request_error", u.Name, u.BadRequestError, u.Type)
			}
		})

		t.Run("gemini", func(t *testing.T) {
			report := run(t, "gemini-budget.mjs", "day")
			r, e := report.Day, report.Day.Body.Error
			if r.Name != "ApiError" || !r.APIError || e.Code != 429 || e.Status != "RESOURCE_EXHAUSTED" {
				t.Errorf("the SDK raised %s (ApiError %v) of code %d, status %q; want an ApiError 429 RESOURCE_EXHAUSTED", r.Name, r.APIError, e.Code, e.Status)
			}
			quota, retry := e.detail("QuotaFailure"), e.detail("RetryInfo")
			if quota == nil || len(quota.Violations) != 1 || quota.Violations[0].Subject != "sdk_budget_day" || !strings.HasPrefix(quota.Violations[0].Description, "Not enough budget left for sdk_budget_day") {
				t.Errorf("the error's details %+v, want a QuotaFailure whose violation names the scope sdk_budget_day and says what is left", e.Details)
			}
			if ms, _ := strconv.ParseInt(r.Responses[0].RetryAfterMs, 10, 64); retry == nil || retry.RetryDelay != fmt.Sprintf("%d.%03ds", ms/1000, ms%1000) {
				t.Errorf("the error's details %+v, want a RetryInfo of the retry-after-ms %s", e.Details, r.Responses[0].RetryAfterMs)
			}
			if u := report.Unpriced; !u.APIError || u.Body.Error.Code != 400 || u.Body.Error.detail("QuotaFailure") != nil {
				t.Errorf("unpriced model: the SDK raised %s (ApiError %v) of body %+v, want an ApiError 400 without a QuotaFailure", u.Name, u.APIError, u.Body)
			}
		})
	})
}

// budgetSDKRoutes is the test site of the budget scripts: on store, keys
// whose bearer token starts with sk-month- under a month budget, any other
// under a day budget, each of $0.0055 per key in zone. A request of the
// scripts reserves its largest cost: 5 output tokens at $1000 per million,
// $0.005, and its input's estimate (a few tokens) at $1 per million, which
// the budget fits once. The stand-in upstream reports 3 input and 1 output
// tokens, $0.001003 spent, beside which, or beside the first reservation
// until it is settled, a second request does not fit: it is refused by the
// budget, not as too large.
func budgetSDKRoutes(store, zone string) string {
	var b strings.Builder
	b.WriteString("\t@month header Authorization \"Bearer sk-month-*\"\n\t@day not header Authorization \"Bearer sk-month-*\"\n")
	for _, p := range []string{"month", "day"} {
		fmt.Fprintf(&b, `	rolter_ratelimit @%[1]s {
		%[2]s
		scope sdk_budget_%[1]s {http.rolter_ratelimit.api_key}
		limit sdk_budget_%[1]s * budget_%[1]s 0.0055
		budget_timezone %[3]s
		price gpt-4o-mini input 1 output 1000
		price claude-sonnet-4-5 input 1 output 1000
		price gemini-2.5-flash input 1 output 1000
	}
`, p, store, zone)
	}
	b.WriteString("\treverse_proxy {upstream}\n")
	return b.String()
}

// zoneFarFromMidnight is a time zone whose next midnight, when a day or a
// month budget spent in it renews, is at least an hour after now: UTC, or
// in the last hour of a UTC day, UTC+12 (Etc/GMT-12: POSIX inverts the
// sign). A test that takes less than an hour then sees the renewal hours
// off, further than an SDK waits.
func zoneFarFromMidnight(t *testing.T, now time.Time) (string, *time.Location) {
	t.Helper()
	for _, name := range []string{"UTC", "Etc/GMT-12"} {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		y, m, d := now.In(loc).Date()
		if time.Date(y, m, d+1, 0, 0, 0, 0, loc).Sub(now) >= time.Hour {
			return name, loc
		}
	}
	panic("unreachable: the midnights of UTC and UTC+12 are 12 hours apart")
}

// sdkBudgetReport is what a budget script of testdata/sdk prints: its
// refusals by a day budget, by a month budget (OpenAI's only), and of a
// model without a price.
type sdkBudgetReport struct {
	Day, Month, Unpriced sdkRefusal
}

func (r sdkBudgetReport) of(period string) sdkRefusal {
	if period == "month" {
		return r.Month
	}
	return r.Day
}

// sdkRefusal is the report of one call the gateway was to refuse
// (refusals.mjs): whether the request before it passed, what the SDK
// raised, and every response its fetch got for the call.
type sdkRefusal struct {
	Answered bool // the request before, which the budget fits (not for an unpriced model)
	Refused  bool
	Aborted  bool   // the script's bound ended the call: the SDK was waiting to retry
	Name     string // the class of what the SDK raised
	// Whether it is an instance of each of these classes of the SDK.
	RateLimitError, EnforcedSpendLimitReachedError, BadRequestError, APIError bool
	Status                                                                    int
	Code, Type, ErrorCode, Message                                            string
	Body                                                                      googleErrorBody // Google's: the body its ApiError's message carries
	Start, End                                                                int64           // unix milliseconds before and after the call
	Responses                                                                 []sdkResponse
}

// sdkResponse is a response an SDK's fetch got (refusals.mjs's
// recordingFetch).
type sdkResponse struct {
	Status                                int
	RetryAfter, RetryAfterMs, ShouldRetry string
	At                                    int64 // unix milliseconds
}

// checkOneResponse checks that the SDK raised an error of status after one
// response of that status: it did not retry.
func (r sdkRefusal) checkOneResponse(t *testing.T, what string, status int) {
	t.Helper()
	if r.Aborted {
		t.Fatalf("%s: after the responses %+v the SDK was still waiting to retry when the script's bound of 20 s ended the call", what, r.Responses)
	}
	if len(r.Responses) != 1 || r.Responses[0].Status != status || r.Status != status {
		t.Fatalf("%s: the SDK raised %s of status %d after the responses %+v; want one response of %d, not retried", what, r.Name, r.Status, r.Responses, status)
	}
}

// googleErrorBody is Google's error shape, with the details the gateway
// gives.
type googleErrorBody struct {
	Error googleError
}

type googleError struct {
	Code    int
	Message string
	Status  string
	Details []googleErrorDetail
}

type googleErrorDetail struct {
	Type       string `json:"@type"`
	Violations []struct{ Subject, Description string }
	RetryDelay string
}

// detail is the error's detail of the google.rpc type name, or nil.
func (e googleError) detail(name string) *googleErrorDetail {
	for i, d := range e.Details {
		if d.Type == "type.googleapis.com/google.rpc."+name {
			return &e.Details[i]
		}
	}
	return nil
}
