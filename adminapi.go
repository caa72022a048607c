package ratelimit

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
	"github.com/rolter/caddy-ratelimit/internal/provider"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI is the admin API module admin.api.rolter_ratelimit. Caddy loads
// every registered admin.api module with its admin endpoint, so building
// Caddy with this plugin is all it takes; there is nothing to configure.
//
// It serves GET /rolter_ratelimit/usage (see UsagePath), the live view of one
// scope id: for every distinct limit that the loaded rolter_ratelimit
// handlers apply to it, the current request and token estimates, their caps,
// what remains and when each resets, read from the store those handlers use
// without charging anything. It also serves POST /rolter_ratelimit/reset
// (see ResetPath), which takes the same parameters and clears that scope
// id's window counters and token buckets.
//
// Query parameters:
//
//	scope   the scope's name, as in the handler's "scope" lines (required)
//	id      the id as it appears in requests (the raw API key, say); the
//	        view digests it exactly as each handler does: always, unless
//	        the handler declares the scope readable
//	digest  instead of id: the stored form, "#" and 32 hex digits, as logs,
//	        metrics and Redis keys show it
//	root    on Redis Cluster only: <scope>:<id> of the chain's root (the
//	        outermost scope with a value in the requests), under whose hash
//	        tag the counters live; the id as in requests, or its digest
//
// Exactly one of id and digest is required. Caddy logs the URI of every
// admin request, so prefer digest for secrets such as API keys. The answer
// names the id only as stored, never as asked.
//
// Answers: 200 with a UsageView; 400 for a missing or malformed parameter or
// a scope that no loaded handler has; 405 for a method other than GET; 503
// when a store cannot be read. Errors are Caddy's usual {"error": "..."}
// bodies, which never repeat the id. An id with no limit in the scope (no
// limit of its own and no "*" default in any handler) is not an error: the
// answer is 200 with an empty limits list and a note, since such an id is
// simply unlimited there (a 404 would also be indistinguishable from a Caddy
// built without this module).
type AdminAPI struct{}

// UsagePath is the live view's route on the admin endpoint.
const UsagePath = "/rolter_ratelimit/usage"

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rolter_ratelimit",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Routes returns the live view's route, the reset's (reset.go) and the top
// consumers' (top.go).
func (a AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: UsagePath, Handler: caddy.AdminHandlerFunc(a.serveUsage)},
		{Pattern: ResetPath, Handler: caddy.AdminHandlerFunc(a.serveReset)},
		{Pattern: TopPath, Handler: caddy.AdminHandlerFunc(a.serveTop)},
	}
}

// UsageView is the live view's answer for one scope id.
type UsageView struct {
	// Scope is the scope's name, as asked.
	Scope string `json:"scope"`
	// ID is the id as the handlers store it: "#" and the first 32 hex digits
	// of its SHA-256, unless every loaded handler with this scope declares
	// it readable and the id is a short plain token, which is then itself.
	// The id as asked is never in the answer.
	ID string `json:"id"`
	// Limits has one entry per distinct store and caps that the loaded
	// handlers apply to the id, sorted by store, then caps. It is
	// empty (never null) when no handler limits the id in this scope.
	Limits []UsageLimit `json:"limits"`
	// Note explains an empty Limits.
	Note string `json:"note,omitempty"`
}

// AppliedLimit is a limit that the loaded handlers apply to an id: where
// its counters are, and which handlers apply it.
type AppliedLimit struct {
	// Store is "redis" or "memory" (the in-process store).
	Store string `json:"store"`
	// Redis locates the Redis server and database of a "redis" store, without
	// credentials, e.g. "redis://10.0.0.5:6379/0".
	Redis string `json:"redis,omitempty"`
	// ID is the id as these handlers store it (see UsageView.ID): handlers
	// that differ in declaring the scope readable store it apart.
	ID string `json:"id"`
	// Source is where the caps come from: "own" (a limit line for this very
	// id), "default" (the scope's "*" limit), or "own+default" when the
	// handlers that share these caps differ in that.
	Source string `json:"source"`
	// Handlers is how many loaded handlers apply these caps to the id on this
	// store. While a config reload is under way, the outgoing config's
	// handlers count too.
	Handlers int `json:"handlers"`
	// Chains are the distinct scope chains (scope names in order) of those
	// handlers, to tell the handlers apart.
	Chains [][]string `json:"chains"`
}

