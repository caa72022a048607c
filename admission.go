package ratelimit

import (
	"errors"
	"net/http"
	"net/textproto"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/llmapi"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
	"github.com/rolter/caddy-ratelimit/internal/tokenest"
)

// request is what the handler reads of a request before its body: where to
// set placeholders, the API its path calls (llmapi, the one classifier)
// and the dialect the handler answers it in; and the writer of its answer,
// whose read deadline ends the read of its body (body.go).
type request struct {
	*http.Request
	w    http.ResponseWriter
	repl *caddy.Replacer
	call llmapi.Call
	dia  dialect
	held *heldBody // the memory of its body as read (body.go), given back at the latest when the request ends
	// unreadableShadow is the scope of the first shadow limit whose cap
	// per request the request did not give validly: the limit is left out
	// of its chain, and the request is marked as that limit would refuse it.
	unreadableShadow string
	// session: a WebSocket handshake, whose model is the one its URL
	// names (call.Model, set by serveSession), never its body's.
	session bool
	// modelEntry is the configured id of its chain's first limit of a
	// scope whose value is the model (modelLabel).
	modelEntry string
	// top are its ids of the scopes whose top consumers are tallied.
	top []limiter.TopID
}

// newRequest is a value, which the handler's calls take by pointer: it
// stays on ServeHTTP's stack.
func (h *Handler) newRequest(w http.ResponseWriter, r *http.Request) request {
	call := llmapi.Of(r.URL.Path)
	return request{Request: r, w: w, repl: r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer), call: call, dia: dialectOf(h.Dialect, call)}
}

// ServeHTTP admits or refuses the request, then passes it on. Its steps:
//
//  1. A WebSocket handshake is a session (serveSession).
//  2. The chain (resolve): what the scopes read must be what the upstream
//     reads, the body is read first only when a scope names the model, and
//     a required scope must have a value.
//  3. The body, once the chain needs it (its token caps) and the store has
//     not already refused it for a reason no body changes.
//  4. The reservation (or too large), the admission: refuse, fail, or pass
//     on, the response metered by the writer that wraps it (admitted), and
//     the slots it takes freed when it ends.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	request := h.newRequest(w, r)
	req := &request
	if isWebSocketHandshake(r) || isExtendedConnect(r) {
		req.session = true
		return h.serveSession(w, req, next)
	}
	defer func() { req.held.release() }()
	chain, body, refused := h.resolve(req)
	if refused != nil {
		return h.answer(w, req, *refused)
	}
	if len(chain) == 0 {
		h.shadowRefused(w, req, chain, limiter.Decision{})
		return next.ServeHTTP(w, r)
	}
	m, refused := h.prepareMetering(req, chain, body)
	if refused != nil {
		return h.answer(w, req, *refused)
	}
	return h.admitOrAnswer(w, req, chain, m.reserve, m.meters, next, func(rw *responseWriter, d limiter.Decision) error {
		return h.passMetered(rw, req, next, chain, d, m)
	})
}

// metering is what a request is admitted with and its response metered
// at: whether its chain caps tokens or spend, its body, its estimate, its
// reservation and, under a budget, its model's price.
type metering struct {
	meters  bool // the chain caps tokens or spend
	body    requestBody
	est     tokenest.Estimate
	reserve limiter.TokenCounts
	price   *pricing.Entry
}

// prepareMetering reads what a chain that caps tokens or spend needs of the
// request before its admission: its body (unless the store has already
// refused it for a reason no body changes), its model's price, its
// estimate and its reservation; or the answer that refuses it.
func (h *Handler) prepareMetering(req *request, chain []limiter.Limit, body requestBody) (m metering, refused *answer) {
	m = metering{meters: chainMetersTokens(chain), body: body}
	if !m.meters {
		return m, nil
	}
	if !h.readsModel && readable(req) {
		// Asked only when there is a body worth sparing: the admission
		// consults the same record of refusals.
		if a, refused := h.peekIfWorthSparing(req, chain); refused {
			if _, waits := h.waitFor(a.Refusal, 0); !waits {
				return m, new(h.limitRefusal(req, a))
			}
		}
		var err error
		if m.body, err = readRequestBody(req, h.bodyMemory()); err != nil {
			return m, new(h.bodyRefusal(err))
		}
	}
	if limiter.HasBudgets(chain, true) {
		if m.price, refused = h.priceOf(chain, req, m.body); refused != nil {
			return m, refused
		}
	}
	m.est = estimate(req.call, m.body)
	if h.reserving() {
		var over tooLargeFor
		if m.reserve, over = h.reservation(m.est, chain, m.price); over.limit >= 0 {
			return m, new(h.tooLarge(req, chain, over, m.reserve))
		}
	}
	return m, nil
}

