package ratelimit

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
)

// answer is one of the handler's own answers, to a request it does not pass
// on: a refusal, by a limit or of a request it cannot count, or a failure
// of the store. Every answer goes through Handler.answer, which applies the
// outcome, the placeholders, the metrics, the headers, on_refusal and the
// dialect once, so that a new kind of refusal is one new value.
type answer struct {
	outcome   string
	status    int
	message   string
	typ, code string // OpenAI's error type and code; the other dialects derive theirs from status
	// scope is the refusing scope's name, for the placeholder; "" for none.
	scope string
	// kind, window and capacity describe a refusal by a limit: its kind
	// (requests, …, too_large, concurrency, budget), window and cap, for the
	// placeholders, the metric and the debug log; kind is "" for any other
	// answer.
	kind, window string
	capacity     string // the cap: a number, or a budget in dollars
	id           string // the refusing limit's id as stored, for the debug log
	requested    int64  // a too-large request's reservation, for the debug log
	// retryMillis is the wait the answer announces (Retry-After,
	// retry-after-ms, Google's RetryInfo); 0: none.
	retryMillis int64
	headers     headerSet
	noRetry     bool // x-should-retry: false, which OpenAI's and Anthropic's SDKs obey
	quota       bool // a spent budget: each dialect's quota error (dialect.go)
	tooLarge    bool // a request no wait would admit (dialect.go)
	closeConn   bool // the rest of the request's body is not wanted
	// failure is not a refusal: on_refusal does not apply to it.
	failure bool
	// clientGone: the client went away; nothing is answered, and the
	// request ends as reverse_proxy ends it (499).
	clientGone bool
}

// The placeholders the Handler's doc lists, set on the requests a limit
// applies to.
const (
	placeholderOutcome       = "http.rolter_ratelimit.outcome" // the outcomes of metrics.go
	placeholderRefusedScope  = "http.rolter_ratelimit.refused_scope"
	placeholderRefusedKind   = "http.rolter_ratelimit.refused_kind"   // kind.String()
	placeholderRefusedWindow = "http.rolter_ratelimit.refused_window" // minute or day, a budget's day or month; "" for a bucket or a concurrency cap
	placeholderRefusedLimit  = "http.rolter_ratelimit.refused_limit"
	placeholderRetryAfter    = "http.rolter_ratelimit.retry_after" // seconds, on an answer that announces a wait
	placeholderModel         = "http.rolter_ratelimit.model"
	placeholderAPIKey        = "http.rolter_ratelimit.api_key"
	placeholderWaitedMillis  = "http.rolter_ratelimit.waited_ms"
)

// answer writes a, or hands it to handle_errors (on_refusal error).
func (h *Handler) answer(w http.ResponseWriter, req *request, a answer) error {
	if a.clientGone {
		return caddyhttp.Error(499, errors.New(a.message))
	}
	setOutcome(req.repl, a.outcome)
	if a.scope != "" {
		req.repl.Set(placeholderRefusedScope, a.scope)
	}
	hdr := w.Header()
	if a.kind != "" {
		refusalsTotal.WithLabelValues(a.scope, a.kind, a.window, "false").Inc()
		h.tally(req.top, limiter.TopRefusals, 1)
		req.repl.Set(placeholderRefusedKind, a.kind)
		req.repl.Set(placeholderRefusedWindow, a.window)
		req.repl.Set(placeholderRefusedLimit, a.capacity)
		if h.logger.Core().Enabled(zap.DebugLevel) {
			h.logger.Debug("refused", zap.String("scope", a.scope), zap.String("id", a.id), zap.String("kind", a.kind), zap.String("window", a.window),
				zap.Int64("retry_after_ms", a.retryMillis), zap.Int64("requested", a.requested))
		}
	}
	a.headers.apply(hdr)
	if a.retryMillis > 0 {
		seconds := limiter.CeilSeconds(a.retryMillis, 1)
		req.repl.Set(placeholderRetryAfter, seconds)
		hdr.Set("Retry-After", strconv.FormatInt(seconds, 10))
		hdr.Set("Retry-After-Ms", strconv.FormatInt(a.retryMillis, 10))
	}
	if a.noRetry {
		hdr.Set("X-Should-Retry", "false")
	}
	if a.closeConn || req.awaitsContinue() {
		hdr.Set("Connection", "close")
	}
	if h.OnRefusal == "error" && !a.failure {
		return caddyhttp.Error(a.status, errors.New(a.message))
	}
	return req.dia.write(w, errorAnswer{status: a.status, message: a.message, typ: a.typ, code: a.code, scope: a.scope, retryMillis: a.retryMillis, quota: a.quota, tooLarge: a.tooLarge})
}