// UsageLimit is one limit that applies to the id, with its counters as the
// store holds them now.
type UsageLimit struct {
	AppliedLimit
	// At is the store's clock when it was read (Redis TIME for Redis), in
	// RFC 3339 with milliseconds, UTC.
	At string `json:"at"`
	// Admits reports whether this limit alone would admit a request now. A
	// request is admitted only if every limit of its chain admits it.
	Admits bool `json:"admits"`
	// Shadow marks a shadow limit: counted, never refusing; Admits then
	// says what it would do if it were enforced.
	Shadow bool `json:"shadow,omitempty"`
	// RPM is the counter of requests per minute; absent when the limit
	// has no rpm. So for each window: absent when the limit does not cap
	// it (its tokens are then not counted for this id on this limit).
	RPM *UsageCounter `json:"rpm,omitempty"`
	// TPM counts tokens per minute (every token the usage reports).
	TPM *UsageCounter `json:"tpm,omitempty"`
	// ITPM counts input tokens per minute.
	ITPM *UsageCounter `json:"itpm,omitempty"`
	// OTPM counts output tokens per minute.
	OTPM *UsageCounter `json:"otpm,omitempty"`
	// RPD counts requests per day: over the trailing 24 hours, with day
	// periods (unix seconds / 86400) at one-second resolution.
	RPD *UsageCounter `json:"rpd,omitempty"`
	// TPD counts tokens per day.
	TPD *UsageCounter `json:"tpd,omitempty"`
	// ITPD counts input tokens per day.
	ITPD *UsageCounter `json:"itpd,omitempty"`
	// OTPD counts output tokens per day.
	OTPD *UsageCounter `json:"otpd,omitempty"`
	// Bucket is the token bucket; absent when the limit has none.
	Bucket *UsageBucket `json:"bucket,omitempty"`
	// Concurrent is the cap on requests in flight; absent when the limit
	// has none.
	Concurrent *UsageSlots `json:"concurrent,omitempty"`
	// PerRequest lists the caps whose value comes with each request, by
	// name, with that value as configured ("{http.request.header.X-Plan-Rpm}
	// else 60"). Their counters are shown against their fallback (else);
	// without one, a window's limit and remaining are 0, and the other
	// caps are shown against 1 (a burst against the largest): the cap that
	// applies is each request's.
	PerRequest map[string]string `json:"per_request,omitempty"`
	// Carried is, for those caps, the value the last request of the id
	// that this Caddy process read carried ("120"), or the fallback it
	// took ("60 (else)") when its own was missing or not valid; absent
	// before any request of the id since the process started (or once
	// ten thousand other ids have come since).
	Carried map[string]string `json:"carried,omitempty"`
	// BudgetDay is the spend budget of the calendar day; absent when the
	// limit has none.
	BudgetDay *UsageBudget `json:"budget_day,omitempty"`
	// BudgetMonth is the spend budget of the calendar month.
	BudgetMonth *UsageBudget `json:"budget_month,omitempty"`
	// Learned is what the limit learned of the provider's own quota for
	// the id; absent when the limit does not learn.
	Learned *UsageLearned `json:"learned,omitempty"`
}

// UsageLearned is what a limit learned of the provider's own quota for
// one id, from the provider's answers (LimitConfig.Learn).
type UsageLearned struct {
	// PausedUntil is when the provider's last refusal stops pausing the
	// id (RFC 3339 with milliseconds, UTC), PausedForMillis how long from
	// the live view's moment, and PausedBy where the wait came from
	// (retry-after-ms, retry-after, RetryInfo, or default: a refusal
	// without one); absent when the id is not paused.
	PausedUntil     string `json:"paused_until,omitempty"`
	PausedForMillis int64  `json:"paused_for_ms,omitempty"`
	PausedBy        string `json:"paused_by,omitempty"`
	// Quotas are the quotas that hold anything back now, by kind:
	// requests, tokens, input_tokens, output_tokens.
	Quotas map[string]UsageLearnedQuota `json:"quotas,omitempty"`
}

