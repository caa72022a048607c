package ratelimit

// Spend budgets (internal/limiter/budget.go), end to end: a real Caddy over real HTTP, on
// the in-process store and on a real redis-server, in front of upstreams
// that report the usage each test scripts. Every amount a test expects is
// computed by hand in the test, in nano-dollars (1e-9 USD), from the prices
// it configures and the usage its upstream reports: $2.50 per million
// tokens, or 2.5e-06 per token in a price file, is 2500 nano-dollars a
// token.
//
// The gateways are flightGatewayTo's (inflight_test.go): on Redis a client
// that waits up to 2 s and on_redis_error deny, so that a store failure
// under -race is a visible 503, never an admission unchecked that would
// look like a budget overshot.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/llmapi"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
	"github.com/rolter/caddy-ratelimit/internal/tokenest"
	"github.com/rolter/caddy-ratelimit/internal/usage"
)

// The budget tests' requests send budgetPrompt, 40 characters, which the
// gateway estimates at 10 input tokens (a token per 4 characters of text;
// the role and the model are not text the model reads), and cap their
// output at 100 tokens (max_tokens, or Gemini's maxOutputTokens). So a
// request's largest cost is 10 tokens at its price's highest input-side
// price plus 100 at its highest output-side price.
const (
	budgetPrompt    = "Price every token of this prompt exactly"
	budgetInput     = 10
	budgetMaxTokens = 100
)

// budgetCall is a request of one provider's API.
type budgetCall struct{ path, body string }

// openAICall is a chat completion of model; a stream asks for its usage.
func openAICall(model string, stream bool) budgetCall {
	more := ""
	if stream {
		more = `,"stream":true,"stream_options":{"include_usage":true}`
	}
	return budgetCall{"/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d%s}`,
		model, budgetPrompt, budgetMaxTokens, more)}
}

// anthropicCall is a Messages request of model.
func anthropicCall(model string, stream bool) budgetCall {
	return budgetCall{"/v1/messages", fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":%q}],"stream":%t}`,
		model, budgetMaxTokens, budgetPrompt, stream)}
}

// geminiCall is a generateContent request of model, which its path names;
// a stream is streamGenerateContent's server-sent events.
func geminiCall(model string, stream bool) budgetCall {
	method := "generateContent"
	if stream {
		method = "streamGenerateContent?alt=sse"
	}
	return budgetCall{"/v1beta/models/" + model + ":" + method, fmt.Sprintf(`{"contents":[{"role":"user","parts":[{"text":%q}]}],"generationConfig":{"maxOutputTokens":%d}}`,
		budgetPrompt, budgetMaxTokens)}
}

// checkEstimate fails unless the gateway reads the request as the hand
// computations count it: 10 input tokens and an output cap of 100.
func (c budgetCall) checkEstimate(t *testing.T) {
	t.Helper()
	if e := tokenest.Of(llmapi.Of(c.path), []byte(c.body)); e.Input != budgetInput || !e.Capped || e.Output != budgetMaxTokens {
		t.Fatalf("%s %s is estimated at %+v, not the %d input and %d output tokens the test counts", c.path, c.body, e, budgetInput, budgetMaxTokens)
	}
}

// send sends the request to gw with the header lines ("Name: value").
func (c budgetCall) send(t *testing.T, gw *gateway, headers ...string) (*http.Response, []byte) {
	t.Helper()
	c.checkEstimate(t)
	return gw.send(t, "POST", c.path, c.body, headers...)
}

// openAIUsage is an OpenAI chat completion that reports usage.
func openAIUsage(usage string) string {
	return `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":` + usage + `}`
}

// teamLines are the scope lines of the budget tests' limiters: a team,
// readable, so that the live view and the Redis keys name it as sent.
const teamLines = "scope team {http.request.header.X-Team} readable\n"

// teamPrefix is the prefix of the keys of team's limit.
func teamPrefix(team string) string { return "rolter:rl:team:" + team + ":" }

// usdText is nano-dollars as the exact decimal dollars a budget takes.
func usdText(nano int64) string {
	return fmt.Sprintf("%d.%09d", nano/pricing.NanoPerUSD, nano%pricing.NanoPerUSD)
}

// nanoUSD reads dollars as the live view writes them, exact decimals, in
// nano-dollars.
func nanoUSD(t *testing.T, dollars string) int64 {
	t.Helper()
	whole, frac, _ := strings.Cut(dollars, ".")
	w, err := strconv.ParseInt(whole, 10, 64)
	f, ferr := strconv.ParseInt((frac + "000000000")[:9], 10, 64)
	if err != nil || ferr != nil || len(frac) > 9 {
		t.Fatalf("%q is not an amount of dollars", dollars)
	}
	return w*pricing.NanoPerUSD + f
}

// teamLimit is the limit that applies to team in the live view of the
// Caddy whose admin endpoint is on port admin, with its budgets.
func teamLimit(t *testing.T, admin int, team string) UsageLimit {
	t.Helper()
	v, body := getLiveViewAt(t, admin, "scope=team&id="+team)
	if len(v.Limits) != 1 || v.Limits[0].BudgetDay == nil {
		t.Fatalf("live view of team %s: %s, want one limit with a day budget", team, body)
	}
	return v.Limits[0]
}

// waitSettled waits until team's day budget holds nothing reserved and
// spent nano-dollars spent, in the live view of the Caddy on admin: a
// response is settled after its client has it. So does its month budget,
// if it has one.
func waitSettled(t *testing.T, admin int, team string, spent int64) UsageLimit {
	t.Helper()
	settled := func(b *UsageBudget) bool { return b == nil || b.Reserved == "0.00" && nanoUSD(t, b.Spent) == spent }
	v := waitLiveViewAt(t, admin, "scope=team&id="+team, func(v UsageView) bool {
		return len(v.Limits) == 1 && v.Limits[0].BudgetDay != nil && settled(v.Limits[0].BudgetDay) && settled(v.Limits[0].BudgetMonth)
	})
	return v.Limits[0]
}

// checkBudgetKeys checks that the counters of team's budget b, of period
// (day or month), hold spent and reserved nano-dollars on the Redis at
// url: "rolter:rl:team:<team>:spent:<period>:<the period's start, unix
// seconds>" and its reserved twin. A key that does not exist holds 0.
func checkBudgetKeys(t *testing.T, url, team, period string, b *UsageBudget, spent, reserved int64) {
	t.Helper()
	start, err := time.Parse(time.RFC3339, b.Start)
	if err != nil {
		t.Fatalf("the live view's start %q: %v", b.Start, err)
	}
	c := redistest.TestClient(t, url)
	for _, k := range []struct {
		what string
		want int64
	}{{"spent", spent}, {"reserved", reserved}} {
		key := fmt.Sprintf("%s%s:%s:%d", teamPrefix(team), k.what, period, start.Unix())
		got, err := c.Get(context.Background(), key).Int64()
		if errors.Is(err, redis.Nil) {
			got, err = 0, nil
		}
		if err != nil || got != k.want {
			t.Errorf("Redis %s holds %d (%v), want %d", key, got, err, k.want)
		}
	}
}

// nextMidnight is when the day of loc that holds at ends.
func nextMidnight(at time.Time, loc *time.Location) time.Time {
	y, m, d := at.In(loc).Date()
	return time.Date(y, m, d+1, 0, 0, 0, 0, loc)
}

