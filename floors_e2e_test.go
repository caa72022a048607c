package ratelimit

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// floorsSite is a gateway's routes whose provider limit is a bucket of 40
// refilled at 80 a second (full again in half a second: its period), of
// which prod's floor keeps 60% and batch's 10%.
func floorsSite(store string) string {
	return limited(flightStore(store), `
		scope plan {http.request.header.X-Plan}
		scope provider {http.request.header.X-Org} readable
		on_redis_error deny
		limit provider * rate 80 burst 40 floor plan prod 60% floor plan batch 10%
		`)
}

// sharedCap is the capacity the floors divide: what it holds full, and
// what it gets back each second.
type sharedCap struct{ full, perSecond int }

// floorsBucket is floorsSite's bucket.
var floorsBucket = sharedCap{full: 40, perSecond: 80}

// period is how long the capacity takes to fill.
func (c sharedCap) period() time.Duration {
	return time.Duration(c.full) * time.Second / time.Duration(c.perSecond)
}

// gives is what the capacity gives over d from full.
func (c sharedCap) gives(d time.Duration) float64 {
	return float64(c.full) + float64(c.perSecond)*d.Seconds()
}

// classTraffic is what the clients of one plan saw: when each of their
// requests was admitted (answered 200), and one refusal's message that
// named a floor.
type classTraffic struct {
	mu       sync.Mutex
	admitted []time.Time
	floor    string
}

// admittedIn is how many of the class's requests were admitted in [from, to).
func (c *classTraffic) admittedIn(from, to time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, at := range c.admitted {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// flood has clients send requests of plan and org through the gateways
// (client i through gateway i mod len(gateways)) until end, each as an SDK
// does: the next as soon as one is answered, after the Retry-After-Ms of
// a refusal.
func flood(t *testing.T, wg *sync.WaitGroup, gateways []string, plan, org string, extra []string, clients int, end time.Time) *classTraffic {
	c := new(classTraffic)
	for i := range clients {
		wg.Go(func() {
			for time.Now().Before(end) {
				res, body, err := postChat(gateways[i%len(gateways)], append([]string{"X-Plan", plan, "X-Org", org}, extra...)...)
				if err != nil {
					t.Error(err)
					return
				}
				switch res.StatusCode {
				case http.StatusOK:
					c.mu.Lock()
					c.admitted = append(c.admitted, time.Now())
					c.mu.Unlock()
				case http.StatusTooManyRequests:
					if msg := string(body); strings.Contains(msg, "Reserved for") {
						c.mu.Lock()
						c.floor = msg
						c.mu.Unlock()
					}
					time.Sleep(min(retryAfterOf(res), time.Until(end)))
				default:
					t.Errorf("%d %s", res.StatusCode, body)
					return
				}
			}
		})
	}
	return c
}

// floorsAreKept has batch's clients take the capacity c alone for three
// of its periods, then prod's start and both send for five more, through
// the gateways, each request with the extra headers, and checks the
// floors' promises: batch alone uses at least 95% of what the capacity
// gives; prod, from one period after it starts, has at least its 60% of
// the admissions, and batch its 10%; and a batch request refused meanwhile
// is told what prod's floor holds, of.
func floorsAreKept(t *testing.T, gateways []string, c sharedCap, extra []string, of string) {
	org := redistest.UniqueID(t)
	start := time.Now()
	prodStart, end := start.Add(3*c.period()), start.Add(8*c.period())
	var wg sync.WaitGroup
	batch := flood(t, &wg, gateways, "batch", org, extra, 6, end)
	time.Sleep(time.Until(prodStart))
	prod := flood(t, &wg, gateways, "prod", org, extra, 6, end)
	wg.Wait()

	alone, given := batch.admittedIn(start, prodStart), c.gives(prodStart.Sub(start))
	t.Logf("batch alone: %d admitted of the %.0f the capacity gave", alone, given)
	if float64(alone) < 0.95*given {
		t.Errorf("batch alone was admitted %d, less than 95%% of the %.0f the capacity gave", alone, given)
	}
	settled := prodStart.Add(c.period())
	p, b := prod.admittedIn(settled, end), batch.admittedIn(settled, end)
	t.Logf("from one period after prod started: prod %d, batch %d", p, b)
	// Two requests of slack: one at each edge of the stretch measured,
	// admitted on one side of it and answered on the other.
	if share := float64(p+2) / float64(p+b); share < 0.6 {
		t.Errorf("prod had %d of the %d admissions from one period after it started, less than its floor's 60%%", p, p+b)
	}
	if share := float64(b) / float64(p+b); share < 0.1 {
		t.Errorf("batch had %.1f%% of the admissions while prod asked, less than its floor's 10%%", 100*share)
	}
	if want := "Reserved for plan prod: 60% of provider's " + of; !strings.Contains(batch.floor, want) {
		t.Errorf("batch's refusals told %q, want one telling %q", batch.floor, want)
	}
}

// bucketNeverOverspent checks that no stretch of the upstream's arrivals
// holds more requests than the floors' bucket gives over it: its burst,
// and its refill, with a request of slack for the time from an admission
// to its arrival.
func bucketNeverOverspent(t *testing.T, arrivals []time.Time) {
	for i, from := range arrivals {
		for j := i; j < len(arrivals); j++ {
			if n, most := j-i+1, floorsBucket.gives(arrivals[j].Sub(from))+1; float64(n) > most {
				t.Fatalf("%d requests reached the upstream in %v, more than the bucket gives: %.0f", n, arrivals[j].Sub(from), most)
			}
		}
	}
}

// Three gateway processes on one Redis keep the floors of the bucket they
// share, and so does one gateway in process.
func TestGatewaysKeepEachFloorOfASharedBucket(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		var gateways []string
		if store == "" {
			gateways = []string{startGateway(t, up.URL, floorsSite(store)).url}
		} else {
			gateways = urlsOf(startCaddyProcesses(t, 3, up, floorsSite(store)))
		}
		floorsAreKept(t, gateways, floorsBucket, nil, "burst capacity of 40.")
		bucketNeverOverspent(t, up.arrivals())
	})
}

