package ratelimit

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
	"github.com/rolter/caddy-ratelimit/internal/tokenest"
	"github.com/rolter/caddy-ratelimit/internal/usage"
)

// responseWriter wraps the response of an admitted request. It sets the
// rate-limit headers again when the header is written (reverse_proxy adds the
// upstream's after this handler ran), and tees a successful body into a usage
// meter, so that the tokens the upstream reports are charged once the
// response has ended. The client's bytes pass through untouched and at once,
// except the usage chunk of a stream whose usage we asked for (streamusage.go).
type responseWriter struct {
	caddyhttp.ResponseWriterWrapper
	headers     headerSet
	metering    bool              // the chain has a token window: read the body's usage
	meter       *usage.Meter      // set by WriteHeader for a metered 2xx body: &meterState
	meterState  usage.Meter       // in the writer's own allocation
	strip       *usageStripper    // set when the client did not ask for stream usage
	asked       tokenest.Estimate // what the request asks of the model, which bounds its charge (usageCeiling)
	model       string            // the model label of its token metrics (modelLabel)
	session     *realtimeSession  // set for a metered WebSocket session
	learn       *learning         // set when a limit of the chain learns the provider's quota
	top         []limiter.TopID   // the request's ids whose top consumers are tallied
	wroteHeader bool
	unreached   bool // the handlers after this one failed without reaching the upstream (unreached)
	status      int  // the final status written, once wroteHeader
}

func (w *responseWriter) WriteHeader(status int) {
	if w.wroteHeader || status < 200 { // 1xx: informational, or a WebSocket's 101
		w.ResponseWriterWrapper.WriteHeader(status)
		return
	}
	w.wroteHeader, w.status = true, status
	h := w.Header()
	if w.learn != nil { // before this handler's own rate-limit headers replace the provider's
		w.learn.header(status, upstreamHeader{h, &w.headers})
	}
	w.headers.reapply(h)
	if w.metering && status < 300 {
		w.meter = &w.meterState
		w.meter.Start(h)
		if w.strip != nil && !w.strip.applies(h) {
			w.strip = nil
		}
		if w.strip != nil {
			// The body may come out shorter than the upstream's length
			// says: without one, it goes to the client chunked (or
			// delimited by the connection's close).
			h.Del("Content-Length")
		}
	} else {
		w.strip = nil
	}
	w.ResponseWriterWrapper.WriteHeader(status)
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.meter != nil {
		w.meter.Write(p)
	}
	if w.learn != nil {
		w.learn.read(p)
	}
	if w.strip != nil {
		return w.strip.write(&w.ResponseWriterWrapper, p)
	}
	return w.ResponseWriterWrapper.Write(p)
}

// ReadFrom goes through Write when the body is read, since the embedded
// ReadFrom writes straight to the underlying writer.
func (w *responseWriter) ReadFrom(r io.Reader) (int64, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.meter == nil && w.strip == nil && (w.learn == nil || w.learn.refusal == nil) {
		return w.ResponseWriterWrapper.ReadFrom(r)
	}
	return io.Copy(writerOnly{w}, r)
}

// Hijack hands reverse_proxy the client connection of a session, wrapped so
// that the frames it writes to the client are metered, and those the client
// sends go through the session's gate.
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(&w.ResponseWriterWrapper).Hijack()
	if err != nil || w.session == nil {
		return conn, brw, err
	}
	conn, brw = wrapHijacked(conn, brw, w.session.tap, w.session.gate)
	return conn, brw, nil
}

// writerOnly hides ReadFrom, so that io.Copy does not call back into it.
type writerOnly struct{ io.Writer }

// FlushError writes the header first, as a flush before any write commits it.
func (w *responseWriter) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(&w.ResponseWriterWrapper).Flush()
}

// finish ends the response: it writes what a stripper still holds and
// returns the usage the body reported, at most its ceiling (clamped says
// it was over), and whether that was its final report.
func (w *responseWriter) finish() (used usage.Usage, metered, final, clamped bool) {
	if w.strip != nil {
		// A client that went away is charged all the same: what the
		// upstream reported is metered below.
		_ = w.strip.flushTail(&w.ResponseWriterWrapper)
	}
	if w.meter == nil {
		return usage.Usage{}, false, false, false
	}
	u, metered := w.meter.Finish()
	u, clamped = u.Within(usageCeiling(w.asked))
	return u, metered, w.meter.Final(), clamped
}

