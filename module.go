package ratelimit

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler enforces caps on requests and tokens (all of them, input or output)
// per minute and per day, token buckets, caps on requests in flight, and
// spend budgets per calendar day and month, over a chain of scopes. A
// request is admitted only if every limit of its chain fits, in one atomic
// step; a refused request gets a 429 that LLM client SDKs understand and
// never reaches the next handler. The repository's docs/ folder is its
// manual; docs/http.md has the answers' bodies in every dialect.
//
// Each request that a limit applies to (or whose required scope is empty,
// or that is a WebSocket session the connection cap refuses) ends in one of
// these outcomes:
//
//	admitted             passed on, with the rate-limit headers
//	refused              by a limit: 429 (or Status), Retry-After; or, too large for a
//	                     token cap or a budget to ever fit, 429 with x-should-retry false
//	                     and no wait; or by a cap on requests in flight, 429 without a
//	                     wait; or by a spent budget, each dialect's quota error with the
//	                     wait until it renews
//	refused_no_price     under a budget, a model without a price: 400, before any store call
//	refused_bad_limit    a cap that comes with the request is missing or not valid, and
//	                     has no fallback: 503, before any store call
//	shadow_refused       admitted, but a shadow limit would have refused it (shadow.go):
//	                     the refusal placeholders describe what it would have done
//	refused_empty_scope  a required scope is empty: 403, before any store call
//	refused_ambiguous_scope
//	                     a scope's one header sent more than once, two different
//	                     credentials for api_key, or a model named twice (a body's
//	                     "model" under two spellings, a session URL's model
//	                     parameter): 400, before any store call
//	refused_body_memory  the body found no room under body_memory in time: 503
//	failed_open          the store failed; passed on unchecked (on_redis_error allow)
//	failed_closed        the store failed; 503 (on_redis_error deny)
//	refused_connections  a WebSocket session over realtime max_connections: 503
//	refused_unmetered_session
//	                     a WebSocket session over HTTP/2 or HTTP/3, whose frames cannot be
//	                     metered, under a chain that meters tokens or spend: 400
//
// These placeholders are set for those requests, for logs and handle_errors:
//
//	{http.rolter_ratelimit.model}          the model the request asks for (the JSON body's
//	                                       "model", Gemini's and Azure OpenAI's path
//	                                       segment, or a realtime session's URL model
//	                                       parameter), set before the chain is resolved when a
//	                                       scope's value names it, so that scopes can be
//	                                       per model: "" when there is none
//	{http.rolter_ratelimit.api_key}        the credential the request's API reads, as its
//	                                       provider reads it (see credentialSources): set
//	                                       before the chain is resolved when a scope's value
//	                                       names it; "" when there is none
//	{http.rolter_ratelimit.outcome}        the outcome above
//	{http.rolter_ratelimit.refused_scope}  on a refusal: the first refusing scope's name,
//	                                       or the required scope that is empty, or the scope
//	                                       whose limit cannot be read; on shadow_refused, the
//	                                       shadow limit's (and so the next three, and the wait)
//	{http.rolter_ratelimit.refused_kind}   on a refusal by a limit: requests, tokens, input_tokens,
//	                                       output_tokens, burst, too_large, concurrency or budget;
//	                                       on shadow_refused also unreadable (a shadow limit's cap
//	                                       per request not given validly)
//	{http.rolter_ratelimit.refused_window} on a refusal by a limit's window: minute or day; by a
//	                                       budget: day or month ("" for a bucket or a concurrency cap)
//	{http.rolter_ratelimit.refused_limit}  on a refusal by a limit: its cap (a bucket's burst, a
//	                                       budget in US dollars: 500.00)
//	{http.rolter_ratelimit.waited_ms}      with wait: how long the request waited, in milliseconds (0: not at all)
//	{http.rolter_ratelimit.retry_after}    on an answer that announces a wait (a refusal by a limit,
//	                                       not too_large nor by requests in flight; a body over
//	                                       body_memory): Retry-After, in seconds
//
// A request that no limit applies to passes through untouched, with no
// placeholder set.
type Handler struct {
	// Redis is the shared store. Without it the counters live in this Caddy
	// process (kept across config reloads), which suits a single machine.
	Redis *RedisConfig `json:"redis,omitempty"`

	// Scopes is the request's chain, innermost first by convention (key,
	// project, team, org). Limits are checked in this order and the first
	// refusal wins. A scope whose value resolves empty is not in the chain,
	// unless it is Required.
	Scopes []Scope `json:"scopes,omitempty"`

	// Limits are the caps. An id with neither its own limit nor a "*" default
	// for its scope is unlimited in that scope.
	Limits []LimitConfig `json:"limits,omitempty"`

	// OnRedisError is what happens when the store cannot answer: "allow"
	// (the default: fail open) or "deny" (answer 503). A request under a
	// budget is answered 503 either way: its spend could not be counted.
	OnRedisError string `json:"on_redis_error,omitempty"`

	// OnRefusal is "respond" (the default: the handler writes its answers
	// itself) or "error": it returns a handler error with the answer's
	// status (429, or Status, for a refusal by a limit), for handle_errors,
	// with the headers and placeholders already set. A store failure's 503
	// (on_redis_error deny, or under a budget) is always written.
	OnRefusal string `json:"on_refusal,omitempty"`

	// Status is the HTTP status of a refusal by any limit, of any kind
	// (400 to 599; default 429). The handler's other answers are not
	// refusals by a limit and keep their status: the 503 of a store failure,
	// of the realtime session cap, of body_memory and of a cap per request
	// that cannot be read, the 403 of an empty required scope and the 400s.
	Status int `json:"status,omitempty"`

	// Headers lists the rate-limit header families to send: "openai"
	// (x-ratelimit-*), "anthropic" (anthropic-ratelimit-requests-*,
	// -tokens-*, -input-tokens-* and -output-tokens-*), "ietf"
	// (RateLimit-Policy and RateLimit), "scg" (Spring Cloud Gateway's
	// X-RateLimit-Remaining, -Burst-Capacity, -Replenish-Rate and
	// -Requested-Tokens, for token buckets), several of them, or "off" alone
	// for none. Default: the dialect's, "anthropic" for a request in
	// Anthropic's dialect, else "openai". The families sent replace the
	// upstream's headers of the same families.
	Headers []string `json:"headers,omitempty"`

	// EnsureStreamUsage adds stream_options.include_usage to OpenAI streaming
	// chat-completions requests that lack it, so that their tokens can be
	// charged, and removes the usage chunk it adds from what the client
	// receives. Default true. Only requests whose chain caps tokens or spend
	// are touched.
	EnsureStreamUsage *bool `json:"ensure_stream_usage,omitempty"`

	// Realtime configures WebSocket sessions (realtime.go). Every WebSocket
	// handshake that the handler's matcher covers is a session: a GET
	// upgrading to websocket over HTTP/1.1, or an extended CONNECT over
	// HTTP/2 or HTTP/3 (refused where its tokens or spend would go
	// uncounted).
	Realtime *RealtimeConfig `json:"realtime,omitempty"`

	// Top keeps a tally of the ids of the scopes it names, per day and
	// month, by requests, refusals, tokens and spend, which the admin
	// API's GET /rolter_ratelimit/top answers (top.go). Absent: nothing is
	// tallied.
	Top *TopConfig `json:"top,omitempty"`

	// Dialect is the API shape of the handler's own answers (refusals and
	// errors): "openai", "anthropic", "gemini", "bedrock" or "cohere".
	// Default: the API the request's path names (Anthropic's
	// …/v1/messages and its models on Vertex AI, Gemini's
	// …/models/<model>:generateContent and its siblings, Bedrock's
	// …/model/<model>/converse and its siblings, Cohere's …/v2/chat), else
	// OpenAI. It also names the API whose credential the api_key
	// placeholder reads.
	Dialect string `json:"dialect,omitempty"`

	// ReserveTokens reserves, when a request is admitted, the tokens it may
	// cost against every token cap of its chain: an estimate of its input
	// from its body, plus the output cap it names (or ReserveOutput), so
	// that concurrent requests cannot together overshoot a cap. Both count
	// against tpm and tpd, the input against itpm and itpd, the output
	// against otpm and otpd. The reservation is settled against the usage
	// the response reports. A request whose reservation alone is over a cap
	// of its chain is refused at once. Default true; false is reactive: a
	// cap refuses once the tokens reported have filled it. Realtime sessions
	// are always reactive.
	ReserveTokens *bool `json:"reserve_tokens,omitempty"`

	// ReserveOutput is the output reserved for each choice of a request that
	// names no output cap: a positive number of tokens, default 1024; that
	// request's reservation is then at most each cap of its chain.
	ReserveOutput int64 `json:"reserve_output,omitempty"`

	// BodyMemory caps, in bytes, the memory held at once by the request
	// bodies that the limiters of this Caddy process are reading (to
	// estimate their tokens and find their model), so that clients cannot
	// make the gateway buffer what they please: a body holds none until its
	// first byte arrives and grows its buffer only as its bytes arrive, and
	// one that would pass the cap takes the room of a body that stalls or
	// of the client address holding the most, else waits up to a second
	// for room, then is answered 503. Default 64 MiB; at least 8 MiB. The
	// first 4 MiB of a body are read; the rest passes on unread.
	BodyMemory int64 `json:"body_memory,omitempty"`

	// SlotLease is how long the slots of requests in flight (Concurrent)
	// that a gateway process holds outlive its last renewal of them: a
	// process that dies, or loses its store, frees its slots within one
	// lease. A live request's slots are renewed every third of it, however
	// long the request lasts. Default 30s; at least 1s.
	SlotLease caddy.Duration `json:"slot_lease,omitempty"`

	// Prices are the prices of models in US dollars per million tokens,
	// which spend budgets (BudgetDay, BudgetMonth) count requests at. An
	// entry here beats PriceFile's of the same name.
	Prices []PriceConfig `json:"prices,omitempty"`

	// PriceFile is a file of prices in the format of LiteLLM's
	// model_prices_and_context_window.json, read when the config loads (a
	// reload reads it again). Of each entry, only its per-token prices are
	// read: input_cost_per_token, output_cost_per_token,
	// cache_read_input_token_cost, cache_creation_input_token_cost,
	// output_cost_per_reasoning_token, input_cost_per_audio_token and
	// output_cost_per_audio_token; an entry priced in none of the first
	// two is left out. Placeholders such as {env.PRICES} are resolved.
	PriceFile string `json:"price_file,omitempty"`

	// BudgetTimezone is the IANA time zone (Europe/Paris) whose calendar
	// days and months the budgets cover; default UTC.
	BudgetTimezone string `json:"budget_timezone,omitempty"`

	// Wait holds a request refused by a window or a bucket whose exact wait
	// is within it until then, and admits it again, rather than refusing
	// it (wait.go); a refusal by a budget or a cap on requests in flight
	// never waits. A duration ("2s", or an integer of nanoseconds). Default
	// 0: refuse at once.
	Wait caddy.Duration `json:"wait,omitempty"`

	// MaxWaiting caps the requests waiting at once in this Caddy process,
	// across its handlers; past it a request is refused at once. A request
	// reads its body before it takes a place, so that a client slow to
	// send it holds none. A positive integer; default 1000.
	MaxWaiting int64 `json:"max_waiting,omitempty"`

	// Shadow makes every limit a shadow limit (LimitConfig.Shadow).
	Shadow bool `json:"shadow,omitempty"`

	// ShadowHeader sends, on a request a shadow limit would have refused,
	// the header X-Ratelimit-Shadow: "<kind>; scope=<scope>; window=<window>;
	// retry-after=<seconds>", so that the caller sees what a limit being
	// tried would do. Default off.
	ShadowHeader bool `json:"shadow_header,omitempty"`

	store   limiter.Store
	prices  *pricing.Table // Prices and PriceFile
	release func() error   // gives the store back to its pool
	limits  map[string]scopeLimits
	// scopeHeaders is, per scope, the request header its value names when
	// the value is that one placeholder (scopeHeader), else "".
	scopeHeaders []string
	// readsModel and readsAPIKey: a scope's value names the model or the
	// api_key placeholder, which is set from the request before the chain
	// is resolved.
	readsModel, readsAPIKey bool
	configuredFamilies      headerFamilies // Headers, parsed: see families
	logger                  *zap.Logger
	warn                    *warnLimiter // store failures at admission
	chargeWarn              *warnLimiter // failed token charges
	usageWarn               *warnLimiter // usage over its ceiling
	bodyWarn                *warnLimiter // bodies over body_memory
	badLimitWarn            *warnLimiter // caps per request missing or not valid
	shadowLog               *warnLimiter // shadow refusals, at info
	learnWarn               *warnLimiter // provider reports the store could not write
	// crossingEvents queues the events of notify fractions' crossings for
	// the goroutine that emits them (provisionEvents); nil when no limit
	// notifies.
	crossingEvents chan map[string]any
	eventsWarn     *warnLimiter // events dropped
	// calendar is budget_timezone's, whose periods the budgets and the
	// top consumers' tallies are of; tallied, by scope, whether Top
	// names it (nil without Top).
	calendar *limiter.Calendar
	tallied  []bool
}

