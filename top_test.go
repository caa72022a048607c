package ratelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// topSite is a gateway's routes that tally the top keys and teams: a key
// may send 5 requests a minute; a team's tokens and spend are metered
// (its tpm and budget are never reached), each answer of answerAsAsked
// being 3 input and 4 output tokens, which cost $0.000011.
func topSite(store string) string {
	return limited(flightStore(store), `
		scope key {http.request.header.X-Api-Key}
		scope team {http.request.header.X-Team} readable
		on_redis_error deny
		price m input 1 output 2
		limit key * rpm 5
		limit team * tpm 1000000 budget_month 100
		top key team 2
		`)
}

// topAt asks the admin endpoint on port admin for the top of query.
func topAt(t *testing.T, admin int, query string) TopView {
	t.Helper()
	res, body := adminAt(t, admin, http.MethodGet, TopPath, query, "")
	return adminAnswer[TopView](t, "GET "+TopPath+"?"+query, res, body)
}

// Three keys of one team with known usage, sent through three gateway
// processes on one Redis (and one gateway in process), come back from
// every gateway's admin API in order with their exact totals, by
// requests, refusals, tokens and spend, their ids digested; the team,
// readable, as itself.
func TestTheTopConsumersComeBackInOrderWithExactTotalsFromEveryGateway(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		var gateways []string
		var admins []int
		if store == "" {
			gw := startGateway(t, up.URL, topSite(store))
			gateways, admins = []string{gw.url}, []int{caddyAdmin()}
		} else {
			gws := startCaddyProcesses(t, 3, up, topSite(store))
			gateways, admins = urlsOf(gws), adminsOf(gws)
		}
		team := "team-" + redistest.UniqueID(t)
		keys := []string{"sk-a" + redistest.UniqueID(t), "sk-b" + redistest.UniqueID(t), "sk-c" + redistest.UniqueID(t)}
		sends := []int{7, 4, 2} // the first key's last 2 are refused
		c := flightClient(t)
		var wg sync.WaitGroup
		for k, key := range keys {
			for i := range sends[k] {
				wg.Go(func() {
					postTo(c, gateways[(k+i)%len(gateways)], "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "X-Api-Key: "+key, "X-Team: "+team)
				})
			}
		}
		wg.Wait()
		digest := func(k int) string { return limiter.KeyID(false, keys[k]) }
		for _, want := range []struct {
			query string
			top   []TopConsumer
		}{
			{"scope=key&by=requests&n=3", []TopConsumer{{ID: digest(0), Value: 5}, {ID: digest(1), Value: 4}, {ID: digest(2), Value: 2}}},
			{"scope=key&by=refusals", []TopConsumer{{ID: digest(0), Value: 2}}},
			{"scope=key&by=tokens&period=month", []TopConsumer{{ID: digest(0), Value: 35}, {ID: digest(1), Value: 28}}},
			{"scope=key&by=spend&n=3", []TopConsumer{{ID: digest(0), Value: 55000, USD: "0.000055"}, {ID: digest(1), Value: 44000, USD: "0.000044"}, {ID: digest(2), Value: 22000, USD: "0.000022"}}},
			{"scope=team&by=tokens", []TopConsumer{{ID: team, Value: 77}}},
		} {
			for _, admin := range admins {
				eventually(t, func() error {
					view := topAt(t, admin, want.query)
					if len(view.Stores) != 1 || !slices.Equal(view.Stores[0].Top, want.top) {
						return fmt.Errorf("%s: %+v, want %+v", want.query, view.Stores, want.top)
					}
					return nil
				})
			}
		}
		if view := topAt(t, admins[0], "scope=key"); view.By != "requests" || view.Period != "day" || view.Stores[0].Timezone != "UTC" || !strings.HasSuffix(view.Stores[0].From, "T00:00:00Z") || view.Stores[0].Store != storeKind(store) {
			t.Errorf("the default view %+v: want requests of the current UTC day", view)
		}
	})
}

// The top view refuses what it cannot answer.
func TestTheTopViewRefusesEachMalformedQueryWithWhatIsWrong(t *testing.T) {
	startGateway(t, newUpstream(t).URL, topSite(""))
	for query, want := range map[string]string{
		"":                      "scope is required",
		"scope=plan":            `no loaded handler tallies the top of scope "plan": give it a top line`,
		"scope=key&by=cost":     `by must be requests, refusals, tokens or spend, not "cost"`,
		"scope=key&period=week": `period must be day or month, not "week"`,
		"scope=key&n=0":         `n must be from 1 to 1000, not "0"`,
		"scope=key&n=1001":      `n must be from 1 to 1000, not "1001"`,
	} {
		res, body := adminAt(t, caddyAdmin(), http.MethodGet, TopPath, query, "")
		var answer struct{ Error string }
		if err := json.Unmarshal(body, &answer); err != nil || res.StatusCode != http.StatusBadRequest || answer.Error != want {
			t.Errorf("?%s: %d %s, want 400 saying %q", query, res.StatusCode, body, want)
		}
	}
	if res, _ := adminAt(t, caddyAdmin(), http.MethodPost, TopPath, "scope=key", ""); res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", res.StatusCode)
	}
}