// UsageLearnedQuota is one of the provider's quotas as a limit learned
// it: a bucket that the last report left with what remained, refilling
// evenly until it is full, when it holds nothing back any more.
type UsageLearnedQuota struct {
	// Limit is the quota the provider reported.
	Limit int64 `json:"limit"`
	// Remaining is what it holds now, in whole requests or tokens.
	Remaining int64 `json:"remaining"`
	// FullAt is when it is full again (RFC 3339 with milliseconds, UTC),
	// FullInMillis how long from the live view's moment.
	FullAt       string `json:"full_at"`
	FullInMillis int64  `json:"full_in_ms"`
	// ReportedAt is when the provider's answer reported it, and Header
	// the header its limit came in.
	ReportedAt string `json:"reported_at"`
	Header     string `json:"header,omitempty"`
}

// UsageBudget is a spend budget in its current period. Amounts are US
// dollars as exact decimal strings ("12.500000001"): money is never a
// float.
type UsageBudget struct {
	// Limit is the budget.
	Limit string `json:"limit_usd"`
	// Spent is what the responses settled in the period cost.
	Spent string `json:"spent_usd"`
	// Reserved is the most that the requests admitted in the period and
	// not yet settled may cost: their reservations.
	Reserved string `json:"reserved_usd"`
	// Remaining is Limit − Spent − Reserved, at least 0: what a request
	// may still reserve.
	Remaining string `json:"remaining_usd"`
	// Timezone is the IANA time zone whose calendar the period is of.
	Timezone string `json:"timezone"`
	// Start and Renews are the period's first moment and the next
	// period's, when the budget renews, in RFC 3339 in that zone.
	Start  string `json:"start"`
	Renews string `json:"renews"`
	// RenewsInMillis is the time until the renewal, in milliseconds.
	RenewsInMillis int64 `json:"renews_in_ms"`
}

// UsageSlots is a cap on requests in flight now.
type UsageSlots struct {
	// Limit is the cap: the most requests in flight at once.
	Limit int64 `json:"limit"`
	// InFlight is the slots held now by every gateway process whose lease
	// on them has not ended: its requests in flight (one more with each
	// request admitted, one less as each ends).
	InFlight int64 `json:"in_flight"`
	// Remaining is Limit − InFlight, at least 0.
	Remaining int64 `json:"remaining"`
}

// UsageBucket is a token bucket now, with the definitions of the scg headers.
type UsageBucket struct {
	// BurstCapacity is the bucket's capacity (X-RateLimit-Burst-Capacity).
	BurstCapacity int64 `json:"burst_capacity"`
	// ReplenishRate is the refill in tokens per second, as configured
	// (X-RateLimit-Replenish-Rate).
	ReplenishRate string `json:"replenish_rate"`
	// RequestedTokens is what a request takes (X-RateLimit-Requested-Tokens).
	RequestedTokens int64 `json:"requested_tokens"`
	// Tokens is what the bucket holds now, rounded down to three decimals.
	Tokens float64 `json:"tokens"`
	// Remaining is Tokens rounded down (X-RateLimit-Remaining, before a
	// request takes its tokens).
	Remaining int64 `json:"remaining"`
	// Full is the time until the bucket is full absent traffic, as a Go
	// duration string; "0s" when it is.
	Full string `json:"full_in"`
	// FullMillis is Full in milliseconds.
	FullMillis int64 `json:"full_in_ms"`
}