// Scope is one link of the chain.
type Scope struct {
	// Name is the scope's name, a free identifier such as "key" or "org".
	Name string `json:"name"`
	// Value is the scope's id for a request, usually a placeholder such as
	// {http.request.header.X-Org}.
	Value string `json:"value"`
	// Readable declares that the scope's ids are not secret, so that they
	// are written as they are (when they are short plain tokens) in Redis
	// keys, logs and the admin API's answers. Otherwise, whatever the scope
	// is called, its ids are written only as "#" and 32 hex digits of their
	// SHA-256: an API key, a bearer token or an email never is.
	Readable bool `json:"readable,omitempty"`
	// Required refuses, with 403 and before any store call, a request whose
	// value for this scope is empty. Otherwise an empty value leaves the
	// scope out of the request's chain.
	Required bool `json:"required,omitempty"`
	// Joined declares that the request header Value names is a list, whose
	// values, sent in several header lines, are the id joined by commas.
	// Otherwise a request that sends the header more than once is refused
	// with 400 before any store call: the upstream reads one of the
	// values, and a limiter that read them joined would count a client's
	// every variation of the others afresh.
	Joined bool `json:"joined,omitempty"`
}

// LimitConfig caps one id of a scope, every id that starts with a prefix
// ("gpt-4o*"), or every id of it ("*"): per minute, per day, with a token
// bucket, in flight, in US dollars spent, or any of these; every cap must
// admit a request. Each window cap is a positive integer of at most 10^11.
// Tokens are those the response's usage reports: TPM and TPD count all of
// them, ITPM and ITPD its input (prompt) tokens, OTPM and OTPD its output
// (completion) tokens; the table of docs/tokens.md names the usage fields
// of each provider that each counts.
type LimitConfig struct {
	// Scope names a scope of the chain.
	Scope string `json:"scope"`
	// ID is the id as it appears in requests (placeholders such as
	// {env.VIP_KEY} are resolved when the config loads, and one that
	// resolves to nothing fails the load); "<prefix>*" for every id that
	// starts with the prefix, as one pool (the longest prefix wins, and an
	// exact id beats it); or "*" for the default of every id of the scope
	// that has no limit of its own.
	ID string `json:"id"`
	// RPM caps requests per minute; 0 or absent: no cap (so for each
	// window).
	RPM int64 `json:"rpm,omitempty"`
	// TPM caps tokens per minute: input and output, and whatever else the
	// usage's total counts (Anthropic's cache reads).
	TPM int64 `json:"tpm,omitempty"`
	// ITPM caps input tokens per minute.
	ITPM int64 `json:"itpm,omitempty"`
	// OTPM caps output tokens per minute.
	OTPM int64 `json:"otpm,omitempty"`
	// RPD caps requests per day: a sliding window over the trailing 24
	// hours, estimated from day periods (unix seconds / 86400) as the
	// minute windows are from minute periods, at one-second resolution.
	RPD int64 `json:"rpd,omitempty"`
	// TPD caps tokens per day.
	TPD int64 `json:"tpd,omitempty"`
	// ITPD caps input tokens per day.
	ITPD int64 `json:"itpd,omitempty"`
	// OTPD caps output tokens per day.
	OTPD int64 `json:"otpd,omitempty"`
	// Rate is the refill of a token bucket, in tokens per second: a positive
	// decimal with at most three places, such as 10 or 0.5, of at most
	// 1000000, refilled from elapsed time at millisecond precision. Absent:
	// no bucket.
	Rate json.Number `json:"rate,omitempty"`
	// Burst is the bucket's capacity in tokens, required with Rate: a full
	// bucket admits that many requests at once. At most 10^9.
	Burst int64 `json:"burst,omitempty"`
	// Cost is the tokens an admitted request takes from the bucket; default
	// 1, at most Burst.
	Cost int64 `json:"cost,omitempty"`
	// Concurrent caps the requests of the id in flight at once, a WebSocket
	// session counting for its whole life: a positive integer of at most
	// 10^11; 0 or absent: no cap. A request refused by it is answered
	// without a wait (none is known). Its slots are leased (SlotLease).
	Concurrent int64 `json:"concurrent,omitempty"`
	// BudgetDay caps what the id spends per calendar day, in US dollars:
	// a positive decimal such as 20 or 2.50, exact to the nano-dollar, of
	// at most 1000000. Requests are priced by Prices and PriceFile (a
	// request whose model has no price is refused). Absent: no cap.
	BudgetDay json.Number `json:"budget_day,omitempty"`
	// BudgetMonth caps what the id spends per calendar month, likewise.
	BudgetMonth json.Number `json:"budget_month,omitempty"`
	// PerRequest gives caps whose value comes with each request, by the
	// cap's name (rpm, tpm, …, rate, burst, cost, concurrent, budget_day,
	// budget_month), each instead of its field above: its value holds
	// placeholders, resolved per request (perrequest.go).
	PerRequest map[string]PerRequestCap `json:"per_request,omitempty"`
	// Shadow tries the limit without refusing anyone: it is evaluated and
	// counted in the same atomic step as the others, a request it would
	// refuse is charged on its counters all the same (they show what the
	// traffic is) and passes, marked shadow_refused (shadow.go).
	Shadow bool `json:"shadow,omitempty"`
	// Learn learns the provider's own quota for each id of the limit from
	// the provider's answers (learn.go): their rate-limit headers
	// (OpenAI's, Azure OpenAI's and Anthropic's) and refusals (429 with its
	// wait; Anthropic's 529). A request is then admitted only within what
	// the provider last reported, besides the limit's own caps, which a
	// report never raises; a limit may learn with no cap of its own. The
	// scope's id usually names the provider's quota: the model, or an org
	// key and the model.
	Learn bool `json:"learn,omitempty"`
	// Floors keep a share of each of the limit's caps (its windows, its
	// bucket, and what Learn learned) for the requests of a class: those
	// whose chain has the floor's id in the floor's scope. While a class
	// asks (for 10 s after each of its requests), what its floor still has
	// is held from every other request; a class alone is admitted up to the
	// whole cap. A request's class is the first floor its chain matches. At
	// most 8, of at most 100% together (floors.go).
	Floors []FloorConfig `json:"floors,omitempty"`
	// Notify names fractions of each of the limit's caps (its windows, its
	// bucket, its requests in flight, its budgets), such as [0.8, 0.95, 1],
	// whole percents, at most 8: the admission that first takes an id's
	// level of a cap to or past one reports it, in the same atomic step,
	// so that across every gateway each crossing is reported once: a
	// window's and a budget's once per period (the minute or day, the
	// budget's day or month), a bucket's and the requests in flight's
	// again once their level fell below it. A crossing is a Caddy event,
	// rolter_ratelimit.threshold, a line of the log at info level, and a
	// count of caddy_rolter_ratelimit_thresholds_crossed_total (notify.go).
	Notify []json.Number `json:"notify,omitempty"`
}