// passMetered passes an admitted request on, its response metered by rw.
func (h *Handler) passMetered(rw *responseWriter, req *request, next caddyhttp.Handler, chain []limiter.Limit, d limiter.Decision, m metering) error {
	if h.EnsureStreamUsage == nil || *h.EnsureStreamUsage {
		rw.strip = requestStreamUsage(req, m.body.whole())
	}
	rw.asked, rw.model = m.est, modelLabel(m.price, req.modelEntry)
	tokensOfModel(rw.model).reserved.add(d.Reserve)
	if m.price != nil {
		spendReservedTotal.WithLabelValues(m.price.Name).Add(float64(d.Reserve.Cost))
	}
	// Deferred: reverse_proxy ends a response cut short (the client or the
	// upstream went away mid-stream) with panic(http.ErrAbortHandler), and
	// what was reported by then is still charged.
	defer h.meterResponse(rw, chain, d, m.price)
	err := next.ServeHTTP(rw, req.Request)
	rw.unreached = unreached(err)
	return err
}

// peekIfWorthSparing is the store's refusal of chain before the body is
// read, when the body is worth sparing.
func (h *Handler) peekIfWorthSparing(req *request, chain []limiter.Limit) (limiter.Admission, bool) {
	if !worthSparing(req.Request) {
		return limiter.Admission{}, false
	}
	return h.store.RefusedUnread(chain)
}

// priceOf is the price of the model of a request under budgets, as price
// says; a request whose model its body names but the limiter could not
// read wholly (compressed, not JSON, or longer than it reads) has no model
// it can be sure of: a later "model" key would win upstream, and a
// client could choose the price it is counted at. Nor has one whose body
// names it under two spellings of the key, which is refused with 400.
func (h *Handler) priceOf(chain []limiter.Limit, req *request, body requestBody) (*pricing.Entry, *answer) {
	if req.call.Model == "" && !body.complete && req.ContentLength != 0 {
		if limiter.HasBudgets(chain, false) {
			return nil, new(modelUnread())
		}
		return nil, nil
	}
	model, ambiguous := tokenest.Model(req.call, body.bytes)
	if !ambiguous {
		return h.price(chain, model)
	}
	for _, l := range chain {
		if limiter.HasBudgets([]limiter.Limit{l}, false) {
			return nil, new(ambiguousScope(l.Scope, twoModelKeys))
		}
	}
	return nil, nil // shadow budgets alone count only what they can price
}

// twoModelKeys says what a body that names its model under two spellings
// of the key sends (tokenest.Model): an upstream may read either.
const twoModelKeys = `its model under two spellings of the key "model" (as "model" and "MODEL")`

// modelScope is the name of the first scope whose value names the model.
func (h *Handler) modelScope() string {
	for _, s := range h.Scopes {
		if strings.Contains(s.Value, "{"+placeholderModel+"}") {
			return s.Name
		}
	}
	return ""
}

// price is the price of the model a request under budgets asks for, or
// the answer that refuses it when there is none: a budget never counts a
// request at $0 because its price is unknown. Shadow budgets, which
// refuse nothing, count only the requests they can price.
func (h *Handler) price(chain []limiter.Limit, model string) (*pricing.Entry, *answer) {
	e, ok := h.prices.Lookup(model)
	switch {
	case ok:
		return &e, nil
	case limiter.HasBudgets(chain, false):
		return nil, new(noPrice(model))
	}
	return nil, nil
}

