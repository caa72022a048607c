package ratelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/llmapi"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
	"github.com/rolter/caddy-ratelimit/internal/tokenest"
	"github.com/rolter/caddy-ratelimit/internal/usage"
	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// recordedListPrices are the providers' list prices, in US dollars per
// million tokens at the standard tier (input, output, cache read, cache
// write; a cache price left empty is the input price), of the models the
// recorded requests ask for. A model without a list price of its own is
// priced by its family's prefix: gpt-5.5 as gpt-5, gemini-flash-latest as
// gemini-2.5-flash, gemini-embedding-2 as gemini-embedding-001.
var recordedListPrices = []PriceConfig{
	{Model: "gpt-4o", Input: "2.50", Output: "10.00", CacheRead: "1.25"},
	{Model: "gpt-4o-mini*", Input: "0.15", Output: "0.60", CacheRead: "0.075"},
	{Model: "gpt-5*", Input: "1.25", Output: "10.00", CacheRead: "0.125"},
	{Model: "gpt-5-mini*", Input: "0.25", Output: "2.00", CacheRead: "0.025"},
	{Model: "gpt-5-nano*", Input: "0.05", Output: "0.40", CacheRead: "0.005"},
	{Model: "babbage-002", Input: "0.40", Output: "0.40"},
	{Model: "text-embedding-3-small", Input: "0.02", Output: "0"},
	{Model: "claude-sonnet-4*", Input: "3", Output: "15", CacheRead: "0.30", CacheWrite: "3.75"},
	{Model: "claude-haiku-4-5*", Input: "1", Output: "5", CacheRead: "0.10", CacheWrite: "1.25"},
	{Model: "claude-3-opus*", Input: "15", Output: "75", CacheRead: "1.50", CacheWrite: "18.75"},
	{Model: "gemini-2.5-flash*", Input: "0.30", Output: "2.50", CacheRead: "0.03"},
	{Model: "gemini-flash-latest", Input: "0.30", Output: "2.50", CacheRead: "0.03"},
	{Model: "gemini-2.0-flash*", Input: "0.10", Output: "0.40", CacheRead: "0.025"},
	{Model: "gemini-embedding*", Input: "0.15", Output: "0"},
}

// toolClass is what tools a request declares, which decides how far its
// input estimate can fall short: none; only tools the client runs
// (functions), for which the provider adds a tool-use system prompt; or a
// tool the provider runs (web search, URL fetch), whose fetched content it
// counts as input.
type toolClass int

const (
	noTools toolClass = iota
	clientTools
	serverTools
	numToolClasses
)

func (c toolClass) String() string {
	return [...]string{"no tools", "tool-use prompts", "server-side tools"}[c]
}

// toolClassOf classifies a request body by its tools: a server-side tool is
// an OpenAI tool of a type other than function or custom (web_search,
// file_search, …), an Anthropic tool with a type (web_search_20250305, …;
// a client tool has none, or "custom"), or a Gemini tool other than
// functionDeclarations (googleSearch, urlContext, codeExecution).
func toolClassOf(provider, body string) (toolClass, error) {
	var req struct {
		Tools []map[string]json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		return 0, err
	}
	class := noTools
	for _, tool := range req.Tools {
		class = max(class, clientTools)
		var typ string
		if raw, ok := tool["type"]; ok {
			if err := json.Unmarshal(raw, &typ); err != nil {
				return 0, err
			}
		}
		switch provider {
		case "gemini":
			for k := range tool {
				if k != "functionDeclarations" && k != "function_declarations" {
					class = serverTools
				}
			}
		default: // openai, anthropic
			if typ != "" && typ != "function" && typ != "custom" {
				class = serverTools
			}
		}
	}
	return class, nil
}