// FloorConfig is one floor of a limit: Percent of each of its caps kept
// for the requests whose id in Scope is ID.
type FloorConfig struct {
	// Scope names a scope of the chain, other than the limit's own.
	Scope string `json:"scope"`
	// ID is the id in that scope, as requests give it (placeholders such
	// as {env.PROD_PLAN} are resolved when the config loads).
	ID string `json:"id"`
	// Percent is the share kept, a whole percent from 1 to 100.
	Percent int `json:"percent"`
}

// PriceConfig is the price of a model, of every model whose name starts
// with a prefix ("claude-sonnet-4*"), or of every model ("*"), in US
// dollars per million tokens: non-negative decimals such as 2.50 or 0.075.
type PriceConfig struct {
	// Model is the model name as requests give it, a prefix ending in
	// '*', or "*"; an exact name beats a prefix, the longest prefix
	// wins, and "*" comes last. Names are compared byte for byte.
	Model string `json:"model"`
	// Input is the price of input tokens served from no cache.
	Input json.Number `json:"input"`
	// Output is the price of output tokens, reasoning included.
	Output json.Number `json:"output"`
	// CacheRead is the price of input tokens read from a prompt cache;
	// absent: the input price.
	CacheRead json.Number `json:"cache_read,omitempty"`
	// CacheWrite is the price of input tokens written to a prompt cache;
	// absent: the input price.
	CacheWrite json.Number `json:"cache_write,omitempty"`
}