// setOutcome records an admission's outcome in the placeholder and the metrics.
func setOutcome(repl *caddy.Replacer, outcome string) {
	r, ok := outcomeRecords[outcome]
	if !ok { // an outcome left out of outcomeRecords costs what it did before it
		r = outcomeRecord{placeholder: outcome, admissions: admissionsTotal.WithLabelValues(outcome)}
	}
	repl.Set(placeholderOutcome, r.placeholder)
	r.admissions.Inc()
}

// awaitsContinue reports a request whose client still waits for 100
// Continue to send its body: the handler answers it without having read the
// body. The connection then closes after the answer: Go's server would
// otherwise wait to discard a body that never comes, as Caddy's own wrapper
// of the body hides from it that the client waits.
func (req *request) awaitsContinue() bool {
	if _, read := req.Body.(*heldBody); read {
		return false
	}
	return req.ContentLength != 0 && strings.EqualFold(req.Header.Get("Expect"), "100-continue")
}

// limitRefusal is the answer to a request a limit refused: 429 (or status),
// naming the first refusing scope and its cap, never its id, with the wait
// until every refusing limit would admit it; a concurrency cap knows no
// wait, and then none is announced: the clients' SDKs back off on their own.
// A wait longer than maxSDKRetryWait comes with x-should-retry false. A
// spent budget is each dialect's quota error.
func (h *Handler) limitRefusal(req *request, a limiter.Admission) answer {
	ref, l := a.Refusal, a.Limits[a.Refusal.First]
	retryMillis := max(ref.WaitMillis, 1)
	if !ref.KnowsWait() {
		retryMillis = 0
	}
	ans := answer{
		outcome: outcomeRefused, status: cmp.Or(h.Status, req.dia.limitStatus(ref.Kind == limiter.Budget, false)), message: refusalMessage(ref, a.Limits, a.Reserve.Cost),
		typ: ref.Kind.ErrorType(), code: "rate_limit_exceeded",
		scope: l.Scope, kind: ref.Kind.String(), window: ref.WindowName(), capacity: strconv.FormatInt(ref.Capacity, 10), id: l.ID,
		retryMillis: retryMillis, headers: h.families(req.dia).headersFor(a.Limits, a.Decision, false),
		noRetry: retryMillis > maxSDKRetryWait,
	}
	if ref.Kind == limiter.Budget {
		ans.code, ans.capacity, ans.quota = "insufficient_quota", pricing.FormatUSD(ref.Capacity), true
	}
	if ref.Floor > 0 {
		ans.message = h.floorMessage(ref, l) + retryText(ref)
	}
	return ans
}

// maxSDKRetryWait is the longest wait, in milliseconds, after which a
// refusal still lets the SDKs retry on their own: past it, the OpenAI SDKs
// ignore Retry-After and retry at once on their own backoff (refused
// again), and the Anthropic SDKs sleep out the whole wait, days if need be,
// before their retry: both obey x-should-retry false instead.
const maxSDKRetryWait = 60_000

