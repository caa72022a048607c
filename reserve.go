package ratelimit

import (
	"cmp"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/llmapi"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
	"github.com/rolter/caddy-ratelimit/internal/tokenest"
)

// The design of token reservation is in the package doc, section "Tokens are reserved, then settled".

// defaultReserveOutput is the output reserved for a request that names no
// output cap: enough for a typical answer, and at most each cap of the chain.
const defaultReserveOutput = 1024

// reserving reports whether the handler reserves tokens (reserve_tokens).
func (h *Handler) reserving() bool { return h.ReserveTokens == nil || *h.ReserveTokens }

func (h *Handler) reserveOutput() int64 { return cmp.Or(h.ReserveOutput, defaultReserveOutput) }

// tooLargeFor is the limit of a chain (its index; -1 for none), and its
// window or its budget, that a reservation alone exceeds.
type tooLargeFor struct {
	limit      int
	window     limiter.WindowKind
	overBudget bool // a budget, not a window
	budget     limiter.BudgetPeriod
}

// estimate is what the request of the call with body (nil when it was not
// read; what was read when it is longer than that) asks of the model: its
// input, its output cap and its choices.
func estimate(call llmapi.Call, body requestBody) tokenest.Estimate {
	if !body.complete {
		return tokenest.OfPrefix(call, body.bytes)
	}
	return tokenest.Of(call, body.bytes)
}

// reservation is what a request of estimate est reserves on the token
// windows of chain (its input on input caps, its output on output caps,
// both on tpm and tpd), and the first window that this alone exceeds, if
// any. A request that names no output cap reserves the default for each of
// its choices, and at most each token cap of chain: it is never too large
// for a window because of the default. With a price (its chain has
// budgets), it reserves on them the most its estimated input and its output
// may cost (pricing.MaxCost), and a budget that this alone exceeds is the
// one it is too large for.
func (h *Handler) reservation(est tokenest.Estimate, chain []limiter.Limit, price *pricing.Entry) (limiter.TokenCounts, tooLargeFor) {
	r, over := h.tokenReservation(est, chain)
	if price == nil || over.limit >= 0 {
		return r, over
	}
	r.Cost = pricing.MaxCost(price.Price, est.Input, r.Output)
	for i, l := range chain {
		if l.Shadow {
			continue
		}
		for p, b := range l.EachBudget {
			if r.Cost > b {
				return r, tooLargeFor{limit: i, overBudget: true, budget: p}
			}
		}
	}
	return r, over
}

// tokenReservation is what a request of estimate est reserves on the token
// windows of chain, and the first window this alone exceeds, if any.
func (h *Handler) tokenReservation(est tokenest.Estimate, chain []limiter.Limit) (limiter.TokenCounts, tooLargeFor) {
	in, out := est.Input, est.Output
	if !est.Capped {
		out = timesChoices(h.reserveOutput(), est.Choices)
		// One pass suffices: in only decreases, which keeps every earlier
		// bound on out. A shadow limit bounds nothing.
		for _, l := range chain {
			if l.Shadow {
				continue
			}
			for k, c := range l.Each {
				switch k.Kind() {
				case limiter.Tokens:
					in = min(in, c)
					out = min(out, c-in)
				case limiter.InputTokens:
					in = min(in, c)
				case limiter.OutputTokens:
					out = min(out, c)
				}
			}
		}
		return limiter.TokenCounts{Total: in + out, Input: in, Output: out}, tooLargeFor{limit: -1}
	}
	r := limiter.TokenCounts{Total: in + out, Input: in, Output: out}
	for i, l := range chain {
		if l.Shadow {
			continue
		}
		for k, c := range l.Each {
			if kd := k.Kind(); kd != limiter.Requests && r.Of(kd) > c {
				return r, tooLargeFor{limit: i, window: k}
			}
		}
	}
	return r, tooLargeFor{limit: -1}
}

// maxCount bounds a count made of a request's choices, as tokenest bounds
// the counts it reads, so that sums of them cannot overflow.
const maxCount = 1 << 40

// timesChoices is n tokens for each of choices (at least one), at most
// maxCount.
func timesChoices(n, choices int64) int64 {
	choices = max(choices, 1)
	if n > maxCount/choices {
		return maxCount
	}
	return n * choices
}