// entry is the price as the pricing table holds it; its error says what
// is wrong with it.
func (p PriceConfig) entry() (pricing.Entry, error) {
	return pricing.Inline(p.Model, string(p.Input), string(p.Output), string(p.CacheRead), string(p.CacheWrite))
}

// scopeLimits are the limits of one scope: per id (as stored), per id
// prefix (longest first), and the default (nil: none).
type scopeLimits struct {
	byID      map[string]*limitSpec
	byPrefix  []prefixLimit
	byDefault *limitSpec
}

// prefixLimit caps every id that starts with prefix as one pool, as a
// provider's model family shares one quota: its counters are named by the
// prefix (id, as stored), not by each id.
type prefixLimit struct {
	prefix, id string
	spec       *limitSpec
}

// resolve finds the limit of an id of the scope, as the request gives it
// (value) and as stored (id): its own, else that of the longest prefix
// that covers it, else the default. stored is the id its counters are
// named by; own is false for the default; spec is nil when nothing limits
// it. A value of "" (an id asked for by its digest) matches no prefix.
func (sl scopeLimits) resolve(value, id string) (stored string, spec *limitSpec, own bool) {
	if spec, ok := sl.byID[id]; ok {
		return id, spec, true
	}
	for _, p := range sl.byPrefix {
		if value != "" && strings.HasPrefix(value, p.prefix) {
			return p.id, p.spec, true
		}
	}
	return id, sl.byDefault, false
}