// One response is charged at most a ceiling, so that one absurd report (an
// upstream's bug: 1e20 tokens) cannot lock every limit of its chain for
// days, shared pools included. Its input at most the largest context
// window a provider serves (or the request's estimate, if larger). Its
// output at most what the request caps itself at, its own cap times its
// choices, since every provider counts reasoning and thinking inside that
// cap; without one, several times the largest output a model generates in
// one response, for each choice (of at most maxResponseChoices: a larger n
// is refused by the providers). The total at most both together. A realtime
// session's responses are bounded alike, each, by the fixed ceiling.
const (
	maxResponseInput   = 10_000_000 // Llama 4 Scout's context window, the largest served
	maxResponseOutput  = 1_000_000  // the largest models write at most 128k tokens in one response
	maxResponseChoices = 128        // OpenAI's largest n; Gemini's candidateCount is at most 8, best_of 20
)

// usageCeiling is the most a response of a request of estimate est is
// charged, count by count; the zero estimate's is the fixed ceiling.
func usageCeiling(est tokenest.Estimate) usage.Usage {
	in, out := max(maxResponseInput, est.Input), est.Output
	if !est.Capped {
		out = maxResponseOutput * min(max(est.Choices, 1), maxResponseChoices)
	}
	return usage.Usage{Total: in + out, Input: in, Output: out}
}

// usageClamped counts n responses whose usage was over their ceiling, and
// warns, naming the chain's scopes only: their ids may be secrets.
func (h *Handler) usageClamped(chain []limiter.Limit, what string, n int64) {
	usageClampedTotal.WithLabelValues(what).Add(float64(n))
	scopes := make([]string, len(chain))
	for i, l := range chain {
		scopes[i] = l.Scope
	}
	h.usageWarn.log(h.logger, "an upstream reported more tokens than one response can use; charged at the ceiling",
		zap.String("what", what), zap.Strings("scopes", scopes), zap.Int64("responses", n))
}

// tokensOf is the tokens of u, and with a price (a chain with budgets),
// what they cost.
func tokensOf(u usage.Usage, price *pricing.Entry) limiter.TokenCounts {
	t := limiter.TokenCounts{Total: u.Total, Input: u.Input, Output: u.Output}
	if price != nil {
		t.Cost = costOf(price.Price, u)
	}
	return t
}

// admitted records an admission and wraps the response of the request it
// admits: the rate-limit headers of its families, set now and again when
// the header is written, and, when its chain caps tokens (metering), the
// metering of its body (the caller then meters the response or the
// session), holding the store for the charge. It returns nil when the
// response needs no wrapping.
func (h *Handler) admitted(w http.ResponseWriter, req *request, chain []limiter.Limit, d limiter.Decision, metering bool) *responseWriter {
	if !h.shadowRefused(w, req, chain, d) {
		setOutcome(req.repl, outcomeAdmitted)
	}
	h.tally(req.top, limiter.TopRequests, 1)
	families, learn := h.families(req.dia), h.newLearning(chain, d)
	if !families.any() && !metering && learn == nil {
		return nil
	}
	rw := &responseWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, metering: metering, learn: learn, top: req.top}
	if families.any() {
		rw.headers = families.headersFor(chain, d, true)
		rw.headers.apply(w.Header())
	}
	if metering {
		// The store stays usable for this request's charge even if a
		// reload unloads it meanwhile; the charge releases it.
		h.store.Hold()
	}
	return rw
}

// chargeSession charges the tokens a session's responses reported to its
// chain, and what they cost, in the current periods, and waits for the
// outcome, so that a session's last charge lands before its store is
// released.
func (h *Handler) chargeSession(chain []limiter.Limit, tokens limiter.TokenCounts, price *pricing.Entry, model string, top []limiter.TopID) {
	if tokens.IsZero() {
		return
	}
	c := limiter.Charge{Tokens: tokens}
	done := make(chan error, 1)
	h.store.Charge(chain, c, func(err error) { done <- err })
	h.settled(c, tokens, price, model, top, <-done)
}