// storeClock reads the clock that the store of gateways on the Redis at
// url decides by, Redis's (admit.lua reads TIME), or for url "" the
// in-process store's, this machine's.
func storeClock(t *testing.T, url string) func() time.Time {
	if url == "" {
		return time.Now
	}
	c := redistest.TestClient(t, url)
	return func() time.Time {
		now, err := c.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now
	}
}

// budgetWaitProblem says what is wrong with the wait that h, the headers of
// a refusal by a budget that renews at renews, announces for a request sent
// at sent and answered at received, by the store's clock: Retry-After-Ms
// must be exactly the time from the store's reading of its clock, in
// between, to the renewal (within the millisecond that the readings round
// to); Retry-After, it in seconds, rounded up; and x-should-retry false
// when that is more than a minute away, as SDKs wait at most that long.
// "" when nothing is.
func budgetWaitProblem(h http.Header, renews, sent, received time.Time) string {
	ms, err := strconv.ParseInt(h.Get("Retry-After-Ms"), 10, 64)
	lo, hi := renews.Sub(received).Milliseconds()-1, renews.Sub(sent).Milliseconds()+1
	if err != nil || ms < lo || ms > hi {
		return fmt.Sprintf("Retry-After-Ms %q, want the %d to %d ms until the budget renews at %s", h.Get("Retry-After-Ms"), lo, hi, renews)
	}
	if ra := h.Get("Retry-After"); ra != strconv.FormatInt((ms+999)/1000, 10) {
		return fmt.Sprintf("Retry-After %q, want Retry-After-Ms %d in seconds, rounded up", ra, ms)
	}
	if want := map[bool]string{true: "false", false: ""}[ms > 60_000]; h.Get("X-Should-Retry") != want {
		return fmt.Sprintf("x-should-retry %q with a renewal %d ms away, want %q", h.Get("X-Should-Retry"), ms, want)
	}
	return ""
}

// The budget of the tests of forty concurrent requests is exactly ten of
// their largest costs. m-budget prices an input token at $1 per million
// (1000 n$), a cache read at 0.10 (100 n$), a cache write at 1.25 (1250
// n$), an output token at $4 (4000 n$); a request's input may turn out to
// be cache writes, so its 10 input tokens reserve 1250 n$ each, and its 100
// output tokens 4000 each. The flight upstream reports 3 prompt tokens and
// 4 completion tokens, no cache: 3 × 1000 + 4 × 4000.
const (
	fortyMaxCost  = budgetInput*1250 + budgetMaxTokens*4000 // 412_500 n$
	fortyRealCost = 3*1000 + 4*4000                         // 19_000 n$
)

var fortyLines = teamLines + fmt.Sprintf(`limit team * budget_day %s
price m-budget input 1 output 4 cache_read 0.10 cache_write 1.25`, usdText(10*fortyMaxCost))

// fortyAgainstTen races 40 requests of one team through the gateways at
// urls (the live view read on admin; redisURL the Redis they share, "" for
// the in-process store) against a day budget of exactly ten of their
// largest costs, and checks that exactly ten were admitted, holding
// exactly ten largest costs reserved, that the thirty others were refused
// as a spent budget is, and that once all ended the budget holds exactly
// the ten real costs spent, and nothing reserved. Then what the
// settlements gave back is budget again, at once: it fits nine largest
// costs, and of twelve more requests exactly nine are admitted.
func fortyAgainstTen(t *testing.T, urls []string, admin int, up *fakeUpstream, redisURL string) {
	t.Helper()
	team := redistest.UniqueID(t)
	call := openAICall("m-budget", false)
	call.checkEstimate(t)
	c := flightClient(t)
	clock := storeClock(t, redisURL)
	budget := int64(10 * fortyMaxCost)
	// race sends n requests at once, each held at the upstream until every
	// one has been answered or has reached it; it checks that admitted of
	// them reached it, holding that many largest costs reserved beside
	// spent, that the others were refused as a spent budget is, and that
	// once all have ended the budget holds spent and their real costs.
	race := func(n, admitted int, spent int64) int64 {
		t.Helper()
		sent := clock()
		refused, finish := heldBurstOf(t, urls, up, n, func(url string) flightAnswer {
			return postTo(c, url, call.path, call.body, "X-Team: "+team, "X-Upstream: "+upstreamHeld)
		})
		received := clock()
		if open := up.open.Load(); open != int64(admitted) || len(refused) != n-admitted {
			t.Fatalf("of %d requests, %d reached the upstream and %d were answered, want %d and %d", n, open, len(refused), admitted, n-admitted)
		}
		for i, a := range refused {
			var e openAIError
			// Spent or reserved, or with less left than the request may
			// cost (as earlier requests settle), its message names the
			// team's budget.
			want := "$" + strings.TrimRight(usdText(budget), "0") + " per day"
			if a.err != nil || a.status != http.StatusTooManyRequests || json.Unmarshal([]byte(a.body), &e) != nil ||
				e.Error.Type != "insufficient_quota" || e.Error.Code != "insufficient_quota" ||
				!strings.Contains(e.Error.Message, " for team: ") || !strings.Contains(e.Error.Message, want) {
				t.Fatalf("refused request %d: %d %s %v, want 429 insufficient_quota naming the team's %q", i, a.status, a.body, a.err, want)
			}
			if p := budgetWaitProblem(a.header, nextMidnight(sent, time.UTC), sent, received); p != "" {
				t.Fatalf("refused request %d: %s", i, p)
			}
		}
		reserved := int64(admitted) * fortyMaxCost
		b := teamLimit(t, admin, team).BudgetDay
		if nanoUSD(t, b.Reserved) != reserved || nanoUSD(t, b.Spent) != spent || nanoUSD(t, b.Remaining) != budget-spent-reserved || b.Timezone != "UTC" {
			t.Fatalf("with %d requests in flight the day budget is %+v, want %d n$ reserved and %d spent, in UTC", admitted, *b, reserved, spent)
		}
		if redisURL != "" {
			checkBudgetKeys(t, redisURL, team, "day", b, spent, reserved)
		}
		if got := statuses(finish()); got[200] != admitted || got[429] != n-admitted || len(got) != 2 {
			t.Fatalf("statuses %v, want %d × 200 and %d × 429 (a 503 is a store failure)", got, admitted, n-admitted)
		}
		spent += int64(admitted) * fortyRealCost
		l := waitSettled(t, admin, team, spent)
		if redisURL != "" {
			checkBudgetKeys(t, redisURL, team, "day", l.BudgetDay, spent, 0)
		}
		return spent
	}
	spent := race(40, 10, 0)
	if fits := (budget - spent) / fortyMaxCost; fits != 9 {
		t.Fatalf("the budget left fits %d largest costs: the constants changed, not the budget", fits)
	}
	race(12, 9, spent)
	if peak := up.peak.Load(); peak != 10 {
		t.Fatalf("the upstream had %d requests open at once, want 10", peak)
	}
}

func TestFortyConcurrentRequestsAgainstABudgetOfTenLargestCostsAdmitExactlyTen(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := flightGatewayOn(t, up, store, fortyLines)
		fortyAgainstTen(t, []string{gw.url}, caddyAdmin(), up, strings.TrimPrefix(store, "redis "))
	})
}