const defaultTimeout = 100 * time.Millisecond

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rolter_ratelimit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision builds the limit tables and takes a store from the process-wide
// pool, so that counters (and Redis connections) survive config reloads.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.warn, h.chargeWarn, h.usageWarn, h.bodyWarn, h.badLimitWarn, h.shadowLog = new(warnLimiter), new(warnLimiter), new(warnLimiter), new(warnLimiter), new(warnLimiter), new(warnLimiter)
	h.learnWarn, h.eventsWarn = new(warnLimiter), new(warnLimiter)
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	if err := h.provisionEvents(ctx); err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	h.scopeHeaders = make([]string, len(h.Scopes))
	readable := make(map[string]bool, len(h.Scopes))
	for i, s := range h.Scopes {
		h.scopeHeaders[i] = scopeHeader(s.Value)
		readable[s.Name] = s.Readable
		h.readsAPIKey = h.readsAPIKey || strings.Contains(s.Value, "{"+placeholderAPIKey+"}")
	}
	h.readsModel = h.modelScope() != ""
	if err := h.loadPrices(repl); err != nil {
		return err
	}
	calendar, err := limiter.CalendarOf(h.BudgetTimezone)
	if err != nil {
		return err
	}
	h.calendar = calendar
	if h.Top != nil {
		h.tallied = make([]bool, len(h.Scopes))
		for i, s := range h.Scopes {
			h.tallied[i] = slices.Contains(h.Top.Scopes, s.Name)
		}
	}
	h.limits = make(map[string]scopeLimits)
	effective := make([]string, 0, len(h.Limits)) // for the log, ids as stored
	for _, lc := range h.Limits {
		sl := h.limits[lc.Scope]
		spec, err := h.specOf(lc, calendar)
		if err != nil {
			return err
		}
		if spec.floorClass, err = h.floorClassOf(lc, repl); err != nil {
			return err
		}
		id := "*"
		raw, err := lc.resolvedID(repl)
		if err != nil {
			return err
		}
		switch prefix, isPrefix := strings.CutSuffix(raw, "*"); {
		case lc.ID == "*":
			sl.byDefault = spec
		case isPrefix:
			id = limiter.PrefixKeyID(readable[lc.Scope], prefix)
			sl.byPrefix = append(sl.byPrefix, prefixLimit{prefix: prefix, id: id, spec: spec})
		default:
			if sl.byID == nil {
				sl.byID = make(map[string]*limitSpec)
			}
			id = limiter.KeyID(readable[lc.Scope], raw)
			sl.byID[id] = spec
		}
		h.limits[lc.Scope] = sl
		effective = append(effective, spec.describe(lc.Scope+" "+id))
	}
	for _, sl := range h.limits { // the longest prefix first: it wins
		slices.SortStableFunc(sl.byPrefix, func(a, b prefixLimit) int { return len(b.prefix) - len(a.prefix) })
	}
	h.configuredFamilies = parseHeaderFamilies(h.Headers)

	if h.Redis != nil {
		var rc *RedisConfig
		if rc, err = h.Redis.resolved(repl); err != nil {
			return err
		}
		h.store, h.release, err = acquireRedisStore(rc, h.timeout())
	} else {
		h.store, h.release, err = acquireMemoryStore()
	}
	if err != nil {
		return err
	}
	liveHandlers.add(h)
	h.logger.Info("rate limits loaded", zap.Strings("chain", h.scopeNames()), zap.Strings("limits", effective), zap.Bool("redis", h.Redis != nil))
	return nil
}