// admitOrAnswer admits the request's chain with reserve. It answers a
// refusal or a store failure, and passes on an admitted request: one whose
// response it does not meter to next, and one it meters to pass, with the
// writer that wraps the response and the admission's decision. The slots
// an admitted request takes are freed once it has been passed on, however
// that ends (a deferred call: reverse_proxy ends a response cut short with
// a panic).
func (h *Handler) admitOrAnswer(w http.ResponseWriter, req *request, chain []limiter.Limit, reserve limiter.TokenCounts, metering bool, next caddyhttp.Handler, pass func(*responseWriter, limiter.Decision) error) error {
	a, err := h.admitWaiting(req, chain, reserve)
	switch {
	case errors.Is(err, errClientGone):
		return h.answer(w, req, answer{message: "the client went away while its request waited", clientGone: true})
	case errors.Is(err, errBodyMemory):
		return h.answer(w, req, h.bodyRefusal(err))
	case err != nil:
		return h.storeFailed(w, req, chain, err, next)
	case !a.Admitted:
		return h.answer(w, req, h.limitRefusal(req, a))
	}
	if limiter.HoldsSlots(chain) {
		defer h.store.Free(chain)
	}
	rw := h.admitted(w, req, chain, a.Decision, metering)
	if rw == nil {
		return next.ServeHTTP(w, req.Request)
	}
	if rw.learn != nil {
		defer rw.learn.end()
	}
	if !metering {
		return next.ServeHTTP(rw, req.Request)
	}
	return pass(rw, a.Decision)
}

// resolve finds the request's chain. What its scopes read must be what the
// upstream reads (a scope's header sent twice, or two credentials, is
// refused with 400), and a required scope must have a value (403). When a
// scope names the model, the body is read first (body), but for a session,
// whose model its URL names; a body that finds no room under body_memory is
// refused.
func (h *Handler) resolve(req *request) (chain []limiter.Limit, body requestBody, refused *answer) {
	if i := h.repeatedScopeHeader(req.Request); i >= 0 {
		return nil, body, new(ambiguousScope(h.Scopes[i].Name, "the header "+h.scopeHeaders[i]+" more than once"))
	}
	if h.readsAPIKey {
		key, ambiguous := credential(req)
		if ambiguous != "" {
			return nil, body, new(ambiguousScope(placeholderAPIKey, ambiguous))
		}
		req.repl.Set(placeholderAPIKey, key)
	}
	if h.readsModel {
		model := req.call.Model
		if !req.session {
			var err error
			if body, err = readRequestBody(req, h.bodyMemory()); err != nil {
				return nil, body, new(h.bodyRefusal(err))
			}
			var ambiguous bool
			if model, ambiguous = tokenest.Model(req.call, body.bytes); ambiguous {
				return nil, body, new(ambiguousScope(h.modelScope(), twoModelKeys))
			}
		}
		req.repl.Set(placeholderModel, model)
	}
	chain, refused = h.chain(req)
	return chain, body, refused
}

// chainMetersTokens reports whether a limit of chain caps a token window or
// a budget: the response's usage is then metered.
func chainMetersTokens(chain []limiter.Limit) bool {
	for _, l := range chain {
		if l.Meters() {
			return true
		}
	}
	return false
}