func TestThreeGatewayProcessesOnRedisAdmitExactlyTenOfFortyRequestsUnderOneBudget(t *testing.T) {
	url := redistest.EnvURL(t)
	up := newUpstream(t)
	gws := startCaddyProcesses(t, 3, up, limited(flightStore("redis "+url), fortyLines+"\non_redis_error deny"))
	fortyAgainstTen(t, urlsOf(gws), gws[0].admin, up, url)
}

// Each response's real cost, from the usage it reported, replaces its
// reservation: the budget then holds, spent, exactly the sum of those
// costs, whether a cost is below the reservation or above it (the input
// was estimated low); an upstream error without usage gives its
// reservation back, and a success without usage keeps it as its cost.
func TestSettlementLeavesTheBudgetSpentAtExactlyTheSumOfTheCostsTheUpstreamReported(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := flightGatewayTo(t, up.URL, store, teamLines+`
			limit team * budget_day 1 budget_month 5
			price gpt-4o input 2.50 output 10 cache_read 1.25`)
		// gpt-4o: 2500 n$ an uncached input token, 1250 a cached one, and
		// 10_000 an output token; its reservation, 10 × 2500 + 100 × 10_000.
		const reservation = budgetInput*2500 + budgetMaxTokens*10_000
		team := redistest.UniqueID(t)
		spent := int64(0)
		for _, r := range []struct {
			what   string
			answer string
			status int
			cost   int64
		}{
			{"usage below the reservation", up.json(openAIUsage(`{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}`)),
				200, 10*2500 + 20*10_000},
			{"usage above the reservation, half of it cached, with reasoning", up.json(openAIUsage(`{"prompt_tokens":2048,"completion_tokens":100,"total_tokens":2148,"prompt_tokens_details":{"cached_tokens":1024},"completion_tokens_details":{"reasoning_tokens":60}}`)),
				200, (2048-1024)*2500 + 1024*1250 + 100*10_000},
			{"an upstream error without usage", up.script(http.StatusInternalServerError, "application/json", `{"error":{"message":"overloaded","type":"server_error"}}`),
				500, 0},
			{"a success without usage", up.json(`{"id":"chatcmpl-2","object":"chat.completion","choices":[]}`),
				200, reservation},
		} {
			res, body := openAICall("gpt-4o", false).send(t, gw, "X-Team: "+team, r.answer)
			if res.StatusCode != r.status {
				t.Fatalf("%s: %d %s, want %d", r.what, res.StatusCode, body, r.status)
			}
			spent += r.cost
			l := waitSettled(t, caddyAdmin(), team, spent)
			if store != "" {
				url := strings.TrimPrefix(store, "redis ")
				checkBudgetKeys(t, url, team, "day", l.BudgetDay, spent, 0)
				checkBudgetKeys(t, url, team, "month", l.BudgetMonth, spent, 0)
			}
		}
		if spent != 6_090_000 || up.hits.Load() != 4 {
			t.Fatalf("spent %d n$ over %d requests: the table changed, not the budget", spent, up.hits.Load())
		}
	})
}

// Each provider reports its prompt cache in its own way, and each response
// is charged exactly what its parts cost at the price file's prices
// (testdata/prices/litellm.json): OpenAI's prompt_tokens and Gemini's
// promptTokenCount include the cached tokens (prompt_tokens_details.
// cached_tokens, cachedContentTokenCount), which are charged at the cache
// read price and the rest at the input price; Anthropic's input_tokens
// leave out cache_creation_input_tokens and cache_read_input_tokens, each
// charged at its own price. Each in a JSON answer and in a stream.
func TestCachedInputAndCacheWritesArePricedAsEachProviderReportsThem(t *testing.T) {
	prices, err := filepath.Abs("testdata/prices/litellm.json")
	if err != nil {
		t.Fatal(err)
	}
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := flightGatewayTo(t, up.URL, store, teamLines+`
			limit team * budget_day 100 budget_month 1000
			prices `+prices)
		for _, c := range []struct {
			name   string
			call   budgetCall
			answer string
			ends   string // the end of the answer, which the client must get
			cost   int64
		}{{
			// gpt-4o: input 2.5e-06 (2500 n$), cache read 1.25e-06
			// (1250), output 1e-05 (10_000); the 28 reasoning tokens
			// are output, at its price. Each answer's output is within
			// the request's max_tokens 100, as a provider's is.
			name: "OpenAI", call: openAICall("gpt-4o", false),
			answer: up.json(openAIUsage(`{"prompt_tokens":2006,"completion_tokens":100,"total_tokens":2106,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":28,"audio_tokens":0}}`)),
			ends:   `"audio_tokens":0}}}`,
			cost:   (2006-1920)*2500 + 1920*1250 + 100*10_000, // 3_615_000
		}, {
			// gpt-4o-mini: input 1.5e-07 (150), cache read 7.5e-08
			// (75), output 6e-07 (600).
			name: "OpenAI stream", call: openAICall("gpt-4o-mini", true),
			answer: up.sse(
				`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"}}],"usage":null}`,
				`data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1234,"completion_tokens":77,"total_tokens":1311,"prompt_tokens_details":{"cached_tokens":1152}}}`,
				`data: [DONE]`),
			ends: "data: [DONE]\n\n",
			cost: (1234-1152)*150 + 1152*75 + 77*600, // 144_900
		}, {
			// claude-sonnet-4-5: input 3e-06 (3000), cache write
			// 3.75e-06 (3750), cache read 3e-07 (300), output 1.5e-05
			// (15_000).
			name: "Anthropic", call: anthropicCall("claude-sonnet-4-5", false),
			answer: up.json(`{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":21,"cache_creation_input_tokens":1800,"cache_read_input_tokens":2400,"output_tokens":100}}`),
			ends:   `"output_tokens":100}}`,
			cost:   21*3000 + 1800*3750 + 2400*300 + 100*15_000, // 9_033_000
		}, {
			// claude-haiku-4-5: input 1e-06 (1000), cache write
			// 1.25e-06 (1250), cache read 1e-07 (100), output 5e-06
			// (5000); message_delta's output_tokens is the final count.
			name: "Anthropic stream", call: anthropicCall("claude-haiku-4-5", true),
			answer: up.sse(
				"event: message_start\n"+`data: {"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[],"usage":{"input_tokens":12,"cache_creation_input_tokens":500,"cache_read_input_tokens":1800,"output_tokens":1}}}`,
				"event: content_block_delta\n"+`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
				"event: message_delta\n"+`data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":95}}`,
				"event: message_stop\n"+`data: {"type":"message_stop"}`),
			ends: `data: {"type":"message_stop"}` + "\n\n",
			cost: 12*1000 + 500*1250 + 1800*100 + 95*5000, // 1_292_000
		}, {
			// gemini-2.5-pro: input 1.25e-06 (1250), cache read
			// 3.125e-07 (312.5), output 1e-05 (10_000); the output is
			// the candidates and the thoughts. 98 × 1250 + 4003 × 312.5
			// + 100 × 10_000 is 2_373_437.5, rounded up once.
			name: "Gemini", call: geminiCall("gemini-2.5-pro", false),
			answer: up.json(`{"candidates":[{"content":{"parts":[{"text":"Hi"}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":4101,"candidatesTokenCount":70,"totalTokenCount":4201,"thoughtsTokenCount":30,"cachedContentTokenCount":4003},"modelVersion":"gemini-2.5-pro"}`),
			ends:   `"modelVersion":"gemini-2.5-pro"}`,
			cost:   2_373_438,
		}, {
			// gemini-2.5-flash: input 3e-07 (300), cache read 7.5e-08
			// (75), output 2.5e-06 (2500); each chunk's usageMetadata
			// is a snapshot, the last one the count.
			name: "Gemini stream", call: geminiCall("gemini-2.5-flash", true),
			answer: up.sse(
				`data: {"candidates":[{"content":{"parts":[{"text":"Hi"}],"role":"model"}}],"usageMetadata":{"promptTokenCount":3000,"candidatesTokenCount":1,"totalTokenCount":3001,"cachedContentTokenCount":2048}}`,
				`data: {"candidates":[{"content":{"parts":[{"text":" there"}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":3000,"candidatesTokenCount":100,"totalTokenCount":3100,"cachedContentTokenCount":2048}}`),
			ends: `"cachedContentTokenCount":2048}}` + "\n\n",
			cost: (3000-2048)*300 + 2048*75 + 100*2500, // 689_200
		}} {
			t.Run(c.name, func(t *testing.T) {
				team := redistest.UniqueID(t)
				res, body := c.call.send(t, gw, "X-Team: "+team, c.answer)
				if res.StatusCode != 200 || !strings.HasSuffix(string(body), c.ends) {
					t.Fatalf("%d %s, want 200 and the whole answer", res.StatusCode, body)
				}
				l := waitSettled(t, caddyAdmin(), team, c.cost)
				if store != "" {
					url := strings.TrimPrefix(store, "redis ")
					checkBudgetKeys(t, url, team, "day", l.BudgetDay, c.cost, 0)
					checkBudgetKeys(t, url, team, "month", l.BudgetMonth, c.cost, 0)
				}
			})
		}
	})
}