// loadPrices builds the pricing table from Prices and PriceFile (its path
// resolved with repl).
func (h *Handler) loadPrices(repl *caddy.Replacer) error {
	if len(h.Prices) == 0 && h.PriceFile == "" {
		return nil
	}
	inline, err := h.inlinePrices()
	if err != nil {
		return err
	}
	var file []pricing.Entry
	if h.PriceFile != "" {
		if file, err = pricing.LoadLiteLLM(repl.ReplaceKnown(h.PriceFile, "")); err != nil {
			return err
		}
	}
	h.prices, err = pricing.NewTable(inline, file)
	return err
}

// inlinePrices are the entries of Prices; the error says what is wrong
// with one, or that two have the same name.
func (h *Handler) inlinePrices() ([]pricing.Entry, error) {
	inline := make([]pricing.Entry, len(h.Prices))
	for i, p := range h.Prices {
		e, err := p.entry()
		if err != nil {
			return nil, err
		}
		inline[i] = e
	}
	_, err := pricing.NewTable(inline, nil)
	return inline, err
}

func (h *Handler) slotLease() time.Duration {
	return cmp.Or(time.Duration(h.SlotLease), limiter.DefaultSlotLease)
}

func (h *Handler) timeout() time.Duration {
	if h.Redis == nil || h.Redis.Timeout <= 0 {
		return defaultTimeout
	}
	return time.Duration(h.Redis.Timeout)
}

// minBodyMemory is the least body_memory: two bodies of the largest size
// read.
const minBodyMemory = 2 * maxReadBody

func (h *Handler) bodyMemory() int64 { return cmp.Or(h.BodyMemory, defaultBodyMemory) }

func (h *Handler) scopeNames() []string {
	names := make([]string, len(h.Scopes))
	for i, s := range h.Scopes {
		names[i] = s.Name
	}
	return names
}

var scopeNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

var errBudgetWithoutPrice = errors.New("a limit has a budget, but no price is given (price lines or a prices file): every request under it would be refused")