// Three gateway processes on a Redis Cluster keep them too: a chain's
// floors keys are in its root's slot.
func TestGatewaysOnAClusterKeepEachFloorOfASharedBucket(t *testing.T) {
	c := sharedCluster(t)
	up := newUpstream(t)
	floorsAreKept(t, urlsOf(startCaddyProcesses(t, 3, up, floorsSite("redis cluster "+strings.Join(c.URLs(), " ")))), floorsBucket, nil, "burst capacity of 40.")
	bucketNeverOverspent(t, up.arrivals())
}

// Three gateway processes on one Redis keep the floors of the provider's
// own quota as they learn it: a stand-in provider's 40 requests, refilled
// in half a second.
func TestGatewaysKeepEachFloorOfTheProvidersLearnedQuota(t *testing.T) {
	url := redistest.EnvURL(t)
	quota := sharedCap{full: 40, perSecond: 80}
	provider := newStandInProvider(int64(quota.full), quota.period())
	up := newFakeUpstream(t, provider.mode)
	gws := startCaddyProcesses(t, 3, up, providerSite("redis "+url, map[string]string{
		"floors": "scope plan {http.request.header.X-Plan}\nlimit provider * learn floor plan prod 60% floor plan batch 10%",
	}))
	floorsAreKept(t, urlsOf(gws), quota, []string{"X-Route", "floors", "X-Dialect", "openai"}, "quota of 40, as the provider last reported it.")
}

// A request refused for what another class's floor holds of a token window
// is told so, in its dialect, with the floor, its share and the cap; a
// request of that class is admitted in its stead.
func TestARefusalForAFloorNamesItsClassShareAndCap(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw := startGateway(t, newUpstream(t).URL, limited(flightStore(store), `
			scope plan {http.request.header.X-Plan}
			scope provider {http.request.header.X-Org} readable
			limit provider * tpm 1000 floor plan prod 60%
			`))
		org := redistest.UniqueID(t)
		ask := func(plan string, maxTokens int) (*http.Response, []byte) {
			return gw.send(t, "POST", "/v1/chat/completions", fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, maxTokens), "X-Plan: "+plan, "X-Org: "+org)
		}
		if res, body := ask("prod", 500); res.StatusCode != http.StatusOK {
			t.Fatalf("prod's first request: %d %s", res.StatusCode, body)
		}
		res, body := ask("batch", 450)
		want := "Reserved for plan prod: 60% of provider's 1000 tokens per minute. Please try again in "
		if res.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), want) || !strings.Contains(string(body), `"type":"tokens"`) {
			t.Fatalf("batch beside what prod's floor holds: %d %s, want 429 telling %q", res.StatusCode, body, want)
		}
		if res, body := ask("prod", 450); res.StatusCode != http.StatusOK {
			t.Fatalf("prod within its floor: %d %s", res.StatusCode, body)
		}
	})
}
