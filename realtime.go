package ratelimit

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/llmapi"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
	"github.com/rolter/caddy-ratelimit/internal/tokenest"
	"github.com/rolter/caddy-ratelimit/internal/usage"
)

// RealtimeConfig configures WebSocket sessions. Realtime sessions (a
// WebSocket upgrade, such as OpenAI's /v1/realtime) go through the same admission as any request: one request against rpm,
// refused while a token window is full. Before that, a process-wide cap on open
// sessions is checked, so that a session the gateway would refuse anyway
// never takes an rpm slot. While a session lives, the frames the upstream
// sends are read for each finished response's usage (a usage.RealtimeTap, fed
// by realtime_tap.go), which is charged every flush interval and once more
// when the session ends. A full window never closes a live session, as it
// never cuts off a response. Under a budget, what the client sends goes
// through the session's gate (realtime_gate.go): once a budget is spent, the
// events that make the model respond are refused, and the session goes on.
type RealtimeConfig struct {
	// MaxConnections caps the WebSocket sessions open at once through every
	// rolter_ratelimit handler of this Caddy process, limited or not; the
	// count is kept across config reloads. 0 or absent: no cap.
	MaxConnections int64 `json:"max_connections,omitempty"`
	// FlushInterval is how often a live session's tokens are charged.
	// Default 5s.
	FlushInterval caddy.Duration `json:"flush_interval,omitempty"`
}

const defaultFlushInterval = 5 * time.Second

func (c *RealtimeConfig) validate() error {
	if c.MaxConnections < 0 {
		return errors.New("realtime max_connections must not be negative")
	}
	if c.FlushInterval < 0 {
		return errors.New("realtime flush_interval must not be negative")
	}
	return nil
}

// openSessions counts the WebSocket sessions of this process.
var openSessions atomic.Int64

// openSession takes a session slot unless max (0: none) are open.
func openSession(max int64) bool {
	for {
		n := openSessions.Load()
		if max > 0 && n >= max {
			return false
		}
		if openSessions.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func closeSession() { openSessions.Add(-1) }

func (h *Handler) maxConnections() int64 {
	if h.Realtime == nil {
		return 0
	}
	return h.Realtime.MaxConnections
}

func (h *Handler) flushInterval() time.Duration {
	if h.Realtime == nil || h.Realtime.FlushInterval <= 0 {
		return defaultFlushInterval
	}
	return time.Duration(h.Realtime.FlushInterval)
}

// isWebSocketHandshake reports an HTTP/1.1 WebSocket opening handshake: a
// GET asking to upgrade to websocket (RFC 6455 4.1, as reverse_proxy reads
// it). Any other request with upgrade headers is an ordinary request, reserved and metered
// as one.
func isWebSocketHandshake(r *http.Request) bool {
	return r.Method == http.MethodGet && r.ProtoMajor == 1 && strings.EqualFold(r.Header.Get("Upgrade"), "websocket") &&
		headerHasToken(r.Header, "Connection", "upgrade")
}

// isExtendedConnect reports a WebSocket over HTTP/2 or HTTP/3 (RFC 8441,
// RFC 9220): a CONNECT whose :protocol is websocket, which reverse_proxy
// passes upstream as an HTTP/1.1 handshake. It is a session, but its
// frames travel in the request's body and the response's, with no
// connection to hijack, which the session's tap and budget gate read: a
// chain that meters tokens or spend refuses it (unmeteredSession).
func isExtendedConnect(r *http.Request) bool {
	return r.Method == http.MethodConnect &&
		(r.ProtoMajor == 2 && r.Header.Get(":protocol") == "websocket" || r.ProtoMajor == 3 && r.Proto == "websocket")
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// removeDeflateOffer drops permessage-deflate from the extensions the client
// offers, so that the upstream sends uncompressed frames the tap can read.
// Keys are compared case-insensitively: not every writer canonicalizes them.
func removeDeflateOffer(h http.Header) {
	for key, values := range h {
		if !strings.EqualFold(key, "Sec-WebSocket-Extensions") {
			continue
		}
		var kept []string
		for _, v := range values {
			for ext := range strings.SplitSeq(v, ",") {
				name, _, _ := strings.Cut(ext, ";")
				if !strings.EqualFold(strings.TrimSpace(name), "permessage-deflate") {
					kept = append(kept, strings.TrimSpace(ext))
				}
			}
		}
		if len(kept) == 0 {
			delete(h, key)
		} else {
			h[key] = []string{strings.Join(kept, ", ")}
		}
	}
}

// sessionModel is the model a session's URL names, which the upstream
// serves it: its model parameter (OpenAI's, and Azure OpenAI's v1 API's),
// or on Azure OpenAI its deployment parameter or the deployment its path
// names. A URL that names it more than once, or whose query the limiter
// cannot read as every server would (a pair with a ';', which some split
// at, or a bad escape), is ambiguous (what says how): the upstream may read
// a model the limiter did not.
func sessionModel(r *http.Request, call llmapi.Call) (model, ambiguous string) {
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return "", "a query the limiter cannot read (a ';' or a bad escape in it)"
	}
	named := query["model"]
	if call.Azure {
		named = append(named, query["deployment"]...)
		if call.Model != "" {
			named = append(named, call.Model)
		}
	}
	if len(named) > 1 {
		return "", "its model more than once in its URL"
	}
	if len(named) == 1 {
		model = named[0]
	}
	return model, ""
}

// serveSession admits a WebSocket session as a request without a body,
// once it has a slot under max_connections (checked first, so that a
// session refused here takes no rpm slot), and meters the frames of an
// admitted one once the upstream switches protocols. An upstream that
// answers otherwise (an error, or a plain response) has its answer metered
// as any response's.
func (h *Handler) serveSession(w http.ResponseWriter, req *request, next caddyhttp.Handler) error {
	if !openSession(h.maxConnections()) {
		return h.answer(w, req, connectionsRefused)
	}
	defer closeSession() // ServeHTTP returns when the session is over
	model, ambiguous := sessionModel(req.Request, req.call)
	if ambiguous != "" && h.readsModel {
		return h.answer(w, req, ambiguousScope(placeholderModel, ambiguous))
	}
	req.call.Model = model
	chain, _, refused := h.resolve(req)
	if refused != nil {
		return h.answer(w, req, *refused)
	}
	if len(chain) == 0 {
		return next.ServeHTTP(w, req.Request)
	}
	if isExtendedConnect(req.Request) && chainMetersTokens(chain) {
		return h.answer(w, req, unmeteredSession)
	}
	var price *pricing.Entry
	if limiter.HasBudgets(chain, true) {
		if ambiguous != "" {
			return h.answer(w, req, ambiguousScope(placeholderModel, ambiguous))
		}
		if price, refused = h.price(chain, model); refused != nil {
			return h.answer(w, req, *refused)
		}
	}
	return h.admitOrAnswer(w, req, chain, limiter.TokenCounts{}, chainMetersTokens(chain), next, func(rw *responseWriter, d limiter.Decision) error {
		removeDeflateOffer(req.Header)
		s := &realtimeSession{h: h, tap: usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{})), chain: chain, price: price, model: modelLabel(price, req.modelEntry), top: req.top}
		s.gate = newSessionGate(req.Context(), s)
		rw.session = s
		stop := s.meter()
		defer func() {
			stop()
			if rw.wroteHeader { // a final status: no switch of protocols
				h.store.Hold()
				h.meterResponse(rw, chain, d, price)
			}
		}()
		return next.ServeHTTP(rw, req.Request)
	})
}