// TestBudgetOvershootAgainstRecordedUsage measures, on real requests and
// the usage their provider reported, what a budget's reservation misses:
// the reservation the handler makes at admission (Handler.reservation
// under a budget, at the recordedListPrices: the highest input price for
// each token of the input estimate, the highest output price for each
// token of the request's output cap, or of reserve_output when it names
// none) against the cost its settlement charges (costOf the usage
// reported, within its ceiling). A budget is overshot only by what the
// requests in flight cost beyond their reservations, until they settle;
// this is that, per request, in dollars and as a fraction of the
// reservation, by what tools the request declares; and, as the output
// reserved beyond what a response uses absorbs what its input estimate
// misses, what it would be had the request reserved exactly the output it
// used (a max_tokens no higher than it needs). It checks that the
// overshoot is never more than the input counted beyond the estimate at
// the highest input price plus the output beyond what was reserved at the
// highest output price, so that a response within both costs at most its
// reservation. Everything goes in its log (go test -v).
func TestBudgetOvershootAgainstRecordedUsage(t *testing.T) {
	entries, read := usagetest.Recorded(t)
	h := &Handler{Prices: recordedListPrices}
	inline, err := h.inlinePrices()
	if err != nil {
		t.Fatal(err)
	}
	if h.prices, err = pricing.NewTable(inline, nil); err != nil {
		t.Fatal(err)
	}
	utc, err := limiter.CalendarOf("UTC")
	if err != nil {
		t.Fatal(err)
	}
	team := limiter.CapsOfWindows(limiter.WindowCaps{})
	team.Budgets = limiter.BudgetCaps{Max: [limiter.NumBudgetPeriods]int64{limiter.BudgetMonth: pricing.MaxBudget}, Calendar: utc}
	chain := []limiter.Limit{limiter.NewLimit("", "team", "recorded", team)}

	type class struct {
		n, over int
		// The worst overshoot in dollars and as a fraction of the
		// reservation; and had each request reserved exactly the output
		// it used (a max_tokens no higher than it needs), what the input
		// estimate alone misses, with no output headroom to absorb it.
		usd, fraction, tightUSD, tightFraction recordedWorst
	}
	var classes [numToolClasses]class
	for _, e := range entries {
		if e.Request.Body == "" || e.IdentityFile != "" || strings.HasSuffix(e.File, ".jsonl") {
			continue // no request, a compressed twin, or a realtime session
		}
		body := []byte(e.Request.Body)
		call := llmapi.Of(e.APIPath)
		model, _ := tokenest.Model(call, body)
		price, refused := h.price(chain, model)
		if refused != nil {
			if call.API == llmapi.Unknown && model == "" {
				// As the handler answers it: refused (model_not_priced)
				// unless a "*" price covers it; nothing is overshot.
				t.Logf("%-52s an API whose model llmapi does not read: refused, %s", e.File, refused.code)
				continue
			}
			t.Errorf("%s: no price for %q", e.File, model)
			continue
		}
		tools, err := toolClassOf(e.Provider, e.Request.Body)
		if err != nil {
			t.Errorf("%s: the request's tools: %v", e.File, err)
			continue
		}
		est := estimate(call, requestBody{bytes: body, complete: true})
		reserve, over := h.reservation(est, chain, price)
		if over.limit >= 0 {
			t.Errorf("%s: too large for a budget of $%s", e.File, pricing.FormatUSD(pricing.MaxBudget))
			continue
		}
		m := usage.NewMeter(http.Header{"Content-Type": {e.ContentType}})
		m.Write(read(e.File))
		u, metered := m.Finish()
		if !metered {
			// A successful response without usage keeps its reservation
			// as its charge: nothing is overshot.
			t.Logf("%-52s no usage: charged its reservation", e.File)
			continue
		}
		u, _ = u.Within(usageCeiling(est))
		cost := costOf(price.Price, u)

		// The bound: the input and output beyond what was reserved, each at
		// the highest price a token of its side may have.
		used := pricedTokens(u)
		inputBeyond := max(used.Input+used.CacheRead+used.CacheWrite-reserve.Input, 0)
		outputBeyond := max(used.Output-reserve.Output, 0)
		bound := pricing.MaxCost(price.Price, inputBeyond, 0) + pricing.MaxCost(price.Price, 0, outputBeyond)
		overshoot := cost - reserve.Cost
		if overshoot > bound+1 { // two roundings up against one
			t.Errorf("%s: overshoot %d nano-dollars beyond its bound %d (input %d beyond the estimate, output %d beyond the %d reserved)",
				e.File, overshoot, bound, inputBeyond, outputBeyond, reserve.Output)
		}
		if inputBeyond == 0 && outputBeyond == 0 && overshoot > 0 {
			t.Errorf("%s: within its estimate and its reserved output, it costs %d nano-dollars over its reservation", e.File, overshoot)
		}
		tightReserve := pricing.MaxCost(price.Price, reserve.Input, used.Output)
		tight := cost - tightReserve

		t.Logf("%-52s %-17s %-19s in %5d (+%5d) out %5d (+%4d): reserved $%-11s cost $%-11s over by $%-11s %+.3f; reserving the output used: $%-11s %+.3f",
			e.File, tools, price.Name, reserve.Input, inputBeyond, reserve.Output, outputBeyond,
			pricing.FormatUSD(reserve.Cost), pricing.FormatUSD(cost), pricing.FormatUSD(max(overshoot, 0)), ratio(overshoot, reserve.Cost),
			pricing.FormatUSD(max(tight, 0)), ratio(tight, tightReserve))
		c := &classes[tools]
		c.n++
		if overshoot > 0 {
			c.over++
		}
		c.usd.note(float64(overshoot)/pricing.NanoPerUSD, e.File)
		c.fraction.note(ratio(overshoot, reserve.Cost), e.File)
		c.tightUSD.note(float64(tight)/pricing.NanoPerUSD, e.File)
		c.tightFraction.note(ratio(tight, tightReserve), e.File)
	}
	total := 0
	for tools, c := range classes {
		total += c.n
		if c.n == 0 {
			continue
		}
		t.Logf("%-17s %2d requests, %2d over their reservation%s; reserving exactly the output used%s",
			toolClass(tools), c.n, c.over, worstOf(c.usd, c.fraction), worstOf(c.tightUSD, c.tightFraction))
	}
	if total == 0 {
		t.Skip("no entry with a request body and a reported usage")
	}
}

// recordedWorst is the largest positive value noted, and where; 0 and ""
// when none was.
type recordedWorst struct {
	value float64
	file  string
}

func (w *recordedWorst) note(v float64, file string) {
	if v > w.value {
		w.value, w.file = v, file
	}
}

// ratio is over as a fraction of reserved.
func ratio(over, reserved int64) float64 { return float64(over) / float64(max(reserved, 1)) }

// worstOf says the worst overshoot in dollars and as a fraction, if any.
func worstOf(usd, fraction recordedWorst) string {
	if usd.file == "" {
		return ": none over"
	}
	return fmt.Sprintf(": at most $%.6f (%s), %.3f of the reservation (%s)", usd.value, usd.file, fraction.value, fraction.file)
}
