package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// arrivals is an upstream that notes when each request reaches it.
type arrivals struct {
	*httptest.Server
	mu    sync.Mutex
	times []time.Time
}

func newArrivals(t *testing.T) *arrivals {
	a := &arrivals{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.times = append(a.times, time.Now())
		a.mu.Unlock()
		w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(a.Close)
	return a
}

// burstOf sends n requests of key at once and returns their answers.
func burstOf(t *testing.T, gw *gateway, key string, n int) []*http.Response {
	var wg sync.WaitGroup
	answers := make([]*http.Response, n)
	for i := range n {
		wg.Go(func() { answers[i], _ = gw.do(t, "X-Api-Key: "+key) })
	}
	wg.Wait()
	return answers
}

// With wait 2s, 20 requests at once against a bucket of 1 refilled at 10
// a second are all admitted, none refused, each as the bucket allows it:
// the upstream sees them 100 ms apart.
func TestWaitingRequestsAreAdmittedAsTheBucketAllowsInsteadOfRefused(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newArrivals(t)
		gw := startGateway(t, up.URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rate 10 burst 1
			wait 2s`))
		for i, res := range burstOf(t, gw, uniqueID(t), 20) {
			if res.StatusCode != http.StatusOK {
				t.Fatalf("request %d: %d, want every one admitted after its wait", i, res.StatusCode)
			}
		}
		up.mu.Lock()
		times := slices.Clone(up.times)
		up.mu.Unlock()
		slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
		for i, at := range times {
			// The bucket holds one token and refills one each 100 ms: the
			// i-th admission cannot come before i of them have refilled
			// (less a few ms between the store's clock and the upstream's
			// receipt of the first).
			if early := time.Duration(i)*100*time.Millisecond - at.Sub(times[0]); early > 10*time.Millisecond {
				t.Fatalf("request %d reached the upstream %v after the first: %v before the bucket allows", i, at.Sub(times[0]), early)
			}
		}
		if waiting := waitingRequests.Load(); waiting != 0 {
			t.Fatalf("%d requests still counted as waiting", waiting)
		}
	})
}

// With wait 500ms, those of 20 requests at once that cannot be admitted
// within 500 ms are refused, with the wait that is then true, beyond what
// they could still wait.
func TestARequestThatCannotFitWithinWaitIsRefusedWithTheWaitThenTrue(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw := startGateway(t, newArrivals(t).URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rate 10 burst 1
			wait 500ms`))
		start := time.Now()
		admitted := 0
		for i, res := range burstOf(t, gw, uniqueID(t), 20) {
			switch res.StatusCode {
			case http.StatusOK:
				admitted++
			case http.StatusTooManyRequests:
				ms, err := strconv.ParseInt(res.Header.Get("Retry-After-Ms"), 10, 64)
				if err != nil || ms <= 0 || ms > 2000 {
					t.Errorf("refusal %d: retry-after-ms %q, want the bucket's wait", i, res.Header.Get("Retry-After-Ms"))
				}
			default:
				t.Fatalf("request %d: %d", i, res.StatusCode)
			}
		}
		// Tokens come at 0, 100, …, 500 ms: 6 at most within the wait, 5
		// when the last comes a hair after it.
		if admitted < 5 || admitted > 6 {
			t.Fatalf("%d admitted within wait 500ms (in %v), want 5 or 6", admitted, time.Since(start))
		}
	})
}