// commandsServed is what the Redis that p probes has served: each
// command's calls, from INFO commandstats, the probe's own INFO aside.
func commandsServed(t *testing.T, p *connProbe) string {
	t.Helper()
	info, err := p.c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var served []string
	for line := range strings.Lines(info) {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && strings.HasPrefix(name, "cmdstat_") && name != "cmdstat_info" {
			calls, _, _ := strings.Cut(stats, ",")
			served = append(served, name+" "+calls)
		}
	}
	return strings.Join(served, ", ")
}

// noPriceSite is a site whose limiter has a budget and an rpm and prices
// gpt-4o only, but, for requests with X-Star: on, has a "*" price too.
func noPriceSite(store string) string {
	limiter := func(matcher, star string) string {
		return fmt.Sprintf(`
	rolter_ratelimit %s {
		%s
		%s
		limit team * budget_day 10 rpm 1000
		price gpt-4o input 2.50 output 10
		%s
		on_redis_error deny
	}`, matcher, flightStore(store), teamLines, star)
	}
	return `
	@star header X-Star on
	@plain not header X-Star on` + limiter("@plain", "") + limiter("@star", "price * input 1 output 2") + `
	reverse_proxy {upstream}`
}

// A request under a budget whose model has no price is refused with 400
// before any store call: a Redis serves no command for it, and a Redis
// that is down is not even asked (on_redis_error deny would answer 503);
// the in-process store counts nothing of it, neither a request nor a
// reservation. Under a "*" price the same model is admitted, and charged
// at that price.
func TestAModelWithoutAPriceIsRefusedWith400BeforeAnyStoreCallAndAStarPriceAdmitsIt(t *testing.T) {
	check := func(t *testing.T, store string, storeCalls func(team string) string) {
		up := newUpstream(t)
		gw := startGatewayWith(t, up.URL, "", noPriceSite(store), 0)
		team := redistest.UniqueID(t)
		model := "mystery-" + redistest.UniqueID(t)
		const refusedNoPrice = `caddy_rolter_ratelimit_admissions_total{outcome="refused_no_price"}`
		before, outcomes := storeCalls(team), scrape(t)[refusedNoPrice]
		res, body := openAICall(model, false).send(t, gw, "X-Team: "+team)
		var e openAIError
		if res.StatusCode != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Error.Type != "invalid_request_error" ||
			e.Error.Code != "model_not_priced" || !strings.Contains(e.Error.Message, `"`+model+`"`) {
			t.Fatalf("an unpriced model: %d %s, want 400 invalid_request_error model_not_priced naming the model", res.StatusCode, body)
		}
		res, body = anthropicCall(model, false).send(t, gw, "X-Team: "+team)
		var a anthropicError
		if res.StatusCode != http.StatusBadRequest || json.Unmarshal(body, &a) != nil || a.Type != "error" || a.Error.Type != "invalid_request_error" ||
			!strings.Contains(a.Error.Message, `"`+model+`"`) {
			t.Fatalf("an unpriced model, asked in Anthropic's API: %d %s, want Anthropic's 400 invalid_request_error naming the model", res.StatusCode, body)
		}
		res, body = gw.send(t, "POST", "/v1/chat/completions", `{"messages":[]}`, "X-Team: "+team)
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "no price for a request that names no model") {
			t.Fatalf("a request naming no model: %d %s, want 400", res.StatusCode, body)
		}
		if after := storeCalls(team); after != before {
			t.Fatalf("the store was called for requests refused for their price:\nbefore %s\nafter  %s", before, after)
		}
		if got := scrape(t)[refusedNoPrice] - outcomes; got != 3 || up.hits.Load() != 0 {
			t.Fatalf("admissions_total{outcome=refused_no_price} rose by %v and the upstream saw %d requests, want 3 and 0", got, up.hits.Load())
		}

		// Under "*" ($1 and $2 per million: 1000 and 2000 n$ a token).
		res, body = openAICall(model, false).send(t, gw, "X-Team: "+team, "X-Star: on", up.json(openAIUsage(`{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}`)))
		if res.StatusCode != 200 {
			t.Fatalf("the same model under a * price: %d %s, want 200", res.StatusCode, body)
		}
		waitSettled(t, caddyAdmin(), team, 10*1000+20*2000)
		if storeCalls(team) == before {
			t.Fatal("the store saw nothing of the admitted request either: the probe sees nothing")
		}
	}
	t.Run("memory", func(t *testing.T) {
		check(t, "", func(team string) string {
			l := teamLimit(t, caddyAdmin(), team)
			return fmt.Sprintf("%v requests, $%s spent, $%s reserved", l.RPM.Estimate, l.BudgetDay.Spent, l.BudgetDay.Reserved)
		})
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.NewServer(t)
		probe := newConnProbe(t, srv)
		check(t, "redis "+srv.URL(), func(string) string { return commandsServed(t, probe) })
	})
	t.Run("redis down", func(t *testing.T) {
		redistest.EnvURL(t) // the Redis tests' switch, though no Redis is asked
		up := newUpstream(t)
		gw := startGatewayWith(t, up.URL, "", noPriceSite(fmt.Sprintf("redis redis://127.0.0.1:%d", freePort())), 0)
		team := "X-Team: " + redistest.UniqueID(t)
		if res, body := openAICall("mystery", false).send(t, gw, team); res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "model_not_priced") {
			t.Fatalf("an unpriced model, Redis down: %d %s, want 400 without asking the store", res.StatusCode, body)
		}
		if res, body := openAICall("gpt-4o", false).send(t, gw, team); res.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("a priced model, Redis down: %d %s, want 503: its store is asked", res.StatusCode, body)
		}
	})
}

