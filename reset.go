package ratelimit

import (
	"context"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
)

// ResetPath is the reset's route on the admin endpoint: POST clears the
// window counters and token buckets of one scope id, for support staff to
// unblock a customer refused by mistake.
//
// It takes the live view's parameters (scope, and id or digest, and root on
// Redis Cluster; see AdminAPI), in the query or, so that a secret id stays
// out of the URI that Caddy logs for every admin request, in a form body
// (application/x-www-form-urlencoded, as curl's --data-urlencode sends). It
// finds every limit the loaded handlers apply to the id exactly as the live
// view does, and on the store those handlers use for each:
//
//   - clears every window the limit caps (rpm, tpm, …, rpd, …), in every
//     period its store's clock may read: the in-process store all the
//     periods it holds; Redis the periods around the gateway's clock, from
//     the one before the previous to the next (for minute windows the
//     minutes, for day windows the days), so that a Redis clock up to a
//     period ahead of or behind the gateway's, which reads its own current
//     and previous period, finds nothing either;
//   - clears its token bucket, which is then full;
//   - forgets this process's cached refusals of the limit (Redis's refusal
//     cache). Other gateway processes on the same Redis keep theirs until
//     the moment each would release: their requests of the id are refused
//     locally until then, at most a window's reset or a bucket's refill
//     later; a process reloaded since the refusal (or whose Redis failed)
//     has forgotten them.
//
// It keeps (and says so in the answer's "kept"):
//
//   - the slots of requests in flight (concurrent): they are requests still
//     running. Each holder's renewal writes its own count, so clearing
//     them would be undone within a third of a lease, and they free
//     themselves as the requests end;
//   - the budgets' spent and reserved (budget_day, budget_month): spend is
//     money the upstream charged, and unblocking a budget is raising it, in
//     the config; reservations belong to requests in flight, whose
//     settlements take them back, so clearing them would let those
//     settlements under-count what is reserved for the others.
//
// A request in flight across the reset keeps its charge: the reset took
// its reservation from the windows, and its settlement then charges what it
// used, whole, in its reservation's minute and day (charge.windowTokens; on
// Redis, the limit's reset key tells a settlement from any process that its
// reservation is gone). A request admitted after the reset settles as
// usual. The one request that can be mistaken is one admitted in the very
// millisecond of the reset, by the store's clock, before it: it is taken as
// admitted after, and charged only what it used beyond its reservation.
// Nothing is ever charged twice.
//
// The in-process store is this process's own: a reset on one gateway
// process leaves the counts of the others (each its own store) as they are.
//
// Answers: 200 with a ResetAnswer; 400 for a missing or malformed parameter
// or a scope that no loaded handler has, as the live view; 405 for a method
// other than POST; 503 when a store cannot be written (the limits before it
// in the answer's order are reset, and the error says how many). Errors are
// Caddy's usual {"error": "..."} bodies, which never repeat the id. An id
// that no handler limits in the scope is no error: 200 with nothing cleared
// and a note. Each limit reset is logged at info by the logger
// admin.api.rolter_ratelimit, with the scope, the id as stored (never as
// asked), the store and what it cleared.
const ResetPath = "/rolter_ratelimit/reset"

// resetFormMax bounds a reset's form body: a few short parameters.
const resetFormMax = 64 << 10

// ResetAnswer is a reset's answer for one scope id.
type ResetAnswer struct {
	// Scope is the scope's name, as asked.
	Scope string `json:"scope"`
	// ID is the id as the handlers store it (see UsageView.ID); the id as
	// asked is never in the answer.
	ID string `json:"id"`
	// Limits has one entry per distinct store and caps that the loaded
	// handlers apply to the id, in the live view's order, each with what
	// the reset cleared and kept. It is empty (never null) when no handler
	// limits the id in this scope.
	Limits []ResetLimit `json:"limits"`
	// Kept says, for each cap that the limits have whose counters a reset
	// never clears ("concurrent", "budget_day", "budget_month"), why.
	Kept []ResetKept `json:"kept"`
	// OtherProcesses says what the reset did not reach: other gateway
	// processes' cached refusals on Redis, their own in-process stores.
	OtherProcesses []string `json:"other_processes,omitempty"`
	// Note explains an empty Limits.
	Note string `json:"note,omitempty"`
}

// ResetLimit is one limit that applies to the id, and what its reset did.
type ResetLimit struct {
	AppliedLimit
	// Cleared names what the reset cleared: each window the limit caps
	// ("rpm", "tpd", …) and "bucket" for its token bucket. Empty when the
	// limit has neither.
	Cleared []string `json:"cleared"`
	// Kept names what the limit has and the reset kept: "concurrent",
	// "budget_day", "budget_month" (see ResetAnswer.Kept).
	Kept []string `json:"kept"`
}

