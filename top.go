package ratelimit

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
)

// TopConfig keeps the top consumers of some scopes: per scope, a tally of
// each of its ids in the current day and month (of budget_timezone), by
// requests admitted, requests refused by a cap, tokens charged and spend
// charged, kept in the store (exact across every gateway that shares it)
// and answered by the admin API's GET /rolter_ratelimit/top (TopPath).
// Without it nothing is tallied.
type TopConfig struct {
	// Scopes names the scopes whose ids are tallied: an id is the scope's
	// value in the request, stored as the scope stores it (digested unless
	// readable), whether or not the scope has a limit for it.
	Scopes []string `json:"scopes"`
	// N is how many ids an answer lists unless it asks for another number;
	// default 10, at most maxTopN.
	N int `json:"n,omitempty"`
}

// maxTopN is the most ids an answer of the top consumers lists.
const maxTopN = 1000

// validate checks the top line against the scopes defined.
func (c *TopConfig) validate(scopes map[string]bool) error {
	if len(c.Scopes) == 0 {
		return fmt.Errorf("top names no scope: top <scope>… [n]")
	}
	for i, s := range c.Scopes {
		if !scopes[s] {
			return fmt.Errorf("top names scope %q, which has no scope line", s)
		}
		if slices.Contains(c.Scopes[:i], s) {
			return fmt.Errorf("top names scope %q twice", s)
		}
	}
	if c.N < 0 || c.N > maxTopN {
		return fmt.Errorf("top's n must be from 1 to %d, not %d", maxTopN, c.N)
	}
	return nil
}

// parseTop parses the arguments of a top line, whose name is the current
// token: its scopes, then how many ids an answer lists.
func parseTop(d *caddyfile.Dispenser) (*TopConfig, error) {
	sub := d.Token()
	c := new(TopConfig)
	for d.NextArg() {
		if n, err := strconv.Atoi(d.Val()); err == nil {
			if d.NextArg() {
				return nil, d.Errf("top's n, %d, comes last", n)
			}
			if n < 1 || n > maxTopN {
				return nil, d.Errf("top's n must be from 1 to %d, not %d", maxTopN, n)
			}
			c.N = n
			break
		}
		c.Scopes = append(c.Scopes, d.Val())
	}
	if len(c.Scopes) == 0 {
		return nil, d.Err("top names no scope: top <scope>… [n]")
	}
	return c, noBlock(d, sub)
}

// tally adds n of measure m to the tallies of ids.
func (h *Handler) tally(ids []limiter.TopID, m limiter.TopMeasure, n int64) {
	if len(ids) > 0 && n > 0 {
		h.store.Tally(h.calendar, ids, m, n)
	}
}

// TopPath is the admin API's route of the top consumers: GET with
//
//	scope   a scope of a loaded handler's top line (required)
//	by      requests (admitted), refusals (by a cap), tokens (charged) or
//	        spend (charged); default requests
//	period  day or month, the current one of the handlers' budget_timezone;
//	        default day
//	n       how many ids, from 1 to 1000; default the top line's n
//
// It answers 200 with a TopView, 400 for a missing or malformed parameter
// or a scope no loaded handler tallies, 503 when a store cannot be read.
const TopPath = "/rolter_ratelimit/top"

// TopView is the admin API's answer of the top consumers.
type TopView struct {
	Scope  string `json:"scope"`
	By     string `json:"by"`
	Period string `json:"period"`
	// Stores has one entry per distinct store and time zone of the handlers
	// that tally the scope, sorted by store.
	Stores []TopStore `json:"stores"`
}

// TopStore is the top consumers as one store tallies them.
type TopStore struct {
	// Store is "redis" or "memory" (the in-process store).
	Store string `json:"store"`
	// Redis locates the Redis store, without credentials.
	Redis string `json:"redis,omitempty"`
	// Timezone is the budget_timezone whose day or month the tally is of,
	// and From the first moment of that period (RFC 3339).
	Timezone string `json:"timezone"`
	From     string `json:"from"`
	// Top lists the ids with the most, most first (ties in descending order
	// of id); empty (never null) when none has any.
	Top []TopConsumer `json:"top"`
}

// TopConsumer is an id and what it was tallied.
type TopConsumer struct {
	// ID is the id as stored: "#" and 32 hex digits, unless the scope is
	// readable.
	ID string `json:"id"`
	// Value is its requests, refusals or tokens, or its spend in
	// nano-dollars.
	Value int64 `json:"value"`
	// USD is its spend in US dollars, by spend.
	USD string `json:"usd,omitempty"`
}

// serveTop answers GET TopPath.
func (a AdminAPI) serveTop(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed; use GET", r.Method)}
	}
	bad := func(format string, args ...any) error {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf(format, args...)}
	}
	q := r.URL.Query()
	scope := q.Get("scope")
	if scope == "" {
		return bad("scope is required")
	}
	by, ok := limiter.TopMeasureNamed(cmp.Or(q.Get("by"), "requests"))
	if !ok {
		return bad("by must be requests, refusals, tokens or spend, not %q", q.Get("by"))
	}
	period := limiter.BudgetDay
	switch q.Get("period") {
	case "", "day":
	case "month":
		period = limiter.BudgetMonth
	default:
		return bad("period must be day or month, not %q", q.Get("period"))
	}
	n := 0
	if s := q.Get("n"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 || n > maxTopN {
			return bad("n must be from 1 to %d, not %q", maxTopN, s)
		}
	}
	type source struct{ kind, where, timezone string }
	view := TopView{Scope: scope, By: by.String(), Period: period.String(), Stores: []TopStore{}}
	seen := make(map[source]bool)
	for _, h := range liveHandlers.all() {
		if h.Top == nil || !slices.Contains(h.Top.Scopes, scope) {
			continue
		}
		where := h.store.Describe()
		src := source{where.Kind, where.Where, h.calendar.Name}
		if seen[src] {
			continue
		}
		seen[src] = true
		tally, err := h.store.Top(r.Context(), h.calendar, scope, by, period, cmp.Or(n, h.Top.N, 10))
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("reading the top of scope %q: %v", scope, err)}
		}
		entry := TopStore{Store: src.kind, Redis: src.where, Timezone: src.timezone,
			From: time.UnixMilli(tally.Start).UTC().Format(time.RFC3339), Top: make([]TopConsumer, len(tally.Top))}
		for i, e := range tally.Top {
			entry.Top[i] = TopConsumer{ID: e.ID, Value: e.N}
			if by == limiter.TopSpend {
				entry.Top[i].USD = pricing.FormatUSD(e.N)
			}
		}
		view.Stores = append(view.Stores, entry)
	}
	if len(view.Stores) == 0 {
		return bad("no loaded handler tallies the top of scope %q: give it a top line", scope)
	}
	slices.SortFunc(view.Stores, func(a, b TopStore) int {
		return cmp.Or(cmp.Compare(a.Store, b.Store), cmp.Compare(a.Redis, b.Redis), cmp.Compare(a.Timezone, b.Timezone))
	})
	return writeAdminJSON(w, view)
}
