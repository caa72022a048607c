package ratelimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// planAuth is a small auth service for forward_auth: it answers each
// request 200 with the X-Plan-Rpm of its key's plan, or none for a key
// without a plan, as a real one would attach a tenant's limits.
type planAuth struct {
	*httptest.Server
	mu    sync.Mutex
	plans map[string]string // by X-Api-Key
}

func newPlanAuth(t *testing.T, plans map[string]string) *planAuth {
	a := &planAuth{plans: plans}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		plan, ok := a.plans[r.Header.Get("X-Api-Key")]
		a.mu.Unlock()
		if ok {
			w.Header().Set("X-Plan-Rpm", plan)
		}
	}))
	t.Cleanup(a.Close)
	return a
}

// setPlan changes a key's plan, as a signup or an upgrade does.
func (a *planAuth) setPlan(key, plan string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.plans[key] = plan
}

// planSite is a gateway whose keys' rpm comes from the auth service
// through forward_auth's copy_headers, with lines beside it.
func planSite(store string, auth *planAuth, capLine string) string {
	return limited(store, `
		scope key {http.request.header.X-Api-Key}
		`+capLine, fmt.Sprintf(`
	forward_auth %s {
		uri /auth
		copy_headers X-Plan-Rpm
	}`, strings.TrimPrefix(auth.URL, "http://")))
}

// admittedOf sends n requests with key and counts those admitted; every
// other one must be refused with want.
func admittedOf(t *testing.T, gw *gateway, key string, n, want int, headers ...string) int {
	t.Helper()
	admitted := 0
	for range n {
		res, body := gw.do(t, append([]string{"X-Api-Key: " + key}, headers...)...)
		switch res.StatusCode {
		case http.StatusOK:
			admitted++
		case want:
		default:
			t.Fatalf("key %s: %d %s, want 200 or %d", key, res.StatusCode, body, want)
		}
	}
	return admitted
}

// Three keys on plans of 2, 5 and 10 rpm, which the auth service attaches
// to each request: each is admitted exactly its plan's requests.
func TestEachKeyIsAdmittedExactlyItsPlansRPMFromForwardAuth(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		keys := map[string]string{"k2-" + uniqueID(t): "2", "k5-" + uniqueID(t): "5", "k10-" + uniqueID(t): "10"}
		auth := newPlanAuth(t, map[string]string{})
		for key, plan := range keys {
			auth.setPlan(key, plan)
		}
		gw := startGateway(t, newUpstream(t).URL, planSite(store, auth, "limit key * rpm {http.request.header.X-Plan-Rpm}"))
		for key, plan := range keys {
			if got := admittedOf(t, gw, key, 12, http.StatusTooManyRequests); fmt.Sprint(got) != plan {
				t.Errorf("key on plan %s rpm: %d admitted of 12", plan, got)
			}
		}
	})
}

// A plan raised mid-minute applies to the key's counter at once: what was
// used still counts, and the new plan admits exactly the difference.
func TestAPlanRaisedMidMinuteAdmitsExactlyTheDifference(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		key := uniqueID(t)
		auth := newPlanAuth(t, map[string]string{key: "5"})
		gw := startGateway(t, newUpstream(t).URL, planSite(store, auth, "limit key * rpm {http.request.header.X-Plan-Rpm}"))
		if got := admittedOf(t, gw, key, 7, http.StatusTooManyRequests); got != 5 {
			t.Fatalf("plan 5: %d admitted of 7", got)
		}
		auth.setPlan(key, "10")
		if got := admittedOf(t, gw, key, 8, http.StatusTooManyRequests); got != 5 {
			t.Fatalf("raised to 10: %d more admitted of 8, want 5", got)
		}
	})
}

// A plan that is missing or not valid never means unlimited: without a
// fallback it is refused with 503 before any store call; with one, the
// fallback applies.
func TestAMissingOrInvalidPlanIsRefusedOrGetsItsFallbackNeverUnlimited(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		bad := []string{"", "abc", "0", "-1", "1e3", "2.5", "99999999999999"}
		auth := newPlanAuth(t, map[string]string{})
		for _, plan := range bad {
			if plan != "" {
				auth.setPlan("plan="+plan, plan)
			}
		}
		up := newUpstream(t)
		gw := startGateway(t, up.URL, planSite(store, auth, "limit key * rpm {http.request.header.X-Plan-Rpm}"))
		for _, plan := range bad {
			res, body := gw.do(t, "X-Api-Key: plan="+plan)
			if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"rate_limit_unreadable"`) || !strings.Contains(body, "its rpm comes with each request") {
				t.Errorf("plan %q: %d %s, want 503 rate_limit_unreadable", plan, res.StatusCode, body)
			}
		}
		if n := up.hits.Load(); n != 0 {
			t.Fatalf("the upstream saw %d requests of keys without a valid plan", n)
		}
		withElse := startGateway(t, up.URL, planSite(store, auth, "limit key * rpm {http.request.header.X-Plan-Rpm} else 3"))
		for _, plan := range bad {
			if got := admittedOf(t, withElse, "plan="+plan, 5, http.StatusTooManyRequests); got != 3 {
				t.Errorf("plan %q with else 3: %d admitted of 5, want the fallback's 3", plan, got)
			}
		}
	})
}

// A plan header the client sends itself never reaches the limiter:
// forward_auth deletes a header it copies before it copies the auth
// service's, which here sends none for the key (so the request gets the
// fallback, not the client's 1000).
func TestAClientSuppliedPlanHeaderIsDroppedByForwardAuth(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		key := uniqueID(t)
		auth := newPlanAuth(t, map[string]string{})
		gw := startGateway(t, newUpstream(t).URL, planSite(store, auth, "limit key * rpm {http.request.header.X-Plan-Rpm} else 2"))
		if got := admittedOf(t, gw, key, 5, http.StatusTooManyRequests, "X-Plan-Rpm: 1000"); got != 2 {
			t.Fatalf("a client claiming 1000 rpm: %d admitted of 5, want the fallback's 2", got)
		}
	})
}

// The README's map pattern: forward_auth attaches a plan's name, and map
// turns it into the caps; a key whose plan map does not know gets the
// fallback, never unlimited, and a plan the client claims is dropped.
func TestAPlanNameMappedToCapsByMap(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		prefix := uniqueID(t) + "-"
		auth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if plan := strings.TrimPrefix(r.Header.Get("X-Api-Key"), prefix); plan != "none" {
				w.Header().Set("X-Plan", plan)
			}
		}))
		t.Cleanup(auth.Close)
		gw := startGateway(t, newUpstream(t).URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rpm {plan_rpm} else 1`, fmt.Sprintf(`
	forward_auth %s {
		uri /auth
		copy_headers X-Plan
	}
	map {http.request.header.X-Plan} {plan_rpm} {
		free 2
		pro  4
	}`, strings.TrimPrefix(auth.URL, "http://"))))
		for plan, want := range map[string]int{"free": 2, "pro": 4, "gold": 1, "none": 1} {
			if got := admittedOf(t, gw, prefix+plan, 6, http.StatusTooManyRequests, "X-Plan: pro"); got != want {
				t.Errorf("plan %s: %d admitted of 6, want %d", plan, got, want)
			}
		}
	})
}
