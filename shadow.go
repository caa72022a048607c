package ratelimit

import (
	"fmt"
	"net/http"
	"strconv"

	"go.uber.org/zap"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
)

// The design of shadow limits is in the package doc, section "Shadow limits".

// shadowHeader is the header that tells the caller what a shadow limit
// would have done.
const shadowHeader = "X-Ratelimit-Shadow"

// shadowRefused records, for an admission that read d, what a shadow limit
// of chain would have refused, if one would: the outcome, placeholders,
// metric, log line and, when configured, the header. It reports whether
// one would.
func (h *Handler) shadowRefused(w http.ResponseWriter, req *request, chain []limiter.Limit, d limiter.Decision) bool {
	if !hasShadow(chain) {
		return h.shadowUnreadable(w, req)
	}
	ref := limiter.ShadowRefusalOf(chain, d)
	if ref.First < 0 {
		return h.shadowUnreadable(w, req)
	}
	l, window := chain[ref.First], ref.WindowName()
	setOutcome(req.repl, outcomeShadowRefused)
	req.repl.Set(placeholderRefusedScope, l.Scope)
	req.repl.Set(placeholderRefusedKind, ref.Kind.String())
	req.repl.Set(placeholderRefusedWindow, window)
	req.repl.Set(placeholderRefusedLimit, ref.Capacity)
	var retry int64
	if ref.KnowsWait() {
		retry = ref.RetryAfterSeconds()
		req.repl.Set(placeholderRetryAfter, retry)
	}
	refusalsTotal.WithLabelValues(l.Scope, ref.Kind.String(), window, "true").Inc()
	h.shadowLog.logAt(h.logger, zap.InfoLevel, "a shadow limit would have refused a request, which passed",
		zap.String("scope", l.Scope), zap.String("id", l.ID), zap.String("kind", ref.Kind.String()), zap.String("window", window), zap.Int64("retry_after", retry))
	if h.ShadowHeader {
		v := fmt.Sprintf("%s; scope=%s", ref.Kind, l.Scope)
		if window != "" {
			v += "; window=" + window
		}
		if ref.KnowsWait() {
			v += "; retry-after=" + strconv.FormatInt(retry, 10)
		}
		w.Header().Set(shadowHeader, v)
	}
	return true
}

// unreadableKind is the refused kind of a request that a shadow limit
// would refuse because a cap of its that comes with the request is missing
// or not valid: enforced, that limit would answer 503 (badLimit).
const unreadableKind = "unreadable"

// unreadableShadowLimit leaves out of the request's chain the shadow limit
// of scope whose cap per request the request does not give validly (cap):
// a shadow never refuses, whatever its caps are made of. It logs the
// mistake as badLimit does, and the request is marked as that limit would
// refuse it, unless a shadow limit of the chain counted would.
func (h *Handler) unreadableShadowLimit(req *request, scope, cap string) {
	h.badLimitWarn.log(h.logger, "a cap of a shadow limit that comes with the request is missing or not valid, and the limit has no fallback (else); the limit is left out of the request, which passes",
		zap.String("scope", scope), zap.String("cap", cap))
	if req.unreadableShadow == "" {
		req.unreadableShadow = scope
	}
}

// shadowUnreadable marks a request that a shadow limit left out of its
// chain would refuse (unreadableShadowLimit), and reports whether there is
// one.
func (h *Handler) shadowUnreadable(w http.ResponseWriter, req *request) bool {
	scope := req.unreadableShadow
	if scope == "" {
		return false
	}
	setOutcome(req.repl, outcomeShadowRefused)
	req.repl.Set(placeholderRefusedScope, scope)
	req.repl.Set(placeholderRefusedKind, unreadableKind)
	refusalsTotal.WithLabelValues(scope, unreadableKind, "", "true").Inc()
	if h.ShadowHeader {
		w.Header().Set(shadowHeader, unreadableKind+"; scope="+scope)
	}
	return true
}

// hasShadow reports whether a limit of chain is a shadow limit.
func hasShadow(chain []limiter.Limit) bool {
	for _, l := range chain {
		if l.Shadow {
			return true
		}
	}
	return false
}