// UsageCounter is one counter of a limit, with the definitions of the
// x-ratelimit-* headers, applied to the state now: no hypothetical request
// is counted.
type UsageCounter struct {
	// Limit is the cap per minute or per day (x-ratelimit-limit-*).
	Limit int64 `json:"limit"`
	// Estimate is the sliding-window estimate of the trailing minute (or
	// day), current + previous × (length − time into the current period) /
	// length, the length 60 s (or 24 h), rounded to three decimals.
	Estimate float64 `json:"estimate"`
	// Remaining is Limit − Estimate rounded down, at least 0
	// (x-ratelimit-remaining-*). The requests header of an admitted
	// request counts that request, which the store holds by now: right
	// after an admission, and absent other traffic, the two are equal. The
	// tokens header is written before the response's own tokens are
	// charged, so this view is lower by those tokens. A request fits the
	// rpm while Remaining ≥ 1; it fits the tpm while Estimate < Limit,
	// which a Remaining of 0 can hide.
	Remaining int64 `json:"remaining"`
	// Reset is the time until the estimate is back to zero absent further
	// traffic, as a Go duration string (x-ratelimit-reset-*); "0s" when it
	// is zero.
	Reset string `json:"reset"`
	// ResetMillis is Reset in milliseconds.
	ResetMillis int64 `json:"reset_ms"`
}

// digestRE is the stored form of a digested id (see keyID).
var digestRE = regexp.MustCompile(`^#[0-9a-f]{32}$`)

// usageGroup is the handlers that apply the same caps to the same stored id
// on the same store: they read the same counters, so they make one entry.
type usageGroup struct {
	storeKind, where string
	id, tag          string          // the id as stored; the hash tag on Redis Cluster, else ""
	caps             limiter.Caps    // a cap per request at its fallback, or a nominal value
	perRequest       []perRequestCap // the caps that come with each request
	store            limiter.Store
	own, byDefault   bool
	handlers         int
	chains           [][]string
}

// askedID is an id as the live view was asked for it: as in requests, or
// as stored.
type askedID struct {
	raw, digest string // one of them is set
}

// stored is the id as a handler that does or does not declare its scope
// readable stores it.
func (a askedID) stored(readable bool) string {
	if a.digest != "" {
		return a.digest
	}
	return limiter.KeyID(readable, a.raw)
}

// readsScope reports whether h has the scope, and whether it declares it
// readable.
func readsScope(h *Handler, scope string) (has, readable bool) {
	for _, s := range h.Scopes {
		if s.Name == scope {
			return true, s.Readable
		}
	}
	return false, false
}

func (a AdminAPI) serveUsage(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed; use GET", r.Method)}
	}
	asked, err := findLimits(r.URL.Query())
	if err != nil {
		return err
	}
	view := UsageView{Scope: asked.scope, ID: asked.id, Limits: make([]UsageLimit, 0, len(asked.groups))}
	for _, g := range asked.groups {
		entry, err := g.read(r, asked.scope)
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
		}
		view.Limits = append(view.Limits, entry)
	}
	if len(view.Limits) == 0 {
		view.Note = fmt.Sprintf("no loaded handler limits this id in scope %q (it has no limit of its own and the scope has no \"*\" default): it is not limited in this scope", asked.scope)
	}
	return writeAdminJSON(w, view)
}

// writeAdminJSON writes an answer of the admin API's routes: JSON, never
// cached.
func writeAdminJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(body, '\n'))
	return err
}

// askedLimits are the limits that a query of the live view, or of a reset,
// asks for.
type askedLimits struct {
	scope  string
	id     string // as stored (UsageView.ID)
	groups []*usageGroup
}

