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

// The floors' bucket: its burst, its refill a second, and its period.
const (
	floorsBurst  = 40
	floorsRate   = 80
	floorsPeriod = floorsBurst * time.Second / floorsRate
)

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
func flood(t *testing.T, wg *sync.WaitGroup, gateways []string, plan, org string, clients int, end time.Time) *classTraffic {
	c := new(classTraffic)
	for i := range clients {
		wg.Go(func() {
			for time.Now().Before(end) {
				res, body, err := postChat(gateways[i%len(gateways)], "X-Plan", plan, "X-Org", org)
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

// floorsAreKept has batch's clients take the bucket alone for four periods,
// then prod's start and both send for five more, through the gateways, and
// checks the floors' promises: batch alone uses at least 95% of what the
// bucket gives; prod, from one period after it starts, has at least its
// 60% of the admissions, and batch its 10%; a batch request refused meanwhile is told what prod's
// floor holds; and the upstream never sees more than the bucket gives.
func floorsAreKept(t *testing.T, up *fakeUpstream, gateways []string) {
	org := redistest.UniqueID(t)
	start := time.Now()
	prodStart, end := start.Add(4*floorsPeriod), start.Add(9*floorsPeriod)
	var wg sync.WaitGroup
	batch := flood(t, &wg, gateways, "batch", org, 6, end)
	time.Sleep(time.Until(prodStart))
	prod := flood(t, &wg, gateways, "prod", org, 6, end)
	wg.Wait()

	alone, given := batch.admittedIn(start, prodStart), floorsBurst+floorsRate*prodStart.Sub(start).Seconds()
	t.Logf("batch alone: %d admitted of the %.0f the bucket gave", alone, given)
	if float64(alone) < 0.95*given {
		t.Errorf("batch alone was admitted %d, less than 95%% of the %.0f the bucket gave", alone, given)
	}
	settled := prodStart.Add(floorsPeriod)
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
	if want := fmt.Sprintf("Reserved for plan prod: 60%% of provider's burst capacity of %d.", floorsBurst); !strings.Contains(batch.floor, want) {
		t.Errorf("batch's refusals told %q, want one telling %q", batch.floor, want)
	}
	bucketNeverOverspent(t, up.arrivals())
}

// bucketNeverOverspent checks that no stretch of the upstream's arrivals
// holds more requests than the floors' bucket gives over it: its burst,
// and its refill, with a request of slack for the time from an admission
// to its arrival.
func bucketNeverOverspent(t *testing.T, arrivals []time.Time) {
	for i, from := range arrivals {
		for j := i; j < len(arrivals); j++ {
			if n, most := j-i+1, floorsBurst+floorsRate*arrivals[j].Sub(from).Seconds()+1; float64(n) > most {
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
		if store == "" {
			floorsAreKept(t, up, []string{startGateway(t, up.URL, floorsSite(store)).url})
			return
		}
		floorsAreKept(t, up, urlsOf(startCaddyProcesses(t, 3, up, floorsSite(store))))
	})
}

// Three gateway processes on a Redis Cluster keep them too: a chain's
// floors keys are in its root's slot.
func TestGatewaysOnAClusterKeepEachFloorOfASharedBucket(t *testing.T) {
	c := redistest.NewCluster(t, 3)
	up := newUpstream(t)
	floorsAreKept(t, up, urlsOf(startCaddyProcesses(t, 3, up, floorsSite("redis cluster "+strings.Join(c.URLs(), " ")))))
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