// anthropicError is Anthropic's error body, with the error_code of a spent
// budget's.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
		Details struct {
			ErrorCode string `json:"error_code"`
		} `json:"details"`
	} `json:"error"`
}

// A request whose largest cost alone is over a budget is refused at once,
// as OpenAI refuses a request too large for a limit: 429 with
// x-should-retry false and no wait, and it reaches neither the upstream
// nor the budget: nothing is reserved or spent (on Redis no key of the
// team is even written). A largest cost of exactly the budget is not too
// large.
func TestARequestTooLargeForItsBudgetIsRefusedAndChargesNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		// big: $10 and $30 per million, so at most 10 × 10_000 + 100 ×
		// 30_000 = 3_100_000 n$ a request. Every team has a day budget
		// of a nano-dollar less; the team exact has exactly that.
		const largest = budgetInput*10_000 + budgetMaxTokens*30_000
		exact := redistest.UniqueID(t)
		gw := flightGatewayTo(t, up.URL, store, teamLines+fmt.Sprintf(`
			limit team %s budget_day %s
			limit team * budget_day %s
			price big input 10 output 30`, exact, usdText(largest), usdText(largest-1)))
		const refusals = `caddy_rolter_ratelimit_refusals_total{kind="too_large",scope="team",shadow="false",window="day"}`
		before := scrape(t)[refusals]
		team := redistest.UniqueID(t)
		call := openAICall("big", false)
		used := up.json(openAIUsage(`{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}`))
		res, body := call.send(t, gw, "X-Team: "+team, used)
		var e openAIError
		want := "Request too large for the budget of team per day: Budget $0.003099999, largest cost of this request $0.0031. "
		if res.StatusCode != http.StatusTooManyRequests || json.Unmarshal(body, &e) != nil || e.Error.Code != "rate_limit_exceeded" || !strings.HasPrefix(e.Error.Message, want) {
			t.Fatalf("%d %s, want 429 starting %q", res.StatusCode, body, want)
		}
		if res.Header.Get("X-Should-Retry") != "false" || res.Header.Get("Retry-After") != "" || res.Header.Get("Retry-After-Ms") != "" {
			t.Fatalf("x-should-retry %q, Retry-After %q: want false and no wait", res.Header.Get("X-Should-Retry"), res.Header.Get("Retry-After"))
		}
		if got := scrape(t)[refusals] - before; got != 1 || up.hits.Load() != 0 {
			t.Fatalf("refusals_total{kind=too_large} rose by %v and the upstream saw %d requests, want 1 and 0", got, up.hits.Load())
		}
		if store != "" {
			keys, err := redistest.TestClient(t, strings.TrimPrefix(store, "redis ")).Keys(context.Background(), teamPrefix(team)+"*").Result()
			if err != nil || len(keys) != 0 {
				t.Fatalf("Redis keys of the team refused as too large: %v %v, want none", keys, err)
			}
		}
		if b := teamLimit(t, caddyAdmin(), team).BudgetDay; b.Spent != "0.00" || b.Reserved != "0.00" || b.Remaining != "0.003099999" {
			t.Fatalf("the day budget after a request too large for it: %+v, want nothing spent or reserved", *b)
		}

		if res, body := call.send(t, gw, "X-Team: "+exact, used); res.StatusCode != 200 {
			t.Fatalf("a largest cost of exactly the budget: %d %s, want 200", res.StatusCode, body)
		}
		waitSettled(t, caddyAdmin(), exact, 10*10_000+20*30_000)
	})
}

// The spend and token counters move by exactly what each request
// reserved, was charged and was given back, under the name of the price
// entry that priced it as configured (a prefix's with its '*', "*"), never
// the model the client asked for: a made-up model under "*" makes no
// series of its own.
func TestSpendMetricsMoveByTheExactAmountsUnderTheConfiguredPriceName(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		family := redistest.UniqueID(t) + "-gpt" // a prefix entry of this test's own: a new series
		gw := flightGatewayTo(t, up.URL, store, teamLines+fmt.Sprintf(`
			limit team * budget_day 10
			price %s* input 2.50 output 10
			price * input 1 output 2`, family))
		series := func(what, price string) string {
			return fmt.Sprintf(`caddy_rolter_ratelimit_spend_%s_nanodollars_total{price=%q}`, what, price)
		}
		team := "X-Team: " + redistest.UniqueID(t)
		used := up.json(openAIUsage(`{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}`))
		for _, r := range []struct {
			model, entry                string
			reserved, charged, returned int64
		}{
			// $2.50 and $10 per million: 2500 and 10_000 n$ a token.
			{family + "-4o", family + "*", budgetInput*2500 + budgetMaxTokens*10_000, 10*2500 + 20*10_000, (budgetMaxTokens - 20) * 10_000},
			// "*": $1 and $2 per million.
			{"made-up-" + redistest.UniqueID(t), "*", budgetInput*1000 + budgetMaxTokens*2000, 10*1000 + 20*2000, (budgetMaxTokens - 20) * 2000},
		} {
			before := scrape(t)
			if res, body := openAICall(r.model, false).send(t, gw, team, used); res.StatusCode != 200 {
				t.Fatalf("%s: %d %s", r.model, res.StatusCode, body)
			}
			waitMetric(t, series("charged", r.entry), before[series("charged", r.entry)]+float64(r.charged))
			after := scrape(t)
			for what, want := range map[string]int64{"reserved": r.reserved, "returned": r.returned} {
				if got := after[series(what, r.entry)] - before[series(what, r.entry)]; got != float64(want) {
					t.Errorf("%s rose by %v for %s, want %d", series(what, r.entry), got, r.model, want)
				}
			}
			// Its tokens, under the same entry: 10 in and 20 out charged
			// of the 10 and 100 reserved.
			for what, want := range map[string]int64{"charged": 30, "reserved": budgetInput + budgetMaxTokens, "returned": budgetInput + budgetMaxTokens - 30} {
				tokens := fmt.Sprintf(`caddy_rolter_ratelimit_tokens_%s_total{kind="total",model=%q}`, what, r.entry)
				if got := after[tokens] - before[tokens]; got != float64(want) {
					t.Errorf("%s rose by %v for %s, want %d", tokens, got, r.model, want)
				}
			}
			if text := metricsText(t); strings.Contains(text, r.model) {
				t.Errorf("the metrics name the model %s a client asked for", r.model)
			}
		}
	})
}