// findLimits reads the scope, the id and the root from the parameters q,
// and finds the limits the loaded handlers apply to that id (groupLimits).
// Its error is the admin API's 400.
func findLimits(q url.Values) (askedLimits, error) {
	bad := func(err error) (askedLimits, error) {
		return askedLimits{}, caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	scope, id, err := usageQuery(q)
	if err != nil {
		return bad(err)
	}
	handlers := liveHandlers.all()
	known := make(map[string]bool)
	readableEverywhere := true
	for _, h := range handlers {
		for _, s := range h.Scopes {
			known[s.Name] = true
			if s.Name == scope {
				readableEverywhere = readableEverywhere && s.Readable
			}
		}
	}
	if !known[scope] {
		return bad(unknownScope(scope, known))
	}
	root, err := rootQuery(q.Get("root"))
	if err != nil {
		return bad(err)
	}
	groups := groupLimits(handlers, scope, id, root)
	for _, g := range groups {
		if g.store.Describe().Tagged && g.tag == "" {
			return bad(errors.New(
				"on Redis Cluster a counter lives under its chain's root: add root=<scope>:<id> (the outermost scope with a value in the requests, e.g. root=org:acme)"))
		}
	}
	return askedLimits{scope: scope, id: id.stored(readableEverywhere), groups: groups}, nil
}

// usageQuery reads the scope and the id from the query.
func usageQuery(q url.Values) (scope string, id askedID, err error) {
	for _, name := range []string{"scope", "id", "digest", "root"} {
		if len(q[name]) > 1 {
			return "", id, fmt.Errorf("give the %s parameter once", name)
		}
	}
	scope = q.Get("scope")
	if scope == "" {
		return "", id, errors.New("missing scope parameter: ask for ?scope=<scope name>&id=<id as in requests> (or &digest=%23<32 hex digits>)")
	}
	raw, hasID := q["id"]
	digest, hasDigest := q["digest"]
	switch {
	case hasID && hasDigest:
		return "", id, errors.New("give either the id parameter or the digest parameter, not both")
	case hasDigest:
		if !digestRE.MatchString(digest[0]) {
			return "", id, errors.New(`the digest parameter must be "#" and 32 lowercase hex digits, as logs, metrics and Redis keys show digested ids; in a URL, write the "#" as %23 (a bare "#" starts the URL's fragment, which is never sent)`)
		}
		return scope, askedID{digest: digest[0]}, nil
	case hasID && raw[0] != "":
		return scope, askedID{raw: raw[0]}, nil
	case hasID:
		return "", id, errors.New("empty id parameter: an empty scope value is never limited")
	}
	return "", id, errors.New("missing id parameter: give the id as it appears in requests (id=...) or its stored digest (digest=%23..., the # written %23)")
}

func unknownScope(scope string, known map[string]bool) error {
	if len(known) == 0 {
		return fmt.Errorf("unknown scope %q: no rolter_ratelimit handler is loaded", scope)
	}
	names := make([]string, 0, len(known))
	for n := range known {
		names = append(names, n)
	}
	slices.Sort(names)
	return fmt.Errorf("unknown scope %q: no loaded rolter_ratelimit handler has a scope of that name (known scopes: %s)", scope, strings.Join(names, ", "))
}

// groupLimits finds the caps each handler applies to the id in scope, as
// chain would, and groups them by store, stored id, hash tag and caps, in a
// stable order. root is the chain's root, needed on Redis Cluster.
func groupLimits(handlers []*Handler, scope string, asked askedID, root rootRef) []*usageGroup {
	type groupKey struct {
		kind, where, id, tag, perRequest string
		caps                             limiter.Caps
	}
	byKey := make(map[groupKey]*usageGroup)
	var groups []*usageGroup
	for _, h := range handlers {
		has, readable := readsScope(h, scope)
		if !has {
			continue
		}
		sl, ok := h.limits[scope]
		if !ok {
			continue
		}
		id, spec, own := sl.resolve(asked.raw, asked.stored(readable))
		if spec == nil {
			continue
		}
		caps, perRequest := spec.caps, fmt.Sprint(spec.perRequest)
		described := h.store.Describe()
		kind, where := described.Kind, described.Where
		tag := ""
		if described.Tagged {
			tag = root.tag(h)
		}
		key := groupKey{kind, where, id, tag, perRequest, caps}
		g, ok := byKey[key]
		if !ok {
			g = &usageGroup{storeKind: kind, where: where, id: id, tag: tag, caps: caps, perRequest: spec.perRequest, store: h.store}
			byKey[key] = g
			groups = append(groups, g)
		}
		g.handlers++
		g.own = g.own || own
		g.byDefault = g.byDefault || !own
		chain := h.scopeNames()
		if !slices.ContainsFunc(g.chains, func(c []string) bool { return slices.Equal(c, chain) }) {
			g.chains = append(g.chains, chain)
		}
	}
	slices.SortFunc(groups, func(a, b *usageGroup) int {
		return cmp.Or(cmp.Compare(a.storeKind, b.storeKind), cmp.Compare(a.where, b.where), cmp.Compare(a.id, b.id), cmp.Compare(a.tag, b.tag),
			slices.Compare(a.caps.Windows[:], b.caps.Windows[:]),
			cmp.Compare(a.caps.Bucket.Rate, b.caps.Bucket.Rate), cmp.Compare(a.caps.Bucket.Burst, b.caps.Bucket.Burst),
			cmp.Compare(a.caps.Bucket.Cost, b.caps.Bucket.Cost), cmp.Compare(a.caps.Bucket.RateText, b.caps.Bucket.RateText),
			cmp.Compare(a.caps.Concurrent.Max, b.caps.Concurrent.Max), slices.Compare(a.caps.Budgets.Max[:], b.caps.Budgets.Max[:]))
	})
	for _, g := range groups {
		slices.SortFunc(g.chains, slices.Compare)
	}
	return groups
}

// rootRef is the root parameter: the scope and id of the chains' root.
type rootRef struct {
	scope string
	id    askedID
}

// rootQuery reads the root parameter, <scope>:<id as in requests, or its
// digest>; the zero rootRef when absent.
func rootQuery(root string) (rootRef, error) {
	if root == "" {
		return rootRef{}, nil
	}
	scope, id, ok := strings.Cut(root, ":")
	if !ok || scope == "" || id == "" {
		return rootRef{}, errors.New("the root parameter is <scope>:<id>, e.g. root=org:acme")
	}
	if digestRE.MatchString(id) {
		return rootRef{scope, askedID{digest: id}}, nil
	}
	return rootRef{scope, askedID{raw: id}}, nil
}

// tag is the hash tag of h's chains rooted at r; "" when r is absent.
func (r rootRef) tag(h *Handler) string {
	if r.scope == "" {
		return ""
	}
	_, readable := readsScope(h, r.scope)
	return limiter.ChainTag(r.scope, r.id.stored(readable))
}

// read peeks at the group's counters, on a chain of this one limit.
func (g *usageGroup) read(r *http.Request, scope string) (UsageLimit, error) {
	l := limiter.NewLimit(g.tag, scope, g.id, g.caps)
	g.store.Hold() // a reload may unload the store meanwhile
	d, err := g.store.Peek(r.Context(), []limiter.Limit{l})
	g.store.Release()
	if err == nil && len(d.Counts) != 1 {
		err = limiter.ErrBadReply
	}
	if err != nil {
		return UsageLimit{}, fmt.Errorf("the rate limit store (%s) cannot be read: %v", g.name(), err)
	}
	entry := UsageLimit{
		AppliedLimit: g.applied(),
		At:           time.UnixMilli(d.Now.UnixMillis).UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		Admits:       d.Admitted,
	}
	if l.Shadow {
		entry.Shadow, entry.Admits = true, limiter.ShadowRefusalOf([]limiter.Limit{l}, d).First < 0
	}
	windows := [limiter.NumWindows]**UsageCounter{limiter.RPM: &entry.RPM, limiter.TPM: &entry.TPM, limiter.ITPM: &entry.ITPM, limiter.OTPM: &entry.OTPM,
		limiter.RPD: &entry.RPD, limiter.TPD: &entry.TPD, limiter.ITPD: &entry.ITPD, limiter.OTPD: &entry.OTPD}
	budgets := [limiter.NumBudgetPeriods]**UsageBudget{limiter.BudgetDay: &entry.BudgetDay, limiter.BudgetMonth: &entry.BudgetMonth}
	c := d.Counts[0]
	for p := range l.Parts {
		k, isWindow := p.Window()
		switch {
		case isWindow:
			*windows[k] = usageCounter(c.Window[k], l.Windows[k], d.Now.In(k.Span()))
		case p == limiter.BucketPart:
			b := l.Bucket
			full := limiter.CeilDiv(c.Deficit, b.Rate)
			entry.Bucket = &UsageBucket{
				BurstCapacity:   b.Burst,
				ReplenishRate:   b.RateText,
				RequestedTokens: b.Cost,
				Tokens:          float64(max(b.Burst*limiter.MicroTokens-c.Deficit, 0)/1000) / 1000,
				Remaining:       b.Left(c.Deficit),
				Full:            (time.Duration(full) * time.Millisecond).String(),
				FullMillis:      full,
			}
		case p == limiter.SlotsPart:
			m := l.Concurrent.Max
			entry.Concurrent = &UsageSlots{Limit: m, InFlight: c.Slots, Remaining: max(m-c.Slots, 0)}
		case p == limiter.LearnedPart:
			entry.Learned = usageLearned(c.Extra().Learned, d.Now.UnixMillis)
		default:
			b := p.Budget()
			*budgets[b] = usageBudget(d, l.Budgets.Calendar, b, l.Budgets.Max[b])
		}
	}
	if len(g.perRequest) > 0 {
		entry.Carried = described(lastCarried.of(scope, g.id))
	}
	for _, p := range g.perRequest {
		if entry.PerRequest == nil {
			entry.PerRequest = make(map[string]string, len(g.perRequest))
		}
		entry.PerRequest[p.kind.name] = p.describe()
		if k := limiter.WindowKindNamed(p.kind.name); k < limiter.NumWindows && p.fallback == "" {
			(*windows[k]).Limit, (*windows[k]).Remaining = 0, 0
		}
	}
	return entry, nil
}

func usageLearned(c limiter.LearnedCounts, now int64) *UsageLearned {
	at := func(unixMillis int64) string {
		return time.UnixMilli(unixMillis).UTC().Format("2006-01-02T15:04:05.000Z07:00")
	}
	u := &UsageLearned{}
	if c.PausedUntil > now {
		u.PausedUntil, u.PausedForMillis, u.PausedBy = at(c.PausedUntil), c.PausedUntil-now, learnedFrom(c.PausedFrom)
	}
	for k, q := range c.Quotas {
		if q.Limit == 0 {
			continue
		}
		if u.Quotas == nil {
			u.Quotas = make(map[string]UsageLearnedQuota)
		}
		u.Quotas[provider.Kind(k).String()] = UsageLearnedQuota{Limit: q.Limit, Remaining: max(q.Limit*limiter.MicroTokens-q.Deficit, 0) / limiter.MicroTokens,
			FullAt: at(q.Until), FullInMillis: q.Until - now, ReportedAt: at(q.Reported), Header: learnedFrom(q.From)}
	}
	return u
}

func usageBudget(d limiter.Decision, c *limiter.Calendar, p limiter.BudgetPeriod, budget int64) *UsageBudget {
	spent, reserved, s := d.Counts[0].Spent[p], d.Counts[0].Reserved[p], c.SpanAt(p, d.Now)
	at := func(unixMillis int64) string { return time.UnixMilli(unixMillis).In(c.Location).Format(time.RFC3339) }
	return &UsageBudget{
		Limit: pricing.FormatUSD(budget), Spent: pricing.FormatUSD(spent), Reserved: pricing.FormatUSD(reserved),
		Remaining: pricing.FormatUSD(max(budget-spent-reserved, 0)),
		Timezone:  c.Name, Start: at(s.Start), Renews: at(s.End), RenewsInMillis: s.End - d.Now.UnixMillis,
	}
}

// applied is where the group's counters are, and its handlers.
func (g *usageGroup) applied() AppliedLimit {
	return AppliedLimit{Store: g.storeKind, Redis: g.where, ID: g.id, Source: g.source(), Handlers: g.handlers, Chains: g.chains}
}

func (g *usageGroup) source() string {
	switch {
	case g.own && g.byDefault:
		return "own+default"
	case g.own:
		return "own"
	}
	return "default"
}

func usageCounter(w limiter.Window, capacity int64, p limiter.Position) *UsageCounter {
	reset := limiter.ResetIn(w, p)
	return &UsageCounter{
		Limit:       capacity,
		Estimate:    math.Round(w.Estimate(p)*1000) / 1000,
		Remaining:   limiter.Remaining(w, capacity, p),
		Reset:       (time.Duration(reset) * time.Millisecond).String(),
		ResetMillis: reset,
	}
}

// Interface guards
var (
	_ caddy.Module      = AdminAPI{}
	_ caddy.AdminRouter = AdminAPI{}
)
