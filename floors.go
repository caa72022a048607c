package ratelimit

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
)

// The design of priority floors is in the package doc of
// internal/limiter, section "Priority floors".

// validateFloors checks the limit's floors: each of a whole percent from
// 1 to 100, on another scope, once, at most limiter.MaxFloors of them, of
// at most 100% together, on a limit with a cap they divide.
func (l LimitConfig) validateFloors() error {
	if len(l.Floors) == 0 {
		return nil
	}
	if len(l.Floors) > limiter.MaxFloors {
		return fmt.Errorf("limit for scope %q id %q: %d floors, at most %d", l.Scope, l.ID, len(l.Floors), limiter.MaxFloors)
	}
	total := 0
	for i, f := range l.Floors {
		switch {
		case f.Scope == "" || f.ID == "":
			return fmt.Errorf("limit for scope %q id %q: a floor needs a scope and an id", l.Scope, l.ID)
		case f.Scope == l.Scope:
			return fmt.Errorf("limit for scope %q id %q: floor %s %s names the limit's own scope, whose every request has the limit's id: name another scope", l.Scope, l.ID, f.Scope, f.ID)
		case f.Percent < 1 || f.Percent > 100:
			return fmt.Errorf("limit for scope %q id %q: floor %s %s: the share kept is a whole percent from 1 to 100, not %d", l.Scope, l.ID, f.Scope, f.ID, f.Percent)
		}
		for _, g := range l.Floors[:i] {
			if g.Scope == f.Scope && g.ID == f.ID {
				return fmt.Errorf("limit for scope %q id %q: floor %s %s is given twice", l.Scope, l.ID, f.Scope, f.ID)
			}
		}
		total += f.Percent
	}
	if total > 100 {
		return fmt.Errorf("limit for scope %q id %q: the floors keep %d%% together, more than the whole", l.Scope, l.ID, total)
	}
	divided := l.Learn || l.Rate != "" || l.windowCaps() != limiter.WindowCaps{}
	for name := range l.PerRequest {
		kind, _ := capKindNamed(name)
		_, window := kind.part.Window()
		divided = divided || window || kind.part == limiter.BucketPart
	}
	if !divided {
		return fmt.Errorf("limit for scope %q id %q: floors divide windows, a token bucket or what learn learns, and the limit has none", l.Scope, l.ID)
	}
	return nil
}

// floorClass is how a request's class on a limit's floors is found: the
// scopes the floors name, by their place among the handler's, and the ids
// in them, resolved at load.
type floorClass struct {
	scopes []int
	ids    []string
}

// floorClassOf is the class finder of the floors of lc, whose ids
// resolve with repl, among the handler's scopes.
func (h *Handler) floorClassOf(lc LimitConfig, repl *caddy.Replacer) (floorClass, error) {
	var fc floorClass
	for _, f := range lc.Floors {
		id := repl.ReplaceKnown(f.ID, "")
		if id == "" {
			return fc, fmt.Errorf("limit for scope %q id %q: floor %s %s: the id resolves to nothing when the config loads, so the floor would hold for no request", lc.Scope, lc.ID, f.Scope, f.ID)
		}
		for i, s := range h.Scopes {
			if s.Name == f.Scope {
				fc.scopes = append(fc.scopes, i)
			}
		}
		fc.ids = append(fc.ids, id)
	}
	return fc, nil
}

// of is the request's class: the first floor whose scope has its id for
// the request (1-based); 0 for none.
func (fc floorClass) of(h *Handler, req *request) uint8 {
	for i, scope := range fc.scopes {
		if h.scopeValue(scope, req) == fc.ids[i] {
			return uint8(i + 1)
		}
	}
	return 0
}

// floorMessage is the refusal of a request by what the floor of another
// class holds of the first refusing limit's cap: "Reserved for plan prod:
// 60% of provider's 600000 tokens per minute."
func (h *Handler) floorMessage(r limiter.Refusal, l limiter.Limit) string {
	spec := h.specOfLimit(l)
	floor, id := spec.config.Floors[r.Floor-1], spec.floorClass.ids[r.Floor-1]
	var share string
	switch r.Kind {
	case limiter.Burst:
		share = fmt.Sprintf("burst capacity of %d", r.Capacity)
	case limiter.Provider:
		share = fmt.Sprintf("quota of %d, as the provider last reported it", r.Capacity)
	default:
		share = fmt.Sprintf("%d %s per %s", r.Capacity, r.Window.Noun(), limiter.Spans[r.Window.Span()].Name)
	}
	return fmt.Sprintf("Reserved for %s %s: %d%% of %s's %s.", floor.Scope, id, floor.Percent, l.Scope, share)
}

// specOfLimit is the spec of the line that made l, a limit of a request's
// chain: by its id as stored, the prefix line that stores ids so, or its
// scope's default.
func (h *Handler) specOfLimit(l limiter.Limit) *limitSpec {
	sl := h.limits[l.Scope]
	if spec, ok := sl.byID[l.ID]; ok {
		return spec
	}
	for _, p := range sl.byPrefix {
		if p.id == l.ID {
			return p.spec
		}
	}
	return sl.byDefault
}
