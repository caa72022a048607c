package ratelimit

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

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
// never cuts off a response.
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
// as one. (An HTTP/2 WebSocket, an extended CONNECT, has no connection to
// hijack: it is admitted as an ordinary request and not metered.)
func isWebSocketHandshake(r *http.Request) bool {
	return r.Method == http.MethodGet && r.ProtoMajor == 1 && strings.EqualFold(r.Header.Get("Upgrade"), "websocket") &&
		headerHasToken(r.Header, "Connection", "upgrade")
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
	chain, _, refused := h.resolve(req)
	if refused != nil {
		return h.answer(w, req, *refused)
	}
	if len(chain) == 0 {
		return next.ServeHTTP(w, req.Request)
	}
	var price *pricing.Entry
	if hasBudgets(chain, true) {
		// The Realtime API names the session's model in the query.
		if price, refused = h.price(chain, req.URL.Query().Get("model")); refused != nil {
			return h.answer(w, req, *refused)
		}
	}
	return h.admitOrAnswer(w, req, chain, tokenCounts{}, chainMetersTokens(chain), next, func(rw *responseWriter, d decision) error {
		removeDeflateOffer(req.Header)
		rw.tap = usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{}))
		stop := h.meterSession(rw.tap, chain, price)
		defer func() {
			stop()
			if rw.wroteHeader { // a final status: no switch of protocols
				h.store.hold()
				h.meterResponse(rw, chain, d, price)
			}
		}()
		return next.ServeHTTP(rw, req.Request)
	})
}

// meterSession charges a session's tokens, and with a price what they cost,
// every flush interval and once more when the returned stop is called at
// the session's end, and then releases the store that ServeHTTP held for
// it: a session outlives config reloads.
func (h *Handler) meterSession(tap *usage.RealtimeTap, chain []limit, price *pricing.Entry) (stop func()) {
	done := make(chan struct{})
	go func() {
		defer h.store.release()
		t := time.NewTicker(h.flushInterval())
		defer t.Stop()
		var clamped int64
		for {
			select {
			case <-t.C:
				clamped = h.chargeTaken(tap, chain, price, clamped)
			case <-done:
				h.chargeTaken(tap, chain, price, clamped)
				if n := tap.Unmetered(); n > 0 {
					unmeteredTotal.WithLabelValues("realtime_message").Add(float64(n))
					h.logger.Debug("realtime messages not metered", zap.Int64("messages", n), zap.String("scope", chain[0].scope), zap.String("id", chain[0].id))
				}
				return
			}
		}
	}()
	return func() { close(done) }
}

// chargeTaken charges what the session's responses reported since the last
// take, and counts the responses the tap clamped since clamped of them.
func (h *Handler) chargeTaken(tap *usage.RealtimeTap, chain []limit, price *pricing.Entry, clamped int64) int64 {
	h.chargeSession(chain, tokensOf(tap.Take(), price), price)
	n := tap.Clamped()
	if n > clamped {
		h.usageClamped(chain, "realtime_response", n-clamped)
	}
	return n
}