// A reload re-reads the price file: once the file has changed and the
// config is loaded again through the admin API, the next request reserves
// and is charged at the file's new prices.
func TestAReloadRereadsThePriceFileAndTheNextRequestIsPricedAtItsNewPrices(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		file := filepath.Join(t.TempDir(), "prices.json")
		writePrices := func(input, output string) {
			t.Helper()
			entry := fmt.Sprintf(`{"reload-model": {"input_cost_per_token": %s, "output_cost_per_token": %s, "litellm_provider": "test", "mode": "chat"}}`, input, output)
			if err := os.WriteFile(file, []byte(entry), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		writePrices("1e-06", "2e-06")
		site := limited(flightStore(store), teamLines+"limit team * budget_day 10\nprices "+file+"\non_redis_error deny")
		gw := startGatewayWith(t, up.URL, "", site, 0)
		team := redistest.UniqueID(t)
		reserved := `caddy_rolter_ratelimit_spend_reserved_nanodollars_total{price="reload-model"}`
		used := up.json(openAIUsage(`{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}`))
		spent := int64(0)
		for i, p := range []struct {
			input, output string
			perIn, perOut int64 // n$ a token
		}{{"1e-06", "2e-06", 1000, 2000}, {"3e-06", "5e-06", 3000, 5000}} {
			if i > 0 {
				writePrices(p.input, p.output)
				if code, body, err := postLoad(caddyAdmin(), gatewayCaddyfile(caddyAdmin(), gw.port, "", site, up.URL), true); err != nil || code != 200 {
					t.Fatalf("POST /load: %d %s %v", code, body, err)
				}
				// The old config's server closes the connections it kept:
				// a POST on one of them would not be retried.
				gw.tester.Client.CloseIdleConnections()
			}
			before := scrape(t)[reserved]
			if res, body := openAICall("reload-model", false).send(t, gw, "X-Team: "+team, used); res.StatusCode != 200 {
				t.Fatalf("request %d: %d %s", i+1, res.StatusCode, body)
			}
			if got, want := scrape(t)[reserved]-before, budgetInput*p.perIn+budgetMaxTokens*p.perOut; got != float64(want) {
				t.Errorf("request %d reserved %v n$, want %d at input %s and output %s per token", i+1, got, want, p.input, p.output)
			}
			spent += 10*p.perIn + 20*p.perOut
			waitSettled(t, caddyAdmin(), team, spent)
		}
	})
}

// A spent budget refuses each dialect's request with that provider's own
// quota error, which its SDK reads as one: OpenAI's insufficient_quota,
// Anthropic's enforced_spend_limit_reached, Google's RESOURCE_EXHAUSTED
// with a QuotaFailure; each with the exact wait until the budget renews,
// at midnight in budget_timezone, and x-should-retry false when that is
// more than a minute away.
func TestASpentBudgetIsRefusedAsEachProvidersQuotaErrorUntilItRenews(t *testing.T) {
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		// quota-model: $1 and $2 per million; a request reserves 10 × 1000
		// + 100 × 2000 = 210_000 n$, the whole day budget.
		const largest = budgetInput*1000 + budgetMaxTokens*2000
		gw := flightGatewayTo(t, up.URL, store, teamLines+fmt.Sprintf(`
			limit team * budget_day %s budget_month 1
			price quota-model input 1 output 2
			budget_timezone Asia/Kolkata`, usdText(largest)))
		team := redistest.UniqueID(t)
		// A success without usage keeps its reservation: the day is spent.
		if res, body := openAICall("quota-model", false).send(t, gw, "X-Team: "+team, up.json(`{"object":"chat.completion","choices":[]}`)); res.StatusCode != 200 {
			t.Fatalf("the first request: %d %s", res.StatusCode, body)
		}
		l := waitSettled(t, caddyAdmin(), team, largest)
		start, err := time.Parse(time.RFC3339, l.BudgetDay.Start)
		if err != nil || l.BudgetDay.Timezone != "Asia/Kolkata" || !strings.HasSuffix(l.BudgetDay.Start, "T00:00:00+05:30") || start.After(time.Now()) || l.BudgetDay.Remaining != "0.00" {
			t.Fatalf("the spent day budget: %+v, want a Kolkata day with nothing remaining", *l.BudgetDay)
		}
		if store != "" {
			checkBudgetKeys(t, strings.TrimPrefix(store, "redis "), team, "day", l.BudgetDay, largest, 0)
		}
		const refusals = `caddy_rolter_ratelimit_refusals_total{kind="budget",scope="team",shadow="false",window="day"}`
		before := scrape(t)[refusals]
		message := "Budget reached for team: $0.00021 per day, of which $0.00021 is spent or reserved. It renews at "
		clock := storeClock(t, strings.TrimPrefix(store, "redis "))
		for _, c := range []struct {
			name  string
			call  budgetCall
			quota func(body []byte, ms int64) bool // the body is the dialect's quota error
		}{
			{"OpenAI", openAICall("quota-model", false), func(body []byte, _ int64) bool {
				var e openAIError
				return json.Unmarshal(body, &e) == nil && e.Error.Type == "insufficient_quota" && e.Error.Code == "insufficient_quota" && strings.HasPrefix(e.Error.Message, message)
			}},
			{"Anthropic", anthropicCall("quota-model", false), func(body []byte, _ int64) bool {
				var e anthropicError
				return json.Unmarshal(body, &e) == nil && e.Type == "error" && e.Error.Type == "rate_limit_error" &&
					e.Error.Details.ErrorCode == "enforced_spend_limit_reached" && strings.HasPrefix(e.Error.Message, message)
			}},
			{"Gemini", geminiCall("quota-model", false), func(body []byte, ms int64) bool {
				var e googleErrorBody
				if json.Unmarshal(body, &e) != nil || len(e.Error.Details) != 2 {
					return false
				}
				quota, retry := e.Error.detail("QuotaFailure"), e.Error.detail("RetryInfo")
				return e.Error.Code == 429 && e.Error.Status == "RESOURCE_EXHAUSTED" && strings.HasPrefix(e.Error.Message, message) &&
					quota != nil && len(quota.Violations) == 1 && quota.Violations[0].Subject == "team" &&
					retry != nil && retry.RetryDelay == fmt.Sprintf("%d.%03ds", ms/1000, ms%1000)
			}},
		} {
			sent := clock()
			res, body := c.call.send(t, gw, "X-Team: "+team)
			received := clock()
			if res.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("%s: %d %s, want 429", c.name, res.StatusCode, body)
			}
			if p := budgetWaitProblem(res.Header, nextMidnight(sent, kolkata), sent, received); p != "" {
				t.Fatalf("%s: %s", c.name, p)
			}
			if ms := headerInt(t, res, "Retry-After-Ms"); !c.quota(body, ms) || !strings.Contains(string(body), "(Asia/Kolkata)") {
				t.Fatalf("%s: %s, want its quota error naming the budget and its renewal", c.name, body)
			}
		}
		if got := scrape(t)[refusals] - before; got != 3 || up.hits.Load() != 1 {
			t.Fatalf("refusals_total{kind=budget} rose by %v and the upstream saw %d requests, want 3 and 1", got, up.hits.Load())
		}
	})
}