// Validate checks the configuration, as the Caddyfile parser does line by
// line, so that a JSON config gets the same errors.
func (h *Handler) Validate() error {
	if len(h.Scopes) > limiter.MaxCallLimits {
		return fmt.Errorf("%d scopes: a chain has at most %d", len(h.Scopes), limiter.MaxCallLimits)
	}
	scopes := make(map[string]bool, len(h.Scopes))
	for _, s := range h.Scopes {
		if err := s.validate(); err != nil {
			return err
		}
		if scopes[s.Name] {
			return fmt.Errorf("scope %q is defined twice", s.Name)
		}
		scopes[s.Name] = true
	}
	seen := make(map[[2]string]bool, len(h.Limits))
	for _, l := range h.Limits {
		if err := l.validate(); err != nil {
			return err
		}
		if !scopes[l.Scope] {
			return fmt.Errorf("limit for scope %q, which has no scope line", l.Scope)
		}
		for _, f := range l.Floors {
			if !scopes[f.Scope] {
				return fmt.Errorf("limit for scope %q id %q: floor %s %s names scope %q, which has no scope line", l.Scope, l.ID, f.Scope, f.ID, f.Scope)
			}
		}
		if seen[[2]string{l.Scope, l.ID}] {
			return fmt.Errorf("a second limit for scope %q id %q", l.Scope, l.ID)
		}
		seen[[2]string{l.Scope, l.ID}] = true
	}
	switch h.OnRedisError {
	case "", "allow", "deny":
	default:
		return fmt.Errorf("on_redis_error must be allow or deny, not %q", h.OnRedisError)
	}
	switch h.OnRefusal {
	case "", "respond", "error":
	default:
		return fmt.Errorf("on_refusal must be respond or error, not %q", h.OnRefusal)
	}
	if h.Status != 0 && (h.Status < 400 || h.Status > 599) {
		return fmt.Errorf("status must be an HTTP status from 400 to 599, not %d", h.Status)
	}
	if err := validateHeaderFamilies(h.Headers); err != nil {
		return err
	}
	switch h.Dialect {
	case "", "openai", "anthropic", "gemini", "bedrock", "cohere":
	default:
		return fmt.Errorf("dialect must be openai, anthropic, gemini, bedrock or cohere, not %q", h.Dialect)
	}
	if h.ReserveOutput < 0 {
		return fmt.Errorf("reserve_output must be a positive number of tokens, not %d", h.ReserveOutput)
	}
	budgets := false
	for _, l := range h.Limits {
		nominal, err := l.nominal()
		budgets = budgets || err == nil && (nominal.BudgetDay != "" || nominal.BudgetMonth != "")
	}
	if budgets && len(h.Prices) == 0 && h.PriceFile == "" {
		return errBudgetWithoutPrice
	}
	if _, err := h.inlinePrices(); err != nil {
		return err
	}
	if _, err := limiter.CalendarOf(h.BudgetTimezone); err != nil {
		return err
	}
	if h.Wait < 0 {
		return fmt.Errorf("wait must not be negative, not %s", time.Duration(h.Wait))
	}
	if h.MaxWaiting < 0 {
		return fmt.Errorf("max_waiting must be a positive number of requests, not %d", h.MaxWaiting)
	}
	if h.SlotLease != 0 && time.Duration(h.SlotLease) < limiter.MinSlotLease {
		return fmt.Errorf("slot_lease must be at least %s, not %s", limiter.MinSlotLease, time.Duration(h.SlotLease))
	}
	if h.BodyMemory != 0 && h.BodyMemory < minBodyMemory {
		return fmt.Errorf("body_memory must be at least %d bytes (8MiB: two bodies of the largest size read), not %d", minBodyMemory, h.BodyMemory)
	}
	if h.Realtime != nil {
		if err := h.Realtime.validate(); err != nil {
			return err
		}
	}
	if h.Top != nil {
		if err := h.Top.validate(scopes); err != nil {
			return err
		}
	}
	if h.Redis != nil {
		return h.Redis.validate()
	}
	return nil
}

func (s Scope) validate() error {
	if !scopeNameRE.MatchString(s.Name) {
		return fmt.Errorf("scope name %q: use letters, digits, '_' and '-' (at most 64)", s.Name)
	}
	if strings.TrimSpace(s.Value) == "" {
		return fmt.Errorf("scope %q has an empty value", s.Name)
	}
	return nil
}

func (l LimitConfig) validate() error {
	if l.ID == "" {
		return fmt.Errorf("limit for scope %q has an empty id", l.Scope)
	}
	if l.Burst < 0 || l.Cost < 0 {
		return fmt.Errorf("limit for scope %q id %q: burst and cost must be positive integers", l.Scope, l.ID)
	}
	if l.Concurrent < 0 || l.Concurrent > limiter.MaxCap {
		return fmt.Errorf("limit for scope %q id %q: concurrent must be a positive integer of at most %d, not %d", l.Scope, l.ID, int64(limiter.MaxCap), l.Concurrent)
	}
	for k, n := range l.windowCaps() {
		if n < 0 || n > limiter.MaxCap {
			return fmt.Errorf("limit for scope %q id %q: %s must be a positive integer of at most %d, not %d", l.Scope, l.ID, limiter.WindowKind(k), int64(limiter.MaxCap), n)
		}
	}
	if !slices.ContainsFunc(capKinds, func(k capKind) bool { return k.given(&l) }) && len(l.PerRequest) == 0 && !l.Learn {
		return fmt.Errorf("limit for scope %q id %q sets no cap: give %s", l.Scope, l.ID, capNames(", ", " or "))
	}
	if err := l.validateFloors(); err != nil {
		return err
	}
	if _, err := l.notifyPercents(); err != nil {
		return err
	}
	nominal, err := l.nominal()
	if err == nil {
		_, err = nominal.caps()
	}
	return err
}