// tooLarge is the answer to a request whose reservation alone exceeds a
// window of its chain: no wait would admit it, so it says so as OpenAI does
// ("Request too large"), with x-should-retry false and no Retry-After.
// Nothing is charged; its headers are the chain's as they stand, when the
// store can read them.
func (h *Handler) tooLarge(req *request, chain []limiter.Limit, over tooLargeFor, reserve limiter.TokenCounts) answer {
	l, k := chain[over.limit], over.window
	capacity, requested := l.Windows[k], reserve.Of(k.Kind())
	a := answer{
		outcome: outcomeRefused, status: cmp.Or(h.Status, req.dia.limitStatus(false, true)),
		message: fmt.Sprintf("Request too large for %s on %s per %s (%s): Limit %d, Requested %d. The input or output tokens must be reduced in order to run successfully.",
			l.Scope, k.Noun(), limiter.Spans[k.Span()].Per, k.Unit(), capacity, requested),
		typ: limiter.TooLarge.ErrorType(), code: "rate_limit_exceeded",
		scope: l.Scope, kind: limiter.TooLarge.String(), window: limiter.Spans[k.Span()].Name, capacity: strconv.FormatInt(capacity, 10), id: l.ID, requested: requested,
		noRetry: true, tooLarge: true,
	}
	if over.overBudget {
		p := over.budget
		capacity, requested = l.Budgets.Max[p], reserve.Cost
		a.message = fmt.Sprintf("Request too large for the budget of %s per %s: Budget $%s, largest cost of this request $%s. The input or output tokens (max_tokens) must be reduced in order to run successfully.",
			l.Scope, p, pricing.FormatUSD(capacity), pricing.FormatUSD(requested))
		a.window, a.capacity, a.requested = p.String(), pricing.FormatUSD(capacity), requested
	}
	if families := h.families(req.dia); families.any() {
		if d, err := h.store.Peek(req.Context(), chain); err == nil {
			a.headers = families.headersFor(chain, d, false)
		}
	}
	return a
}

// missingScope is the answer to a request whose value for a required scope
// is empty, as Spring Cloud Gateway's denyEmptyKey: 403, naming the scope.
func missingScope(scope string) answer {
	return answer{outcome: outcomeRefusedEmptyScope, status: http.StatusForbidden, scope: scope,
		message: fmt.Sprintf("This request has no value for the rate limit scope %q, which this gateway requires.", scope),
		typ:     "invalid_request_error", code: "rate_limit_scope_missing"}
}

// badLimit is the answer to a request whose cap per request, cap of a limit
// of scope, is missing or not valid and has no fallback: 503, before any
// store call, never unlimited; logged at warn, naming the scope and the
// cap, never the id.
func (h *Handler) badLimit(scope, cap string) answer {
	h.badLimitWarn.log(h.logger, "a cap that comes with the request is missing or not valid, and its limit has no fallback (else); refusing with 503",
		zap.String("scope", scope), zap.String("cap", cap))
	return answer{outcome: outcomeRefusedBadLimit, status: http.StatusServiceUnavailable, scope: scope,
		message: fmt.Sprintf("The rate limit of %s cannot be read for this request: its %s comes with each request, and this one's is missing or not valid.", scope, cap),
		typ:     "server_error", code: "rate_limit_unreadable"}
}

// ambiguousScope is the answer to a request that sends what scope reads in
// a way the upstream may read otherwise (what says how, naming headers,
// never their values): 400.
func ambiguousScope(scope, what string) answer {
	return answer{outcome: outcomeRefusedAmbiguousScope, status: http.StatusBadRequest, scope: scope,
		message: fmt.Sprintf("This request sends %s; the rate limit scope %q must read one value, the one the API reads.", what, scope),
		typ:     "invalid_request_error", code: "rate_limit_scope_ambiguous"}
}

// noPrice is the answer to a request under a budget whose model has no
// price: 400, before any store call, naming the model (the request's own).
// It is never let through at $0, and retrying does not help: the SDKs do
// not retry a 400.
func noPrice(model string) answer {
	asked := fmt.Sprintf("the model %q", model)
	if model == "" {
		asked = "a request that names no model"
	}
	return answer{outcome: outcomeRefusedNoPrice, status: http.StatusBadRequest,
		message: fmt.Sprintf("This gateway has no price for %s, and a spend budget applies to this request: it cannot be counted, so it is refused.", asked),
		typ:     "invalid_request_error", code: "model_not_priced"}
}

// modelUnread is the answer to a request under a budget whose body names
// its model but could not be read wholly: 400, as noPrice.
func modelUnread() answer {
	a := noPrice("")
	a.message = "This gateway cannot read which model this request asks for (its body is compressed, not JSON, or over 4 MiB), and a spend budget applies to it: it cannot be counted, so it is refused."
	return a
}