// Each mistake of prices and budgets fails `caddy adapt`, the command
// operators run, with its message and the line it is on.
func TestCaddyAdaptRejectsEachPriceAndBudgetMistakeWithItsLine(t *testing.T) {
	bin := caddyBinary(t)
	dir := t.TempDir()
	for i, tc := range priceAndBudgetMistakes {
		t.Run(tc.name, func(t *testing.T) {
			// The site's first line comes before the directive's.
			file := filepath.Join(dir, fmt.Sprintf("Caddyfile%d", i))
			if err := os.WriteFile(file, []byte(":8080 {\n"+tc.input+"\n}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, "adapt", "--config", file, "--adapter", "caddyfile")
			cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
			out, err := cmd.CombinedOutput()
			// Caddy logs the error as a JSON line.
			var logged struct{ Msg string }
			for line := range strings.Lines(string(out)) {
				if json.Unmarshal([]byte(line), &logged) == nil && logged.Msg != "" {
					break
				}
			}
			at := fmt.Sprintf(", at %s:%d", file, tc.line+1)
			if err == nil || !strings.Contains(logged.Msg, tc.want) || !strings.HasSuffix(logged.Msg, at) {
				t.Fatalf("caddy adapt: %v\n%s\nwant an error saying %q and ending %q", err, out, tc.want, at)
			}
		})
	}
}

// A JSON config is loaded as Caddy loads a module (strict JSON, Provision,
// Validate); each mistake of prices and budgets fails one of the three
// steps saying what is wrong: those the Caddyfile finds in its lines
// (TestCaddyfileErrorsSayWhatJSONValidationSays holds the two to the same
// message), a price file read only at provisioning, and an unknown field.
func TestAJSONConfigWithABadPriceOrBudgetFailsToLoadSayingWhy(t *testing.T) {
	negative := filepath.Join(t.TempDir(), "negative.json")
	if err := os.WriteFile(negative, []byte(`{"gpt-4o": {"input_cost_per_token": -2.5e-06, "output_cost_per_token": 1e-05}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	const budget = `"scopes":[{"name":"team","value":"{http.request.header.X-Team}"}],"limits":[{"scope":"team","id":"*","budget_day":5}]`
	for _, tc := range []struct{ name, json, want string }{
		{"a price file that does not parse", `{` + budget + `,"price_file":"testdata/prices/broken.json"}`,
			"price file testdata/prices/broken.json: line 5, column 5 (offset 104): invalid character '}' looking for beginning of object key string"},
		{"a price file that does not exist", `{` + budget + `,"price_file":"testdata/prices/absent.json"}`,
			"price file: open testdata/prices/absent.json: no such file or directory"},
		{"a negative price in the price file", `{` + budget + `,"price_file":"` + negative + `"}`,
			`price file ` + negative + `: entry "gpt-4o": input_cost_per_token -2.5e-06 (USD per token): negative`},
		{"a negative price", `{` + budget + `,"prices":[{"model":"gpt-4o","input":-2.50,"output":10}]}`,
			`price gpt-4o: input "-2.50" (USD per million tokens): negative`},
		{"an unknown field in a price", `{` + budget + `,"prices":[{"model":"gpt-4o","input":2.50,"output":10,"batch_input":1.25}]}`,
			`unknown field "batch_input"`},
		{"a budget of 0", `{"scopes":[{"name":"team","value":"x"}],"limits":[{"scope":"team","id":"*","budget_month":"0"}],"prices":[{"model":"*","input":1,"output":2}]}`,
			`limit for scope "team" id "*": budget_month: a budget of 0 would refuse every request`},
		{"a time zone that does not exist", `{` + budget + `,"prices":[{"model":"*","input":1,"output":2}],"budget_timezone":"Mars/Olympus_Mons"}`,
			`budget_timezone "Mars/Olympus_Mons" is not an IANA time zone`},
		{"a budget without any price", `{` + budget + `}`,
			"a limit has a budget, but no price is given (price lines or a prices file): every request under it would be refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Handler
			err := caddy.StrictUnmarshalJSON([]byte(tc.json), &h)
			if err == nil {
				ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
				err = h.Provision(ctx)
				if err == nil {
					err = h.Validate()
				}
				h.Cleanup()
				cancel()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("loading %s: %v, want an error saying %q", tc.json, err, tc.want)
			}
		})
	}
}

// Each provider's cached input is priced as it reports it: OpenAI's and
// Gemini's prompt counts include their cache reads, Anthropic's and
// Bedrock's input excludes their cache reads and writes, which they report
// apart; reasoning is output; Cohere's billed units are priced, not the
// tokens its model read. The costs are worked out by hand at $2.50 per million input
// tokens, $10 output, $1.25 cache read, $3.125 cache write.
func TestEachProvidersCachedInputIsPricedAsItReportsIt(t *testing.T) {
	e, err := pricing.Inline("m", "2.50", "10", "1.25", "3.125")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		provider, body string
		want           int64
	}{
		{"openai", `{"usage":{"prompt_tokens":2000,"completion_tokens":100,"total_tokens":2100,` +
			`"prompt_tokens_details":{"cached_tokens":1500},"completion_tokens_details":{"reasoning_tokens":40}}}`,
			500*2_500 + 1500*1_250 + 100*10_000},
		{"openai responses", `{"response":{"usage":{"input_tokens":2000,"output_tokens":100,"total_tokens":2100,` +
			`"input_tokens_details":{"cached_tokens":1500},"output_tokens_details":{"reasoning_tokens":40}}}}`,
			500*2_500 + 1500*1_250 + 100*10_000},
		{"anthropic", `{"usage":{"input_tokens":500,"cache_creation_input_tokens":1000,"cache_read_input_tokens":1500,"output_tokens":100}}`,
			500*2_500 + 1000*3_125 + 1500*1_250 + 100*10_000},
		{"gemini", `{"usageMetadata":{"promptTokenCount":2000,"cachedContentTokenCount":1500,"candidatesTokenCount":60,"thoughtsTokenCount":40,"totalTokenCount":2100}}`,
			500*2_500 + 1500*1_250 + 100*10_000},
		{"bedrock", `{"usage":{"inputTokens":500,"cacheReadInputTokens":1500,"cacheWriteInputTokens":1000,"outputTokens":100,"totalTokens":3100}}`,
			500*2_500 + 1000*3_125 + 1500*1_250 + 100*10_000},
		{"cohere", `{"usage":{"billed_units":{"input_tokens":500,"output_tokens":100},"tokens":{"input_tokens":2500,"output_tokens":100}}}`,
			500*2_500 + 100*10_000},
	} {
		m := usage.NewMeter(http.Header{"Content-Type": {"application/json"}})
		m.Write([]byte(c.body))
		u, metered := m.Finish()
		if got := costOf(e.Price, u); !metered || got != c.want {
			t.Errorf("%s: costs %d nano-dollars (metered %v), want %d", c.provider, got, metered, c.want)
		}
	}
}

// A budget refusal is each dialect's quota error: OpenAI's
// insufficient_quota, Anthropic's enforced_spend_limit_reached, Google's
// QuotaFailure beside the RetryInfo; Bedrock's and Cohere's message, whose
// status and code dialect_test.go checks.
func TestABudgetRefusalIsEachDialectsQuotaError(t *testing.T) {
	e := errorAnswer{status: 429, message: "Budget reached", typ: "insufficient_quota", code: "insufficient_quota", scope: "team", retryMillis: 3_600_000, quota: true}
	for d, want := range map[dialect]string{
		dialectOpenAI:    `{"error":{"code":"insufficient_quota","message":"Budget reached","param":null,"type":"insufficient_quota"}}`,
		dialectAnthropic: `{"error":{"details":{"error_code":"enforced_spend_limit_reached"},"message":"Budget reached","type":"rate_limit_error"},"type":"error"}`,
		dialectGemini: `{"error":{"code":429,"details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"description":"Budget reached","subject":"team"}]},` +
			`{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"3600.000s"}],"message":"Budget reached","status":"RESOURCE_EXHAUSTED"}}`,
		dialectBedrock: `{"message":"Budget reached"}`,
		dialectCohere:  `{"message":"Budget reached"}`,
	} {
		w := httptest.NewRecorder()
		if err := d.write(w, e); err != nil {
			t.Fatal(err)
		}
		if got := w.Body.String(); got != want {
			t.Errorf("dialect %d:\n%s\nwant\n%s", d, got, want)
		}
	}
}

// A budget refusal names the scope, the budget and its period, what is
// spent or reserved, and when it renews in its time zone, never the id;
// its wait is exact to the renewal. A budget with money left, but less than
// the request may cost, says how much of each.
func TestABudgetRefusalSaysWhichBudgetAndWhenItRenews(t *testing.T) {
	paris, err := limiter.CalendarOf("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, time.March, 10, 15, 0, 0, 0, paris.Location).UnixMilli()
	team := limiter.CapsOfWindows(limiter.WindowCaps{})
	team.Budgets = limiter.BudgetCaps{Max: [limiter.NumBudgetPeriods]int64{limiter.BudgetDay: 10 * pricing.NanoPerUSD}, Calendar: paris}
	chain := []limiter.Limit{newLimit("key", "secret-key", 100, 0), limiter.NewLimit("", "team", "search", team)}
	d := limiter.Decision{Now: limiter.MomentAt(at), Counts: make([]limiter.Counts, 2), Reserve: limiter.TokenCounts{Total: 10, Cost: 2}}
	d.Counts[1].Spent[limiter.BudgetDay], d.Counts[1].Reserved[limiter.BudgetDay] = 9*pricing.NanoPerUSD, pricing.NanoPerUSD-1
	ref := limiter.RefusalOf(chain, d)
	if ref.First != 1 || ref.Kind != limiter.Budget || ref.WindowName() != "day" || ref.WaitMillis != 9*3600_000 || !ref.KnowsWait() {
		t.Fatalf("refusal %+v, want the team's day budget, renewing in 9 hours", ref)
	}
	want := "Budget reached for team: $10.00 per day, of which $9.999999999 is spent or reserved. It renews at 2026-03-11T00:00:00+01:00 (Europe/Paris); please try again then."
	if got := refusalMessage(ref, chain, 0); got != want {
		t.Fatalf("message\n%s\nwant\n%s", got, want)
	}
	// With money left, but less than what the request may cost, it says so:
	// the client may ask for less.
	d.Counts[1].Reserved[limiter.BudgetDay] = pricing.NanoPerUSD - 14_300_000
	d.Reserve.Cost = 15_400_000
	ref = limiter.RefusalOf(chain, d)
	want = "Not enough budget left for team: this request may cost up to $0.0154; $0.0143 is left of $10.00 per day. Ask for fewer tokens (max_tokens), or try again once it renews at 2026-03-11T00:00:00+01:00 (Europe/Paris)."
	if got := refusalMessage(ref, chain, d.Reserve.Cost); ref.First != 1 || got != want {
		t.Fatalf("message\n%s\nwant\n%s", got, want)
	}
	d.Counts[1].Reserved[limiter.BudgetDay] = pricing.NanoPerUSD - 1
	d.Reserve.Cost = 1
	if ref := limiter.RefusalOf(chain, d); ref.First >= 0 {
		t.Fatalf("a cost that fits exactly was refused: %+v", ref)
	}
}

// A store that fails never lets spend through uncounted: with
// on_redis_error allow, a request under no budget passes unchecked, and one
// under a budget is answered 503.
func TestARequestUnderABudgetIsRefusedWhenTheStoreFailsWhateverOnRedisErrorSays(t *testing.T) {
	srv := redistest.NewServer(t)
	up := newUpstream(t)
	gw := startGateway(t, up.URL, fmt.Sprintf(`
	rolter_ratelimit {
		redis %s
		scope org {http.request.header.X-Org}
		price * input 1 output 1
		limit org budgeted budget_month 100
		limit org * rpm 100
		on_redis_error allow
	}
	reverse_proxy {upstream}`, srv.URL()))
	srv.Stop()
	if res, body := gw.postChat(t, chatAbout1000, "X-Org: budgeted"); res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("under a budget with the store down: %d %s, want 503", res.StatusCode, body)
	}
	if res, body := gw.postChat(t, chatAbout1000, "X-Org: other"); res.StatusCode != http.StatusOK {
		t.Fatalf("under no budget with the store down: %d %s, want 200 (on_redis_error allow)", res.StatusCode, body)
	}
	if n := up.hits.Load(); n != 1 {
		t.Fatalf("the upstream saw %d requests, want only the one under no budget", n)
	}
}

// A model without a price is a 400 in each dialect: Gemini's is
// INVALID_ARGUMENT, as Gemini answers a request it cannot serve as sent.
func TestAModelWithoutAPriceIsEachDialectsBadRequest(t *testing.T) {
	a := noPrice("gpt-9")
	w := httptest.NewRecorder()
	if err := dialectGemini.write(w, errorAnswer{status: a.status, message: a.message}); err != nil {
		t.Fatal(err)
	}
	want := `{"error":{"code":400,"message":"This gateway has no price for the model \"gpt-9\", and a spend budget applies to this request: it cannot be counted, so it is refused.","status":"INVALID_ARGUMENT"}}`
	if got := w.Body.String(); got != want {
		t.Fatalf("%s\nwant\n%s", got, want)
	}
}

// A client cannot choose the price it is counted at by hiding its model: a
// body the limiter cannot read wholly (compressed, or over the 4 MiB it
// reads) is refused under a budget, even where "*" prices every model,
// since a "model" key past what was read would win upstream.
func TestABodyWhoseModelCannotBeReadWhollyIsRefusedUnderABudget(t *testing.T) {
	up := newUpstream(t)
	gw := startGateway(t, up.URL, limited("", `
		scope key {http.request.header.X-Api-Key}
		price * input 0.01 output 0.01
		limit key * budget_day 100`))
	long := `{"model":"cheap","messages":[{"role":"user","content":"` + strings.Repeat("a", maxReadBody) + `"}],"model":"expensive"}`
	for what, req := range map[string][]string{
		"compressed":  {"Content-Encoding: gzip"},
		"over 4 MiB":  nil,
		"read wholly": nil,
	} {
		body := long
		if what != "over 4 MiB" {
			body = `{"model":"m"}`
		}
		res, got := gw.send(t, "POST", "/v1/chat/completions", body, append(req, "Content-Type: application/json", "X-Api-Key: "+redistest.UniqueID(t))...)
		if want := map[bool]int{true: 200, false: 400}[what == "read wholly"]; res.StatusCode != want || want == 400 && !strings.Contains(string(got), "cannot read which model") {
			t.Errorf("%s: %d %s, want %d", what, res.StatusCode, got, want)
		}
	}
	if n := up.hits.Load(); n != 1 {
		t.Fatalf("the upstream saw %d requests, want only the one whose model was read", n)
	}
}
