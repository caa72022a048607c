package ratelimit

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/rolter/caddy-ratelimit/internal/tokenest"
)

// Token reservation: a request whose chain has a tpm reserves, when it is
// admitted, what it may cost (its input estimate and its output cap, read
// from its body by tokenest), in the same atomic step as the rest of its
// admission; the response's reported usage then replaces the reservation
// in the bucket it was made in (meterResponse). Concurrent requests thus
// hold a tpm however many are in flight, as the providers count tokens up
// front.

// defaultReserveOutput is the output reserved for a request that names no
// output cap: enough for a typical answer, and capped for a small tpm.
const defaultReserveOutput = 1024

// reserving reports whether the handler reserves tokens (reserve_tokens).
func (h *Handler) reserving() bool { return h.ReserveTokens == nil || *h.ReserveTokens }

func (h *Handler) reserveOutput() int64 { return cmp.Or(h.ReserveOutput, defaultReserveOutput) }

// reservation is what the request at path with body (nil when it was not
// read) reserves on every tpm of chain, and the index in chain of a limit
// whose tpm that alone exceeds (over), or -1. A request that names no output
// cap reserves the default for it, and at most the smallest tpm of chain: it
// is never too large because of the default.
func (h *Handler) reservation(path string, body []byte, chain []limit) (reserve int64, over int) {
	est := tokenest.Of(path, body)
	if !est.Capped {
		reserve = est.Input + h.reserveOutput()
		for _, l := range chain {
			if l.tpm > 0 {
				reserve = min(reserve, l.tpm)
			}
		}
		return reserve, -1
	}
	reserve = est.Input + est.Output
	for i, l := range chain {
		if l.tpm > 0 && reserve > l.tpm {
			return reserve, i
		}
	}
	return reserve, -1
}

// refuseTooLarge answers a request whose reservation alone exceeds l's tpm:
// no wait would admit it, so it says so as OpenAI does ("Request too
// large"), with x-should-retry false, which the OpenAI SDKs obey, and no
// Retry-After. Nothing is charged.
func (h *Handler) refuseTooLarge(w http.ResponseWriter, repl *caddy.Replacer, dia dialect, l limit, requested int64) error {
	setOutcome(repl, outcomeRefused)
	refusalsTotal.WithLabelValues(l.scope, tooLarge.String()).Inc()
	repl.Set(placeholderRefusedScope, l.scope)
	repl.Set(placeholderRefusedKind, tooLarge.String())
	repl.Set(placeholderRefusedLimit, l.tpm)
	if h.logger.Core().Enabled(zap.DebugLevel) {
		h.logger.Debug("refused", zap.String("scope", l.scope), zap.String("id", l.id), zap.String("kind", tooLarge.String()), zap.Int64("requested", requested))
	}
	w.Header().Set("X-Should-Retry", "false")
	msg := fmt.Sprintf("Request too large for %s on tokens per min (TPM): Limit %d, Requested %d. The input or output tokens must be reduced in order to run successfully.",
		l.scope, l.tpm, requested)
	status := cmp.Or(h.Status, http.StatusTooManyRequests)
	if h.OnRefusal == "error" {
		return caddyhttp.Error(status, errors.New(msg))
	}
	return dia.write(w, errorAnswer{status: status, message: msg, typ: tooLarge.errorType(), code: "rate_limit_exceeded"})
}