// chain resolves the request's limits, in chain order, with the caps that
// apply to the request, or refuses it: a required scope's value is empty
// (403), or a cap per request is missing or not valid and has no fallback
// (503). On Redis Cluster every key carries the hash tag of the chain's
// root: its outermost scope whose value is not empty, so that the whole
// chain is one slot. It also gathers the request's ids of the scopes whose
// top consumers are tallied (req.top), limited or not.
func (h *Handler) chain(req *request) (chain []limiter.Limit, refused *answer) {
	tag := ""
	if h.Redis != nil && len(h.Redis.Cluster) > 0 {
		for i, s := range slices.Backward(h.Scopes) {
			if v := h.scopeValue(i, req); v != "" {
				tag = limiter.ChainTag(s.Name, limiter.KeyID(s.Readable, v))
				break
			}
		}
	}
	chain = make([]limiter.Limit, 0, len(h.Scopes))
	for i, s := range h.Scopes {
		sl, limited := h.limits[s.Name]
		tallied := h.tallied != nil && h.tallied[i]
		if !limited && !s.Required && !tallied {
			continue
		}
		value := h.scopeValue(i, req)
		if value == "" {
			if s.Required {
				return nil, new(missingScope(s.Name))
			}
			continue
		}
		if !limited && !tallied {
			continue
		}
		stored := limiter.KeyID(s.Readable, value)
		if tallied {
			req.top = append(req.top, limiter.TopID{Scope: s.Name, ID: stored})
		}
		if !limited {
			continue
		}
		id, spec, _ := sl.resolve(value, stored)
		if spec == nil {
			continue
		}
		caps, carried, bad := spec.capsFor(req)
		switch {
		case bad != "" && spec.line.shadow:
			h.unreadableShadowLimit(req, s.Name, bad)
			continue
		case bad != "":
			return nil, new(h.badLimit(s.Name, bad))
		case carried != nil:
			lastCarried.note(s.Name, id, carried)
		}
		chain = append(chain, limiter.Limit{Scope: s.Name, ID: id, Caps: caps})
		if req.modelEntry == "" && s.Value == "{"+placeholderModel+"}" {
			req.modelEntry = spec.config.ID
		}
		if len(spec.floorClass.scopes) > 0 {
			chain[len(chain)-1].Class = spec.floorClass.of(h, req)
		}
	}
	limiter.TagPrefixes(tag, chain)
	return chain, nil
}

// scopeValue is the i-th scope's id for the request. A value that is one
// request header placeholder, as most are, is read from the header as Caddy's
// replacer reads it (the values joined by commas), without the replacer's
// allocations and lookups, which would be most of the handler's own work.
func (h *Handler) scopeValue(i int, req *request) string {
	if name := h.scopeHeaders[i]; name != "" {
		return strings.Join(req.Header[name], ",")
	}
	return req.repl.ReplaceAll(h.Scopes[i].Value, "")
}

// scopeHeader is the canonical name of the request header that value is
// exactly the placeholder of, or "".
func scopeHeader(value string) string {
	name, ok := strings.CutPrefix(value, "{http.request.header.")
	if !ok {
		return ""
	}
	name, ok = strings.CutSuffix(name, "}")
	if !ok || name == "" || strings.ContainsAny(name, "{}\\") {
		return ""
	}
	return textproto.CanonicalMIMEHeaderKey(name)
}

// storeFailed applies on_redis_error: deny answers 503; allow passes the
// request on unchecked, carrying, with headers scg, Spring Cloud Gateway's
// answer to a failed store: X-RateLimit-Remaining -1 beside the bucket's
// configuration. A request under a budget is answered 503 whatever
// on_redis_error says: spend that cannot be counted is never let through.
func (h *Handler) storeFailed(w http.ResponseWriter, req *request, chain []limiter.Limit, err error, next caddyhttp.Handler) error {
	if h.OnRedisError == "deny" {
		h.warn.log(h.logger, "rate limit store unavailable; refusing requests with 503 (on_redis_error deny)", zap.Error(err))
		return h.answer(w, req, storeUnavailable)
	}
	if limiter.HasBudgets(chain, false) {
		h.warn.log(h.logger, "rate limit store unavailable; refusing requests under a budget with 503 (their spend cannot be counted)", zap.Error(err))
		return h.answer(w, req, storeUnavailable)
	}
	h.warn.log(h.logger, "rate limit store unavailable; admitting requests unchecked (on_redis_error allow)", zap.Error(err))
	setOutcome(req.repl, outcomeFailedOpen)
	if hs := h.configuredFamilies.failedOpenHeaders(chain); len(hs.values) > 0 {
		hs.apply(w.Header())
		w = &responseWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, headers: hs}
	}
	return next.ServeHTTP(w, req.Request)
}
