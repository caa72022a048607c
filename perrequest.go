package ratelimit

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
)

// The design of caps per request is in the package doc, section "Caps per request".

// PerRequestCap is a cap whose value comes with each request.
type PerRequestCap struct {
	// Value holds placeholders, resolved per request, such as
	// {http.request.header.X-Plan-Rpm}; it must then be what the cap takes
	// in the config (a positive integer; a decimal for rate; US dollars
	// for budgets) within the same bounds. A value whose placeholders are
	// all known when the config loads ({env.*}, {file.*}) is resolved and
	// checked then, and the config fails to load if it is not valid.
	Value string `json:"value"`
	// Else is the cap's value when Value resolves empty or not valid; it
	// must be valid. Absent: such a request is refused with 503.
	Else string `json:"else,omitempty"`
}

// perRequestCap is a cap of a limit whose value comes with each request.
type perRequestCap struct {
	kind     capKind
	value    string // its template
	header   string // the request header the value is exactly the placeholder of, else ""
	fallback string // its else value; "" for none
}

// limitSpec is a limit line as requests find it: its caps, of which those
// that come with each request are left out (0), and the line itself, for
// those.
type limitSpec struct {
	caps       limiter.Caps
	perRequest []perRequestCap
	line       lineSettings
	config     LimitConfig // the line without its per-request caps
	floorClass floorClass  // how a request's class on its floors is found
}

// specOf is the spec of the handler's limit line lc, whose budgets cover
// the days and months of calendar: its caps (a cap per request at its
// fallback, or a stand-in), with the handler's slot lease and shadow.
func (h *Handler) specOf(lc LimitConfig, calendar *limiter.Calendar) (*limitSpec, error) {
	lc, err := lc.resolvedAtLoad()
	if err != nil {
		return nil, err
	}
	nominal, err := lc.nominal()
	if err != nil {
		return nil, err
	}
	caps, err := nominal.caps()
	if err != nil {
		return nil, err
	}
	line := lineSettings{leaseMillis: h.slotLease().Milliseconds(), calendar: calendar, shadow: lc.Shadow || h.Shadow}
	line.applyTo(&caps)
	return newLimitSpec(lc, caps, line), nil
}

// lineSettings are what a limit's caps take from its line and its handler
// rather than from the caps' values: they hold for the caps a request
// brings as for the configured ones, so that a limit built per request is
// the line's limit in every other respect (a shadow stays a shadow).
type lineSettings struct {
	leaseMillis int64             // the slots' lease (slot_lease)
	calendar    *limiter.Calendar // the budgets' days and months (budget_timezone)
	shadow      bool              // shadow, on the line or the handler
}

// applyTo gives caps the line's settings.
func (s lineSettings) applyTo(caps *limiter.Caps) {
	caps.Concurrent.LeaseMillis, caps.Shadow = s.leaseMillis, s.shadow
	if caps.Budgets.Max != [limiter.NumBudgetPeriods]int64{} {
		caps.Budgets.Calendar = s.calendar
	}
}

// newLimitSpec is the spec of a limit line whose caps, as configured, are
// caps, with the line's settings.
func newLimitSpec(lc LimitConfig, caps limiter.Caps, line lineSettings) *limitSpec {
	s := &limitSpec{caps: caps, line: line, config: lc}
	s.config.PerRequest = nil
	for _, name := range slices.Sorted(maps.Keys(lc.PerRequest)) {
		p := lc.PerRequest[name]
		kind, _ := capKindNamed(name) // a known cap: nominal checked it at load
		s.perRequest = append(s.perRequest, perRequestCap{kind: kind, value: p.Value, header: scopeHeader(p.Value), fallback: p.Else})
	}
	return s
}

// capsFor is the caps that apply to a request: the line's own (shared by
// its every limit) when it has no caps per request, else the line's with
// those of its caps per request the request gives, or else their
// fallbacks, and those (carried: each cap's value as the request gave it,
// or "" where it took the fallback); bad names a cap per request that the request does not give
// validly and that has no fallback, or that makes the caps inconsistent (a
// cost above the burst).
func (s *limitSpec) capsFor(req *request) (caps *limiter.Caps, carried []carriedCap, bad string) {
	if len(s.perRequest) == 0 {
		return &s.caps, nil, ""
	}
	lc := s.config
	carried = make([]carriedCap, len(s.perRequest))
	for i, p := range s.perRequest {
		v := p.valueFor(req)
		switch {
		case p.kind.set(&lc, v) == nil:
			carried[i] = carriedCap{p, v}
		case p.fallback != "" && p.kind.set(&lc, p.fallback) == nil:
			carried[i] = carriedCap{p, ""}
		default:
			return nil, nil, p.kind.name
		}
	}
	built, err := lc.caps()
	if err != nil {
		return nil, nil, s.perRequest[0].kind.name
	}
	s.line.applyTo(&built)
	return &built, carried, ""
}