// meterResponse finishes the admitted response's metering and charges its
// tokens (at most its ceiling), and with a price what they cost, without
// waiting for the store, so that the client's last bytes are not held back
// by a round trip. A reservation made at admission (d) is settled in its
// own period: the response's final report replaces it; a request the
// provider cannot have processed gives it all back (unprocessed); any
// other response (one cut short before its final report, or that reports
// nothing) is charged at least the reservation: what it reported where
// that is more, count by count (AtLeast). It releases the store that
// ServeHTTP held for it.
func (h *Handler) meterResponse(w *responseWriter, chain []limiter.Limit, d limiter.Decision, price *pricing.Entry) {
	u, metered, final, clamped := w.finish()
	used := tokensOf(u, price)
	if clamped {
		h.usageClamped(chain, "response", 1)
	}
	if !metered {
		unmeteredTotal.WithLabelValues("response").Inc()
		if h.logger.Core().Enabled(zap.DebugLevel) {
			h.logger.Debug("response not metered: no usage found", zap.String("scope", chain[0].Scope), zap.String("id", chain[0].ID))
		}
	}
	c, charged := limiter.Charge{Tokens: used}, used
	if !d.Reserve.IsZero() {
		c = c.Settling(d)
		switch {
		case final:
		case w.unprocessed():
			charged = limiter.TokenCounts{}
		default:
			charged = used.AtLeast(d.Reserve)
		}
		// The windows take the difference; the budgets the cost charged
		// beside the reservation they give back.
		c.Tokens = charged.Minus(d.Reserve)
		c.Tokens.Cost = charged.Cost
	} else if !metered {
		h.store.Release()
		return
	}
	h.store.Charge(chain, c, func(err error) {
		h.settled(c, charged, price, w.model, w.top, err)
		h.store.Release()
	})
}

// statusClientClosed is the status reverse_proxy writes when the client
// went away before the upstream's response headers (nginx's "client closed
// request").
const statusClientClosed = 499

// unprocessed reports whether the provider cannot have processed the
// request, so that it charged nothing: the upstream answered with an error
// status of its own, or was never reached. A client that left before the
// headers (499) may have had its prompt processed.
func (w *responseWriter) unprocessed() bool {
	if w.wroteHeader {
		return w.status >= 400 && w.status != statusClientClosed
	}
	return w.unreached
}

// unreached reports whether err, what the handlers after this one returned
// without writing a response, says the upstream was never reached:
// reverse_proxy could not connect to it, or had no upstream available (its
// 503). An upstream that failed or timed out once it had the request
// (reverse_proxy's other 502s, its 504) may have processed it.
func unreached(err error) bool {
	if err == nil {
		return false // and errors.As's targets escape: spare a response its allocations
	}
	var dial reverseproxy.DialError
	var status caddyhttp.HandlerError
	return errors.As(err, &dial) || errors.As(err, &status) && status.StatusCode == http.StatusServiceUnavailable
}

// settled counts a charge once the store has it, or logs its failure: the
// tokens (under their model label) and the cost finally charged, and what a
// settlement gave back; and tallies the tokens and the cost to top.
func (h *Handler) settled(c limiter.Charge, charged limiter.TokenCounts, price *pricing.Entry, model string, top []limiter.TopID, err error) {
	if err != nil {
		h.chargeWarn.log(h.logger, "recording tokens failed; they are not charged", zap.Error(err), zap.Int64("tokens", charged.Total),
			zap.String("cost_usd", pricing.FormatUSD(charged.Cost)))
		return
	}
	h.tally(top, limiter.TopTokens, charged.Total)
	h.tally(top, limiter.TopSpend, charged.Cost)
	tokens := tokensOfModel(model)
	tokens.charged.add(charged)
	tokens.returned.add(limiter.TokenCounts{Total: max(-c.Tokens.Total, 0), Input: max(-c.Tokens.Input, 0), Output: max(-c.Tokens.Output, 0)})
	if price != nil {
		spendChargedTotal.WithLabelValues(price.Name).Add(float64(charged.Cost))
		spendReturnedTotal.WithLabelValues(price.Name).Add(float64(max(c.Unreserve-charged.Cost, 0)))
	}
}

// Interface guards: reverse_proxy flushes streams and hijacks WebSocket
// upgrades through http.ResponseController, which finds these methods or
// unwraps to the writer beneath.
var (
	_ http.Hijacker                             = (*responseWriter)(nil)
	_ io.ReaderFrom                             = (*responseWriter)(nil)
	_ interface{ FlushError() error }           = (*responseWriter)(nil)
	_ interface{ Unwrap() http.ResponseWriter } = (*responseWriter)(nil)
)

// pricedTokens are the tokens of a response's usage by how they are
// priced: the input served from no cache and written to none, the cache
// reads and writes, and the output with its reasoning and audio parts.
func pricedTokens(u usage.Usage) pricing.Tokens {
	return pricing.Tokens{
		Input: u.UncachedInput, CacheRead: u.CacheRead, CacheWrite: u.CacheWrite,
		Output: u.Output, Reasoning: u.Reasoning,
		AudioInput: min(u.AudioInput, u.UncachedInput), AudioOutput: u.AudioOutput,
	}
}

// costOf is what a response that reported u costs at price, in
// nano-dollars: at most the largest budget, which a response that costs
// more exhausts all the same, so that counters stay exact.
func costOf(price pricing.Price, u usage.Usage) int64 {
	return min(pricing.Cost(price, pricedTokens(u)), pricing.MaxBudget)
}
