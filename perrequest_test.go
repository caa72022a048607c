package ratelimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

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
		keys := map[string]string{"k2-" + redistest.UniqueID(t): "2", "k5-" + redistest.UniqueID(t): "5", "k10-" + redistest.UniqueID(t): "10"}
		auth := newPlanAuth(t, "X-Plan-Rpm", map[string]string{})
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
		key := redistest.UniqueID(t)
		auth := newPlanAuth(t, "X-Plan-Rpm", map[string]string{key: "5"})
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
		auth, run := newPlanAuth(t, "X-Plan-Rpm", map[string]string{}), redistest.UniqueID(t)
		keyOf := func(plan string) string { return run + " plan=" + plan }
		for _, plan := range bad {
			if plan != "" {
				auth.setPlan(keyOf(plan), plan)
			}
		}
		up := newUpstream(t)
		gw := startGateway(t, up.URL, planSite(store, auth, "limit key * rpm {http.request.header.X-Plan-Rpm}"))
		for _, plan := range bad {
			res, body := gw.do(t, "X-Api-Key: "+keyOf(plan))
			if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"rate_limit_unreadable"`) || !strings.Contains(body, "its rpm comes with each request") {
				t.Errorf("plan %q: %d %s, want 503 rate_limit_unreadable", plan, res.StatusCode, body)
			}
		}
		if n := up.hits.Load(); n != 0 {
			t.Fatalf("the upstream saw %d requests of keys without a valid plan", n)
		}
		withElse := startGateway(t, up.URL, planSite(store, auth, "limit key * rpm {http.request.header.X-Plan-Rpm} else 3"))
		for _, plan := range bad {
			if got := admittedOf(t, withElse, keyOf(plan), 5, http.StatusTooManyRequests); got != 3 {
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
		key := redistest.UniqueID(t)
		auth := newPlanAuth(t, "X-Plan-Rpm", map[string]string{})
		gw := startGateway(t, newUpstream(t).URL, planSite(store, auth, "limit key * rpm {http.request.header.X-Plan-Rpm} else 2"))
		if got := admittedOf(t, gw, key, 5, http.StatusTooManyRequests, "X-Plan-Rpm: 1000"); got != 2 {
			t.Fatalf("a client claiming 1000 rpm: %d admitted of 5, want the fallback's 2", got)
		}
	})
}

// The headers of an admitted request describe the cap that applied to it,
// its plan's; the live view says the rpm comes per request, the cap the
// id's last request carried (or the fallback it took), shows the counter,
// and marks a shadow limit.
func TestHeadersReportTheRequestsCapAndTheLiveViewSaysItComesPerRequest(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		key, org := redistest.UniqueID(t), redistest.UniqueID(t)
		auth := newPlanAuth(t, "X-Plan-Rpm", map[string]string{key: "7"})
		gw := startGateway(t, newUpstream(t).URL, planSite(store, auth, `scope org {http.request.header.X-Org} readable
		limit key * rpm {http.request.header.X-Plan-Rpm} else 2
		limit org * rpm 100 shadow`))
		res, body := gw.do(t, "X-Api-Key: "+key, "X-Org: "+org)
		if res.StatusCode != http.StatusOK || res.Header.Get("X-Ratelimit-Limit-Requests") != "7" || res.Header.Get("X-Ratelimit-Remaining-Requests") != "6" {
			t.Fatalf("%d %s, limit %q remaining %q: want the plan's 7 with 6 left", res.StatusCode, body, res.Header.Get("X-Ratelimit-Limit-Requests"), res.Header.Get("X-Ratelimit-Remaining-Requests"))
		}
		view, raw := getLiveView(t, "scope=key&id="+key)
		if len(view.Limits) != 1 || view.Limits[0].PerRequest["rpm"] != "{http.request.header.X-Plan-Rpm} else 2" || view.Limits[0].RPM == nil || view.Limits[0].RPM.Estimate != 1 || view.Limits[0].RPM.Limit != 2 ||
			view.Limits[0].Carried["rpm"] != "7" {
			t.Fatalf("live view %s: want the rpm per request, else 2, the 7 its last request carried, and 1 request counted", raw)
		}
		// A key without a plan: its request took the fallback.
		planless := redistest.UniqueID(t)
		if res, body := gw.do(t, "X-Api-Key: "+planless, "X-Org: "+redistest.UniqueID(t)); res.StatusCode != http.StatusOK {
			t.Fatalf("a key without a plan: %d %s", res.StatusCode, body)
		}
		if view, raw := getLiveView(t, "scope=key&id="+planless); len(view.Limits) != 1 || view.Limits[0].Carried["rpm"] != "2 (else)" {
			t.Fatalf("live view %s: want the fallback its last request took, 2 (else)", raw)
		}
		view, raw = getLiveView(t, "scope=org&id="+org)
		if len(view.Limits) != 1 || !view.Limits[0].Shadow || view.Limits[0].RPM.Estimate != 1 {
			t.Fatalf("live view %s: want the org's shadow limit, 1 request counted", raw)
		}
	})
}

// Every cap can come with the request, checked as the config's value is:
// the caps that apply are those the request gives, its fallbacks where it
// gives none or an invalid one, and a cap with neither makes the request's
// limit unreadable.
func TestEveryCapCanComeWithTheRequestCheckedAsTheConfigsValues(t *testing.T) {
	lc := LimitConfig{Scope: "key", ID: "*", PerRequest: map[string]PerRequestCap{
		"rpm": {Value: "{http.request.header.X-Rpm}"}, "tpd": {Value: "{http.request.header.X-Tpd}", Else: "500"},
		"rate": {Value: "{http.request.header.X-Rate}"}, "burst": {Value: "{http.request.header.X-Burst}"}, "cost": {Value: "{custom.cost}"},
		"concurrent": {Value: "{http.request.header.X-Parallel}"}, "budget_month": {Value: "{http.request.header.X-Budget}"},
	}}
	if err := lc.validate(); err != nil {
		t.Fatal(err)
	}
	utc, _ := limiter.CalendarOf("UTC")
	spec, err := new(Handler).specOf(lc, utc)
	if err != nil {
		t.Fatal(err)
	}
	capsOf := func(cost string, headers ...string) (*limiter.Caps, string) {
		r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		setHeaders(r, headers)
		repl := caddy.NewReplacer()
		repl.Set("custom.cost", cost)
		caps, _, bad := spec.capsFor(&request{Request: r, repl: repl})
		return caps, bad
	}
	all := []string{"X-Rpm: 60", "X-Rate: 0.5", "X-Burst: 4", "X-Parallel: 3", "X-Budget: 12.50"}
	got, bad := capsOf("2", append(all, "X-Tpd: 9000")...)
	if bad != "" || got.Windows[limiter.RPM] != 60 || got.Windows[limiter.TPD] != 9000 || got.Bucket.RateText != "0.5" || got.Bucket.Burst != 4 || got.Bucket.Cost != 2 ||
		got.Concurrent.Max != 3 || got.Budgets.Max[limiter.BudgetMonth] != 12_500_000_000 || got.Budgets.Calendar == nil {
		t.Fatalf("caps %+v (bad %q): want every cap as the request gives it", got, bad)
	}
	if got, bad := capsOf("2", append(all, "X-Tpd: 1e3")...); bad != "" || got.Windows[limiter.TPD] != 500 {
		t.Fatalf("tpd 1e3: caps %+v (bad %q), want the fallback's 500", got, bad)
	}
	for cap, headers := range map[string][]string{
		"rpm":          {"X-Rpm: 0", "X-Rate: 0.5", "X-Burst: 4", "X-Parallel: 3", "X-Budget: 12.50"},
		"rate":         {"X-Rpm: 60", "X-Rate: abc", "X-Burst: 4", "X-Parallel: 3", "X-Budget: 12.50"},
		"concurrent":   {"X-Rpm: 60", "X-Rate: 0.5", "X-Burst: 4", "X-Parallel: -1", "X-Budget: 12.50"},
		"budget_month": {"X-Rpm: 60", "X-Rate: 0.5", "X-Burst: 4", "X-Parallel: 3", "X-Budget: 0"},
		"burst":        {"X-Rpm: 60", "X-Rate: 0.5", "X-Parallel: 3", "X-Budget: 12.50"},
	} {
		if _, bad := capsOf("2", headers...); bad != cap {
			t.Errorf("%v: bad cap %q, want %q", headers, bad, cap)
		}
	}
	if _, bad := capsOf("9", all...); bad == "" {
		t.Error("a cost above the burst was taken")
	}
}

// A limit unreadable for a request is refused with 503 before any store
// call, and logged at warn, rate-limited, naming the scope and the cap,
// never the id.
func TestAnUnreadableLimitIsLoggedWithItsScopeAndCapNeverItsID(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	h := &Handler{logger: zap.New(core), badLimitWarn: new(warnLimiter)}
	for range 3 {
		if a := h.badLimit("key", "rpm"); a.status != http.StatusServiceUnavailable || a.outcome != outcomeRefusedBadLimit {
			t.Fatalf("answer %+v, want 503 refused_bad_limit", a)
		}
	}
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("%d log lines for 3 refusals, want 1 (rate-limited)", len(entries))
	}
	fields := entries[0].ContextMap()
	if fields["scope"] != "key" || fields["cap"] != "rpm" || len(fields) != 3 {
		t.Fatalf("log fields %v: want the scope, the cap and the count suppressed, nothing else", fields)
	}
}

// The map pattern of docs/tenants-and-shadow.md: forward_auth attaches a
// plan's name, and map turns it into the caps; a key whose plan map does not
// know gets the fallback, never unlimited, and a plan the client claims is
// dropped.
func TestAPlanNameMappedToCapsByMap(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		prefix := redistest.UniqueID(t) + "-"
		auth := newPlanAuth(t, "X-Plan", map[string]string{prefix + "free": "free", prefix + "pro": "pro", prefix + "gold": "gold"})
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

// The log of the limits loaded shows a cap per request as configured, not
// at the stand-in value its checks use, and the floors as the line gives
// them.
func TestTheLoadedLimitsLogShowsCapsPerRequestAsConfigured(t *testing.T) {
	lc := LimitConfig{Scope: "key", ID: "*", TPM: 1000, Shadow: true, PerRequest: map[string]PerRequestCap{"rpm": {Value: "{http.request.header.X-Plan-Rpm}", Else: "60"}},
		Floors: []FloorConfig{{Scope: "plan", ID: "prod", Percent: 60}}}
	spec, err := new(Handler).specOf(lc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := spec.describe("key *"), "key * tpm 1000 shadow rpm {http.request.header.X-Plan-Rpm} else 60 floor plan prod 60%"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}

// A cap whose placeholders are all known when the config loads is resolved
// then and enforced as a value, on both stores: {env.*} of 2 admits 2 a
// minute, and one unset takes its else; the live view shows the value, not
// a cap per request. One that is not valid fails the load
// (TestCaddyfileRejectsEveryMistakeWithItsLine), not every request.
func TestACapKnownAtLoadIsResolvedThenAndEnforcedAsAValue(t *testing.T) {
	t.Setenv("ROLTER_TEST_PLAN_RPM", "2")
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		for capLine, want := range map[string]int64{"rpm {env.ROLTER_TEST_PLAN_RPM}": 2, "rpm {env.ROLTER_TEST_UNSET_CAP} else 3": 3} {
			gw := startGateway(t, up.URL, limited(store, "scope key {http.request.header.X-Api-Key} readable\nlimit key * "+capLine))
			key := redistest.UniqueID(t)
			if got := admittedOf(t, gw, key, 5, http.StatusTooManyRequests); int64(got) != want {
				t.Errorf("%s: %d admitted of 5, want %d", capLine, got, want)
			}
			v, body := getLiveViewAt(t, caddyAdmin(), "scope=key&id="+key)
			if len(v.Limits) != 1 || v.Limits[0].RPM == nil || v.Limits[0].RPM.Limit != want || v.Limits[0].PerRequest != nil {
				t.Errorf("the live view of %s: %s, want an rpm of %d and no cap per request", capLine, body, want)
			}
		}
	})
}