// bodyRefusal is the answer to a request whose body could not be read:
// one that found no room under body_memory gets 503 with a wait of a
// second, and the rest of its body is not wanted; one whose client went
// away meanwhile ends as reverse_proxy ends it (499). Neither is admitted
// unreserved.
func (h *Handler) bodyRefusal(err error) answer {
	if !errors.Is(err, errBodyMemory) {
		return answer{message: err.Error(), clientGone: true}
	}
	h.bodyWarn.log(h.logger, "request bodies being read hold all of body_memory; refusing requests with 503", zap.Error(err))
	return answer{outcome: outcomeRefusedBodyMemory, status: http.StatusServiceUnavailable,
		message: "The gateway is reading too many request bodies at once; please retry shortly.",
		typ:     "server_error", code: "request_body_memory_exhausted", retryMillis: 1000, closeConn: true}
}

// unmeteredSession is the answer to a WebSocket session over HTTP/2 or
// HTTP/3 whose chain meters tokens or spend: its frames cannot be metered
// (isExtendedConnect), and a session charged nothing is never let through.
var unmeteredSession = answer{outcome: outcomeRefusedUnmetered, status: http.StatusBadRequest,
	message: "This realtime session comes over HTTP/2 or HTTP/3, whose WebSocket frames this gateway cannot meter, and a token limit or a spend budget applies to it: open it over HTTP/1.1.",
	typ:     "invalid_request_error", code: "rate_limit_session_unmetered"}

// connectionsRefused is the answer to a WebSocket session over realtime
// max_connections: 503, without an rpm slot taken.
var connectionsRefused = answer{outcome: outcomeRefusedConnections, status: http.StatusServiceUnavailable,
	message: "Too many realtime sessions are open on this gateway; please retry shortly.", typ: "connections", code: "connection_limit_exceeded"}

// storeUnavailable is the answer of on_redis_error deny.
var storeUnavailable = answer{outcome: outcomeFailedClosed, status: http.StatusServiceUnavailable,
	message: "The rate limiter is unavailable; please retry shortly.", typ: "server_error", code: "rate_limiter_unavailable", failure: true}

// refusalMessage names the scope and the cap, never the id, and the wait when it
// is known. A budget that still has money, but less than what the request
// may cost (cost, its reservation), says both: the client may ask for less.
func refusalMessage(r limiter.Refusal, chain []limiter.Limit, cost int64) string {
	scope := chain[r.First].Scope
	var reached string
	switch r.Kind {
	case limiter.Budget:
		l := chain[r.First]
		renews := time.UnixMilli(r.RenewsAt).In(l.Budgets.Calendar.Location).Format(time.RFC3339)
		if left := r.Capacity - r.Used; left > 0 && cost > left {
			return fmt.Sprintf("Not enough budget left for %s: this request may cost up to $%s; $%s is left of $%s per %s. Ask for fewer tokens (max_tokens), or try again once it renews at %s (%s).",
				scope, pricing.FormatUSD(cost), pricing.FormatUSD(left), pricing.FormatUSD(r.Capacity), r.Period, renews, l.Budgets.Calendar.Name)
		}
		return fmt.Sprintf("Budget reached for %s: $%s per %s, of which $%s is spent or reserved. It renews at %s (%s); please try again then.",
			scope, pricing.FormatUSD(r.Capacity), r.Period, pricing.FormatUSD(r.Used), renews, l.Budgets.Calendar.Name)
	case limiter.Concurrency:
		reached = fmt.Sprintf("Concurrency limit reached for %s: %d requests in flight.", scope, r.Capacity)
	case limiter.Provider:
		reached = fmt.Sprintf("The provider's own quota is reached for %s: a quota of %d, as the provider last reported it.", scope, r.Capacity)
		if r.Capacity == 0 {
			reached = fmt.Sprintf("The provider's own quota is reached for %s: the provider refused a request and asked for a wait.", scope)
		}
	case limiter.Burst:
		b := chain[r.First].Bucket
		reached = fmt.Sprintf("Rate limit reached for %s: burst capacity %d, refilled at %s per second; a request takes %d.",
			scope, b.Burst, b.RateText, b.Cost)
	default:
		reached = fmt.Sprintf("Rate limit reached for %s: limit %d %s (%s per %s).",
			scope, r.Capacity, r.Window.Unit(), r.Window.Noun(), limiter.Spans[r.Window.Span()].Name)
	}
	return reached + retryText(r)
}

// retryText tells when to retry after the refusal r.
func retryText(r limiter.Refusal) string {
	if !r.KnowsWait() {
		return " Please try again once a request in flight has ended."
	}
	return fmt.Sprintf(" Please try again in %ds.", r.RetryAfterSeconds())
}