// ResetKept is a cap whose counters a reset keeps, and why.
type ResetKept struct {
	What string `json:"what"` // the cap's name, as in ResetLimit.Kept
	Why  string `json:"why"`
}

// keptWhy says why a reset keeps what part p counts (p.KeptByReset): the
// decisions of ResetPath's doc.
func keptWhy(p limiter.Part) string {
	if p == limiter.SlotsPart {
		return "requests in flight are still running: each holder's renewal rewrites its own count, so clearing the slots would be undone, and they free themselves as the requests end"
	}
	return "spent is money the upstream charged, and reserved belongs to requests in flight, whose settlements take it back (clearing it would make them under-count): to unblock a budget, raise it in the config"
}

// resetLogger is the reset's logger: admin API modules are not provisioned,
// so it is the process's, named.
func resetLogger() *zap.Logger { return caddy.Log().Named("admin.api.rolter_ratelimit") }

func (a AdminAPI) serveReset(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed; use POST", r.Method)}
	}
	r.Body = http.MaxBytesReader(w, r.Body, resetFormMax)
	if err := r.ParseForm(); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("the form body cannot be read: %v", err)}
	}
	asked, err := findLimits(r.Form)
	if err != nil {
		return err
	}
	answer := ResetAnswer{Scope: asked.scope, ID: asked.id, Limits: make([]ResetLimit, 0, len(asked.groups)), Kept: []ResetKept{}}
	log := resetLogger()
	kept := make(map[string]bool)
	onRedis, inProcess := false, false
	for i, g := range asked.groups {
		entry, err := g.reset(r.Context(), asked.scope)
		if err != nil {
			done := "no limit was reset"
			if i > 0 {
				done = fmt.Sprintf("the %d limit(s) before it in the live view's order were reset", i)
			}
			return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf(
				"the rate limit store (%s) cannot be written: %v; %s, and its own and any after it may not have been", g.name(), err, done)}
		}
		log.Info("rate limit counters reset", zap.String("scope", asked.scope), zap.String("id", g.id),
			zap.String("store", g.storeKind), zap.String("redis", g.where), zap.Strings("cleared", entry.Cleared), zap.Strings("kept", entry.Kept))
		answer.Limits = append(answer.Limits, entry)
		for _, k := range entry.Kept {
			kept[k] = true
		}
		onRedis = onRedis || g.storeKind == "redis"
		inProcess = inProcess || g.storeKind == "memory"
	}
	for _, k := range capKinds {
		if kept[k.name] {
			answer.Kept = append(answer.Kept, ResetKept{What: k.name, Why: keptWhy(k.part)})
		}
	}
	if onRedis {
		answer.OtherProcesses = append(answer.OtherProcesses,
			"this process forgot its cached refusals of these limits; other gateway processes on the same Redis keep theirs until each would release (at most a window's reset or a bucket's refill), and refuse the id locally until then")
	}
	if inProcess {
		answer.OtherProcesses = append(answer.OtherProcesses,
			"the in-process store is this process's own: other gateway processes keep their counts")
	}
	if len(answer.Limits) == 0 {
		answer.Note = fmt.Sprintf("no loaded handler limits this id in scope %q (it has no limit of its own and the scope has no \"*\" default): there is nothing to reset", asked.scope)
		log.Info("rate limit reset: nothing to clear", zap.String("scope", asked.scope), zap.String("id", asked.id))
	}
	return writeAdminJSON(w, answer)
}

// reset resets the group's limit on its store.
func (g *usageGroup) reset(ctx context.Context, scope string) (ResetLimit, error) {
	l := limiter.NewLimit(g.tag, scope, g.id, g.caps)
	g.store.Hold() // a reload may unload the store meanwhile
	cleared, err := g.store.Reset(ctx, l)
	g.store.Release()
	if err != nil {
		return ResetLimit{}, err
	}
	return ResetLimit{AppliedLimit: g.applied(), Cleared: cleared, Kept: keptNames(l)}, nil
}

// keptNames is what l has that a reset keeps, by the names of its caps.
func keptNames(l limiter.Limit) []string {
	names := []string{}
	for _, k := range capKinds {
		if k.part.KeptByReset() && l.Has(k.part) {
			names = append(names, k.name)
		}
	}
	return names
}

// name is the group's store in messages: "memory", or "redis at <where>".
func (g *usageGroup) name() string {
	if g.where == "" {
		return g.storeKind
	}
	return g.storeKind + " at " + g.where
}