// resolvedID is the limit's id with the placeholders repl knows (such as
// {env.VIP_KEY}) resolved, as the config loads. An id, or the prefix of a
// prefix id, that resolves to nothing is a mistake: it would limit no
// request, or cover every id.
func (l LimitConfig) resolvedID(repl *caddy.Replacer) (string, error) {
	raw := repl.ReplaceKnown(l.ID, "")
	switch {
	case l.ID == "*", l.ID == "": // the default; an empty id, which Validate refuses
	case raw == "":
		return "", fmt.Errorf("limit for scope %q id %q: the id resolves to nothing when the config loads, so it would limit no request", l.Scope, l.ID)
	case raw == "*":
		return "", fmt.Errorf("limit for scope %q id %q: its prefix resolves to nothing, so it would cover every id: write * for the scope's default", l.Scope, l.ID)
	}
	return raw, nil
}

// windowCapFields are the limit's window caps, by windowKind.
func (l *LimitConfig) windowCapFields() [limiter.NumWindows]*int64 {
	return [limiter.NumWindows]*int64{limiter.RPM: &l.RPM, limiter.TPM: &l.TPM, limiter.ITPM: &l.ITPM, limiter.OTPM: &l.OTPM, limiter.RPD: &l.RPD, limiter.TPD: &l.TPD, limiter.ITPD: &l.ITPD, limiter.OTPD: &l.OTPD}
}

// windowCaps are the limit's window caps, by windowKind.
func (l LimitConfig) windowCaps() (w limiter.WindowCaps) {
	for k, f := range l.windowCapFields() {
		w[k] = *f
	}
	return w
}

// caps reads the limit's caps, their slots' lease and their budgets'
// calendar aside; its error is a configuration mistake.
func (l LimitConfig) caps() (limiter.Caps, error) {
	caps := limiter.CapsOfWindows(l.windowCaps())
	caps.Concurrent.Max, caps.Learn = l.Concurrent, l.Learn
	for i, f := range l.Floors {
		caps.Floors[i] = uint8(f.Percent) // validateFloors bounds them
	}
	notify, err := l.notifyPercents()
	if err != nil {
		return caps, err
	}
	caps.Notify = notify
	for p, usd := range [limiter.NumBudgetPeriods]json.Number{limiter.BudgetDay: l.BudgetDay, limiter.BudgetMonth: l.BudgetMonth} {
		if usd == "" {
			continue
		}
		budget, err := pricing.ParseBudget(string(usd))
		if err == nil && budget == 0 {
			err = errors.New("a budget of 0 would refuse every request")
		}
		if err != nil {
			return caps, fmt.Errorf("limit for scope %q id %q: %s: %v", l.Scope, l.ID, limiter.BudgetPeriod(p).CapName(), err)
		}
		caps.Budgets.Max[p] = budget
	}
	switch {
	case l.Rate == "" && l.Burst == 0 && l.Cost == 0:
		return caps, nil
	case l.Rate == "":
		return caps, fmt.Errorf("limit for scope %q id %q: a token bucket needs a rate (tokens per second) with its burst", l.Scope, l.ID)
	case l.Burst == 0:
		return caps, fmt.Errorf("limit for scope %q id %q: a token bucket needs a burst (its capacity) with its rate", l.Scope, l.ID)
	case l.Burst > limiter.MaxBurst:
		return caps, fmt.Errorf("limit for scope %q id %q: burst %d is above the largest, %d", l.Scope, l.ID, l.Burst, limiter.MaxBurst)
	case l.Cost > l.Burst:
		return caps, fmt.Errorf("limit for scope %q id %q: cost %d is above the burst %d, so no request would ever be admitted", l.Scope, l.ID, l.Cost, l.Burst)
	}
	rate, err := limiter.ParseRate(string(l.Rate))
	if err != nil {
		return caps, fmt.Errorf("limit for scope %q id %q: %v", l.Scope, l.ID, err)
	}
	caps.Bucket = limiter.TokenBucket{Rate: rate, Burst: l.Burst, Cost: max(l.Cost, 1), RateText: string(l.Rate)}
	return caps, nil
}

// Cleanup gives the store back; it tolerates a Provision that failed half way.
func (h *Handler) Cleanup() error {
	liveHandlers.remove(h)
	if h.release == nil {
		return nil
	}
	err := h.release()
	h.release = nil
	return err
}

// liveHandlers are the provisioned handlers of every loaded config, which the
// admin API's live view reads.
var liveHandlers handlerSet

type handlerSet struct {
	mu       sync.Mutex
	handlers map[*Handler]struct{}
}

func (s *handlerSet) add(h *Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.handlers == nil {
		s.handlers = make(map[*Handler]struct{})
	}
	s.handlers[h] = struct{}{}
}

func (s *handlerSet) remove(h *Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.handlers, h)
}

// all returns the live handlers.
func (s *handlerSet) all() []*Handler {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Handler, 0, len(s.handlers))
	for h := range s.handlers {
		out = append(out, h)
	}
	return out
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