// describe is the limit's caps after name, for the log: its caps per
// request as configured, not at their stand-in values, and its floors as
// the line gives them.
func (s *limitSpec) describe(name string) string {
	caps := s.caps // the stand-in values left out
	var more strings.Builder
	for _, p := range s.perRequest {
		fmt.Fprintf(&more, " %s %s", p.kind.name, p.describe())
		caps.Without(p.kind.part)
	}
	for _, f := range s.config.Floors {
		fmt.Fprintf(&more, " floor %s %s %d%%", f.Scope, f.ID, f.Percent)
	}
	return caps.Describe(name) + more.String()
}

// describe is the cap's value as configured, with its fallback.
func (p perRequestCap) describe() string {
	if p.fallback == "" {
		return p.value
	}
	return p.value + " else " + p.fallback
}

// valueFor is the cap's value for the request. A value that is one request
// header placeholder is read as the scopes' are (several lines joined by
// commas: never a valid cap).
func (p perRequestCap) valueFor(req *request) string {
	if p.header != "" {
		return strings.Join(req.Header[p.header], ",")
	}
	return req.repl.ReplaceAll(p.value, "")
}

// nominal is the line with each cap per request at its fallback, or else
// at a nominal value (the largest burst, 1 for the rest), which its caps
// are checked with at load and the live view reads its counters with; the
// error says what is wrong with a cap per request: a cap the line does not
// also give, with a placeholder in its value, and a valid fallback.
func (l LimitConfig) nominal() (LimitConfig, error) {
	l, err := l.resolvedAtLoad()
	if err != nil {
		return l, err
	}
	nominal := l
	nominal.PerRequest = nil
	for _, name := range slices.Sorted(maps.Keys(l.PerRequest)) {
		p := l.PerRequest[name]
		kind, ok := capKindNamed(name)
		if !ok {
			return l, fmt.Errorf("limit for scope %q id %q: unknown per-request cap %q: expecting %s", l.Scope, l.ID, name, capNames(", ", ", "))
		}
		if kind.given(&l) {
			return l, fmt.Errorf("limit for scope %q id %q: %s is given both as a value and per request", l.Scope, l.ID, name)
		}
		if !strings.Contains(p.Value, "{") {
			return l, fmt.Errorf("limit for scope %q id %q: the per-request %s %q holds no placeholder: give it as a value", l.Scope, l.ID, name, p.Value)
		}
		v := cmp.Or(p.Else, kind.nominal)
		if err := kind.set(&nominal, v); err != nil {
			return l, fmt.Errorf("limit for scope %q id %q: %s else: %v", l.Scope, l.ID, name, err)
		}
	}
	return nominal, nil
}

// resolvedAtLoad is the line with each cap per request whose placeholders
// are all known when the config loads ({env.*}, {file.*}) resolved then
// and given as a value, as ids are (resolvedID): such a cap is the same for
// every request, and one that is not valid (an unset variable) fails the
// load with its line rather than every request with 503. Its else applies
// when it resolves empty or not valid, as it would per request.
func (l LimitConfig) resolvedAtLoad() (LimitConfig, error) {
	var repl *caddy.Replacer
	for _, name := range slices.Sorted(maps.Keys(l.PerRequest)) {
		p := l.PerRequest[name]
		kind, ok := capKindNamed(name)
		if !knownAtLoad(p.Value) || !ok || kind.given(&l) {
			continue // not known at load, or a mistake that nominal names
		}
		if repl == nil {
			repl = caddy.NewReplacer()
			l.PerRequest = maps.Clone(l.PerRequest)
		}
		v := repl.ReplaceKnown(p.Value, "")
		err := kind.set(&l, v)
		if err != nil && p.Else != "" {
			err = kind.set(&l, p.Else)
		}
		if err != nil {
			return l, fmt.Errorf("limit for scope %q id %q: %s %s is %q when the config loads: %v", l.Scope, l.ID, name, p.Value, v, err)
		}
		delete(l.PerRequest, name)
	}
	return l, nil
}

// knownAtLoad reports whether v holds placeholders, each of them one whose
// value is known when the config loads: {env.*} or {file.*}.
func knownAtLoad(v string) bool {
	found := false
	for rest := v; ; {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			return found
		}
		length := strings.IndexByte(rest[open:], '}')
		if length < 0 {
			return false
		}
		name := rest[open+1 : open+length]
		if !strings.HasPrefix(name, "env.") && !strings.HasPrefix(name, "file.") {
			return false
		}
		found, rest = true, rest[open+length+1:]
	}
}