// realtimeSession is the metering of an admitted session: the usage its
// tap reads is charged to its chain, and with a price what it costs.
type realtimeSession struct {
	h     *Handler
	tap   *usage.RealtimeTap
	chain []limiter.Limit
	price *pricing.Entry
	model string       // the model label of its token metrics (modelLabel)
	gate  *sessionGate // with budgets: what the client may send
	top   []limiter.TopID

	mu      sync.Mutex // one charge at a time: by the flush interval, or by the gate
	clamped int64      // the responses the tap had clamped at the last charge
}

// meter charges the session's tokens, and with a price what they cost,
// every flush interval and once more when the returned stop is called at
// the session's end, and then releases the store that ServeHTTP held for
// it: a session outlives config reloads.
func (s *realtimeSession) meter() (stop func()) {
	done := make(chan struct{})
	go func() {
		defer s.h.store.Release()
		t := time.NewTicker(s.h.flushInterval())
		defer t.Stop()
		for {
			select {
			case <-t.C:
				s.flush()
			case <-done:
				s.flush()
				if n := s.tap.Unmetered(); n > 0 {
					unmeteredTotal.WithLabelValues("realtime_message").Add(float64(n))
					s.h.logger.Debug("realtime messages not metered", zap.Int64("messages", n), zap.String("scope", s.chain[0].Scope), zap.String("id", s.chain[0].ID))
				}
				return
			}
		}
	}()
	return func() { close(done) }
}

// flush charges what the session's responses reported since the last
// flush, waiting for the store, and counts the responses the tap clamped
// since.
func (s *realtimeSession) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.h.chargeSession(s.chain, tokensOf(s.tap.Take(), s.price), s.price, s.model, s.top)
	if n := s.tap.Clamped(); n > s.clamped {
		s.h.usageClamped(s.chain, "realtime_response", n-s.clamped)
		s.clamped = n
	}
}
