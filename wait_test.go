package ratelimit

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

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
	eachStore(t, admittedAsTheBucketAllows)
}

// So they are on a Redis Cluster, where calls are not coalesced.
func TestOnAClusterWaitingRequestsAreAdmittedAsTheBucketAllows(t *testing.T) {
	admittedAsTheBucketAllows(t, "redis cluster "+strings.Join(sharedCluster(t).URLs(), " "))
}

// On one Redis, the line makes about one call per waited request: the
// head that is admitted hands the next refill's moment on, and the next
// sleeps until then before its call.
func admittedAsTheBucketAllows(t *testing.T, store string) {
	up := newFakeUpstream(t, answerWithoutUsage)
	gw := startGateway(t, up.URL, limited(flightStore(store), `
		scope key {http.request.header.X-Api-Key}
		limit key * rate 10 burst 1
		wait 2s
		on_redis_error deny`))
	url, single := strings.CutPrefix(store, "redis redis://")
	calls := int64(0)
	if single {
		url = "redis://" + url
		calls = redistest.ScriptCalls(t, url)
	}
	for i, res := range burstOf(t, gw, redistest.UniqueID(t), 20) {
		if res.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d, want every one admitted after its wait", i, res.StatusCode)
		}
	}
	times := up.arrivals()
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
	if single {
		// The first call admits one and refuses those that came with it.
		if n := redistest.ScriptCalls(t, url) - calls; n > 20+3 {
			t.Fatalf("%d Redis calls for 20 requests of which 19 waited: want about one each", n)
		}
	}
}

// With wait 500ms, those of 20 requests at once that cannot be admitted
// within 500 ms are refused, with the wait that is then true, beyond what
// they could still wait.
func TestARequestThatCannotFitWithinWaitIsRefusedWithTheWaitThenTrue(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw := waitingGateway(t, store, "rate 10 burst 1", "500ms")
		start := time.Now()
		admitted := 0
		for i, res := range burstOf(t, gw, redistest.UniqueID(t), 20) {
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

// A client that hangs up while its request waits ends the wait: the
// request is charged nothing and no longer counts as waiting. So it does
// whether the limiter had read its body already (a chain that reserves
// tokens reads it) or not (a chain of requests alone, or a body it cannot
// read, content-encoded): Go's server notices a departed client only once
// the body was read to its end.
func TestAClientThatHangsUpWhileWaitingIsChargedNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		for _, c := range []struct {
			what, caps string
			encoding   string
		}{
			{"a chain that reads the body to reserve", "tpm 100000", ""},
			{"a chain that does not read the body", "", ""},
			{"a body it cannot read", "tpm 100000", "gzip"},
		} {
			t.Run(c.what, func(t *testing.T) {
				gw := waitingGateway(t, store, "rate 0.1 burst 1 "+c.caps, "20s")
				key := spentKey(t, gw)
				l := capsLimit(t, LimitConfig{Scope: "key", ID: limiter.KeyID(false, key), Rate: "0.1", Burst: 1, Cost: 1})
				if c.caps != "" {
					l.Windows[limiter.TPM], l.Capped = 100000, l.Windows.Mask()|1<<limiter.TPM
				}
				first := peekInStore(t, store, l).Counts[0]
				hangUp := sendWaiting(t, gw, key, c.encoding)
				if err := hangUp(); err == nil {
					t.Fatal("the hung-up request was answered")
				}
				waitWaiting(t, 0)
				if c := peekInStore(t, store, l).Counts[0]; c.Deficit > first.Deficit || c.Window[limiter.TPM] != first.Window[limiter.TPM] {
					t.Fatalf("after the hang-up the key holds %+v, before it %+v: want the first request alone", c, first)
				}
			})
		}
	})
}

// waitingGateway is a gateway in front of newArrivals whose key scope has
// caps, with wait, on store failing closed with a 2 s timeout: a store
// that fails answers 503, not an uncounted admission.
func waitingGateway(t *testing.T, store, caps, wait string) *gateway {
	t.Helper()
	return startGateway(t, newFakeUpstream(t, answerWithoutUsage).URL, limited(flightStore(store), `
		scope key {http.request.header.X-Api-Key}
		limit key * `+caps+`
		wait `+wait+`
		on_redis_error deny`))
}

// spentKey is a new key whose first request gw admitted.
func spentKey(t *testing.T, gw *gateway) string {
	t.Helper()
	key := redistest.UniqueID(t)
	if res, _ := gw.do(t, "X-Api-Key: "+key); res.StatusCode != http.StatusOK {
		t.Fatalf("first request: %d", res.StatusCode)
	}
	return key
}

// waitWaiting waits until want requests wait, as the goroutines that send
// them make them.
func waitWaiting(t *testing.T, want int64) {
	t.Helper()
	waitCount(t, "requests waiting", waitingRequests.Load, want)
}

// sendWaiting sends a request of key that must wait, its body with the
// given Content-Encoding (none if ""), returns once it waits, and gives the
// function that hangs it up and returns its error.
func sendWaiting(t *testing.T, gw *gateway, key, encoding string) (hangUp func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	before := waitingRequests.Load()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", gw.url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		req.Header.Set("X-Api-Key", key)
		req.Header.Set("Content-Type", "application/json")
		if encoding != "" {
			req.Header.Set("Content-Encoding", encoding)
		}
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		done <- err
	}()
	waitWaiting(t, before+1)
	return func() error {
		cancel()
		return <-done
	}
}

// Past max_waiting a request that could wait is refused at once; and so is,
// however long it could wait, a request too large for a cap, one refused
// by a spent budget, and one whose body is longer than the limiter reads
// (its client's departure would go unnoticed while it waited).
func TestPastMaxWaitingOrTooLargeARequestIsRefusedAtOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw := startGateway(t, newFakeUpstream(t, answerWithoutUsage).URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			scope team {http.request.header.X-Team}
			limit key * rate 0.1 burst 1
			limit team * budget_day 0.01
			price m input 1 output 4
			wait 20s
			max_waiting 1`))
		key, team := redistest.UniqueID(t), redistest.UniqueID(t)
		send := func(body string, headers ...string) (*http.Response, []byte) {
			return gw.send(t, "POST", "/v1/chat/completions", body, append(headers, "Content-Type: application/json")...)
		}
		if res, got := send(`{"model":"m"}`, "X-Api-Key: "+key); res.StatusCode != http.StatusOK {
			t.Fatalf("first request: %d %s", res.StatusCode, got)
		}
		// 2400 output tokens at $4 per million reserve $0.0096 of the $0.01.
		if res, got := send(`{"model":"m","max_tokens":2400}`, "X-Api-Key: "+redistest.UniqueID(t), "X-Team: "+team); res.StatusCode != http.StatusOK {
			t.Fatalf("the team's first request: %d %s", res.StatusCode, got)
		}
		refusedAtOnce := func(what, body string, headers ...string) {
			t.Helper()
			start := time.Now()
			res, got := send(body, headers...)
			if res.StatusCode != http.StatusTooManyRequests || time.Since(start) > 5*time.Second {
				t.Errorf("%s: %d %s after %v, want a 429 at once", what, res.StatusCode, got, time.Since(start))
			}
		}
		refusedAtOnce("too large", `{"model":"m","max_tokens":200000}`, "X-Api-Key: "+redistest.UniqueID(t), "X-Team: "+redistest.UniqueID(t))
		refusedAtOnce("a spent budget", `{"model":"m","max_tokens":2400}`, "X-Api-Key: "+redistest.UniqueID(t), "X-Team: "+team)
		long := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", maxReadBody) + `"}]}`
		refusedAtOnce("a body longer than the limiter reads", long, "X-Api-Key: "+key)
		hangUp := sendWaiting(t, gw, key, "")
		defer hangUp()
		refusedAtOnce("past max_waiting", `{"model":"m"}`, "X-Api-Key: "+key)
	})
}

// Only a refusal whose exact wait is known and fits what is left of wait
// waits: not one by a spent budget (its renewal is far), nor by a cap on
// requests in flight (no wait is known).
func TestOnlyAWindowsOrABucketsRefusalWithinWaitWaits(t *testing.T) {
	h := &Handler{Wait: caddy.Duration(2 * time.Second)}
	for _, c := range []struct {
		what   string
		ref    limiter.Refusal
		waited time.Duration
		waits  bool
	}{
		{"a bucket's, within wait", limiter.Refusal{Kind: limiter.Burst, WaitMillis: 100}, 0, true},
		{"a window's, past what is left", limiter.Refusal{Kind: limiter.Requests, WaitMillis: 600}, 1500 * time.Millisecond, false},
		{"a spent budget's", limiter.Refusal{Kind: limiter.Budget, WaitMillis: 100, Exhausted: true}, 0, false},
		{"a concurrency cap's", limiter.Refusal{Kind: limiter.Concurrency, UntilFreed: true}, 0, false},
	} {
		if _, waits := h.waitFor(c.ref, c.waited); waits != c.waits {
			t.Errorf("%s: waits %v, want %v", c.what, waits, c.waits)
		}
	}
	if _, waits := new(Handler).waitFor(limiter.Refusal{Kind: limiter.Burst, WaitMillis: 1}, 0); waits {
		t.Error("a handler without wait waited")
	}
}

// A flood of new requests does not overtake one that waits: they stand in
// line behind it, and it is admitted first.
func TestNewRequestsStandInLineBehindOneThatWaits(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw := waitingGateway(t, store, "rate 5 burst 1", "5s")
		key := spentKey(t, gw)
		var mu sync.Mutex
		var order []string
		var wg sync.WaitGroup
		send := func(who string) {
			wg.Go(func() {
				if res, _ := gw.do(t, "X-Api-Key: "+key); res.StatusCode == http.StatusOK {
					mu.Lock()
					order = append(order, who)
					mu.Unlock()
				}
			})
		}
		send("waiter")
		waitWaiting(t, 1)
		for range 5 {
			send("flood")
		}
		wg.Wait()
		if len(order) != 6 || order[0] != "waiter" {
			t.Fatalf("admitted in the order %v: want the one that waited first, then the 5 others", order)
		}
	})
}

// A limit's line gives the turn to its waiters in the order they joined:
// the head at once, each next one when the one before it leaves, whether
// it leaves from the head or from within the line; and a line of no one is
// no line.
func TestALinesWaitersTakeTheirTurnsInTheOrderTheyJoined(t *testing.T) {
	key := "rolter:rl:key:" + redistest.UniqueID(t) + ":"
	turned := func(p *waitPlace) bool {
		select {
		case <-p.turn:
			return true
		default:
			return false
		}
	}
	a, b, c := waitLines.join(key), waitLines.join(key), waitLines.join(key)
	if !turned(a) || turned(b) || turned(c) {
		t.Fatal("only the first to join has the turn")
	}
	if got, ok := waitLines.lineOf([]limiter.Limit{{Prefix: "other"}, {Prefix: key}}); !ok || got != key {
		t.Fatalf("lineOf = %q, %v: want the chain's limit that has a line", got, ok)
	}
	b.leave(time.Time{}) // from within the line: nobody's turn changes
	if turned(c) {
		t.Fatal("a waiter leaving from within the line gave the turn away")
	}
	next := time.Now().Add(time.Second)
	a.leave(next)
	a.leave(time.Time{}) // once only
	if !turned(c) || !c.handed.Equal(next) {
		t.Fatal("the head left, and the next in line did not get the turn and the moment it handed on")
	}
	c.leave(time.Time{})
	if _, ok := waitLines.lineOf([]limiter.Limit{{Prefix: key}}); ok {
		t.Fatal("an empty line is still a line")
	}
}

// A minute window's refusal is held exactly as long as the Retry-After a
// gateway without wait gives in the same state, and one whose wait is
// beyond wait is answered at once with that Retry-After: a request window,
// and a token window that a request reserves on. Windows slide: rpm 60
// spent at second 58 of a minute frees a request only a second into the
// next (60 × 59/60 = 59 then), and so does tpm 5400 spent by 60 requests
// reserving 90 tokens each (5400 × 59/60 + 90 = 5400); the test spends them
// then, and each store's three routes (no wait, wait 10s, wait 1s) share
// its counters. Rather than wait for second 58, the stores' clocks are
// moved there, by an offset that stays put while the waits elapse.
func TestAMinuteWindowsRefusalIsHeldExactlyItsRetryAfter(t *testing.T) {
	var offset atomic.Int64 // milliseconds added to this machine's clock
	moved := func() time.Time { return time.Now().Add(time.Duration(offset.Load()) * time.Millisecond) }
	moveClocks(t, func() int64 { return moved().UnixMilli() },
		limiter.RedisClock{Gateway: moved, Script: func(at time.Time) string { return limiter.HexArg(at.UnixMilli()) }})
	stores := map[string]string{"memory": ""}
	if redistest.Enabled() {
		stores["redis"] = "redis " + redistest.NewServer(t).URL()
	}
	var site strings.Builder
	for name, store := range stores {
		for route, wait := range map[string]string{"refuse": "", "wait": "wait 10s", "short": "wait 1s"} {
			// A store that fails answers 503, not an uncounted admission.
			fmt.Fprintf(&site, "\t@%s-%s header X-Route %[1]s-%[2]s\n\thandle @%[1]s-%[2]s {\n%s\t}\n", name, route, limited(flightStore(store), `
				scope key {http.request.header.X-Api-Key}
				scope team {http.request.header.X-Team}
				limit key * rpm 60
				limit team * tpm 5400
				on_redis_error deny
				`+wait))
		}
	}
	gw := startGateway(t, newFakeUpstream(t, answerWithoutUsage).URL, site.String())
	// Each subject is a request of one id: of a key, counted in requests,
	// and of a team, reserving 90 tokens (no input, its max_tokens).
	type subject struct{ store, header, body string }
	subjectName := func(s subject) string { return s.store + ", " + strings.TrimSuffix(strings.Fields(s.header)[0], ":") }
	var subjects []subject
	for name := range stores {
		subjects = append(subjects, subject{name, "X-Api-Key: " + redistest.UniqueID(t), `{"model":"m"}`},
			subject{name, "X-Team: " + redistest.UniqueID(t), `{"model":"m","max_tokens":90}`})
	}
	at := func(s subject, route string) (res *http.Response, sent, answered time.Time) {
		sent = time.Now()
		res, _ = gw.send(t, "POST", "/v1/chat/completions", s.body, s.header, "Content-Type: application/json", "X-Route: "+s.store+"-"+route)
		return res, sent, time.Now()
	}
	retryAfter := func(what string, res *http.Response) time.Duration {
		ms, err := strconv.ParseInt(res.Header.Get("Retry-After-Ms"), 10, 64)
		if res.StatusCode != http.StatusTooManyRequests || err != nil {
			t.Fatalf("%s at second %v of the minute: %d, retry-after-ms %q: want a refusal with its wait", what,
				time.Duration(moved().UnixMilli()%60_000)*time.Millisecond, res.StatusCode, res.Header.Get("Retry-After-Ms"))
		}
		return time.Duration(ms) * time.Millisecond
	}

	// Second 58 of a minute, by the stores' clocks.
	offset.Store((58_000 - time.Now().UnixMilli()%60_000 + 60_000) % 60_000)
	var wg sync.WaitGroup
	for _, s := range subjects {
		for range 60 {
			wg.Go(func() {
				if res, _, _ := at(s, "refuse"); res.StatusCode != http.StatusOK {
					t.Errorf("%s, %s: spending the minute: %d", s.store, s.header, res.StatusCode)
				}
			})
		}
	}
	wg.Wait()
	type held struct {
		expected, took time.Duration
		status         int
	}
	results := make([]held, len(subjects))
	for i, s := range subjects {
		what := subjectName(s)
		res, _, answered := at(s, "refuse")
		wait := retryAfter(what+" without wait", res)
		if wait < 900*time.Millisecond || wait > 3*time.Second {
			t.Fatalf("%s: spent at second 58, the window announces %v, want until a second into the next minute", what, wait)
		}
		res, sent, short := at(s, "short")
		if got, want := retryAfter(what+" with wait 1s", res), wait-sent.Sub(answered); short.Sub(sent) > 100*time.Millisecond || (got-want).Abs() > 10*time.Millisecond {
			t.Errorf("%s: with wait 1s, answered after %v with a wait of %v: want at once, with the %v then true", what, short.Sub(sent), got, want)
		}
		results[i].expected = wait - time.Since(answered)
		wg.Go(func() {
			res, sent, done := at(s, "wait")
			results[i].took, results[i].status = done.Sub(sent), res.StatusCode
		})
	}
	wg.Wait()
	for i, h := range results {
		what := subjectName(subjects[i])
		t.Logf("%s: held %v for a Retry-After of %v", what, h.took, h.expected)
		if h.status != http.StatusOK || (h.took-h.expected).Abs() > 25*time.Millisecond {
			t.Errorf("%s: with wait 10s, %d after %v: want admitted after the %v a gateway without wait announced", what, h.status, h.took, h.expected)
		}
	}
}

// Three gateway processes with wait on one Redis admit, together, exactly
// what one bucket allows: 24 requests at once against rate 10 burst 1 are
// all admitted within wait 3s, and never faster than one each 100 ms: the
// i-th to reach the upstream reaches it at least i-1 refills after the
// first, less what the gateways' own handling may delay one request more
// than another (each arrival's jitter, which does not add up).
// Each process's head of line makes one call when the bucket refills (an
// admitted head hands the next refill's moment to the one after it), and
// one of them is admitted: the calls per waited request stay near the
// processes' number, never one per waiter.
func TestThreeGatewayProcessesWithWaitOnOneRedisAdmitExactlyWhatTheBucketAllows(t *testing.T) {
	redis := redistest.NewServer(t)
	up := newFakeUpstream(t, answerWithoutUsage)
	bin := caddyBinary(t)
	site := limited(flightStore("redis "+redis.URL()), `
		scope key {http.request.header.X-Api-Key}
		limit key * rate 10 burst 1
		wait 3s
		on_redis_error deny`)
	gws := make([]*caddyProcess, 3)
	for i := range gws {
		gws[i] = startCaddyProcess(t, bin, up.URL, site)
	}
	key, calls := redistest.UniqueID(t), redistest.ScriptCalls(t, redis.URL())
	const perGateway = 8
	var wg sync.WaitGroup
	statuses := make(chan int, len(gws)*perGateway)
	for _, gw := range gws {
		for range perGateway {
			wg.Go(func() {
				req, _ := http.NewRequest("POST", gw.url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
				req.Header.Set("X-Api-Key", key)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				res.Body.Close()
				statuses <- res.StatusCode
			})
		}
	}
	wg.Wait()
	close(statuses)
	for status := range statuses {
		if status != http.StatusOK {
			t.Fatalf("a request got %d: want all %d admitted within wait", status, len(gws)*perGateway)
		}
	}
	times := up.arrivals()
	const jitter = 40 * time.Millisecond
	for i := 1; i < len(times); i++ {
		if since := times[i].Sub(times[0]); since < time.Duration(i)*100*time.Millisecond-jitter {
			t.Fatalf("request %d reached the upstream %v after the first: the bucket allows one each 100 ms", i, since)
		}
	}
	n := len(times)
	perRequest := float64(redistest.ScriptCalls(t, redis.URL())-calls) / float64(n)
	t.Logf("%.2f Redis calls per waited request, %d requests over %v on %d processes", perRequest, n, times[n-1].Sub(times[0]), len(gws))
	if perRequest > float64(len(gws)+1) {
		t.Fatalf("%.2f Redis calls per waited request: want about one per process and release", perRequest)
	}
}

// A head admitted hands on when its limit admits the next request at the
// earliest: a bucket it emptied, once a token is back; a window with room
// left, at once; any other limit of its chain is not its line's.
func TestAnAdmittedHeadHandsOnWhenItsLimitAdmitsTheNext(t *testing.T) {
	bucket := capsLimit(t, LimitConfig{Scope: "key", ID: "k", Rate: "10", Burst: 1, Cost: 1})
	window := newLimit("org", "o", 5, 0)
	chain := []limiter.Limit{window, bucket}
	d := limiter.Decision{Admitted: true, Now: limiter.MomentAt(time.Now().UnixMilli()), Counts: make([]limiter.Counts, 2)}
	if in := time.Until(nextRelease(chain, d, bucket.Prefix)); in < 90*time.Millisecond || in > 100*time.Millisecond {
		t.Fatalf("a bucket of rate 10 emptied hands on in %v, want 100 ms", in)
	}
	if at := nextRelease(chain, d, window.Prefix); !at.IsZero() {
		t.Fatalf("a window with room left hands on at %v, want at once", at)
	}
}

// A request that waited says how long in {http.rolter_ratelimit.waited_ms}
// and in the histogram of waits, and ends admitted or refused as any
// other: with rate 5 burst 1 and wait 300ms, of two requests sent once the
// bucket is empty, one waits its 200 ms and is admitted, and the other,
// whose turn comes 400 ms on, tries at the end of its 300 ms and is
// refused; one admitted at once waited 0 ms.
func TestAWaitedRequestSaysHowLongItWaitedAndEndsAdmittedOrRefused(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw := startGateway(t, newFakeUpstream(t, answerWithoutUsage).URL, `
	header >X-Outcome "{http.rolter_ratelimit.outcome} waited {http.rolter_ratelimit.waited_ms}"
`+limited(flightStore(store), `
			scope key {http.request.header.X-Api-Key}
			limit key * rate 5 burst 1
			wait 300ms
			on_refusal error
			on_redis_error deny`, `
	handle_errors {
		respond "{http.rolter_ratelimit.outcome} waited {http.rolter_ratelimit.waited_ms}" {err.status_code}
	}`))
		const count = "caddy_rolter_ratelimit_wait_duration_seconds_count"
		before := scrape(t)
		key := redistest.UniqueID(t)
		if res, _ := gw.do(t, "X-Api-Key: "+key); res.StatusCode != http.StatusOK || res.Header.Get("X-Outcome") != "admitted waited 0" {
			t.Fatalf("the first request: %d, X-Outcome %q, want admitted without a wait", res.StatusCode, res.Header.Get("X-Outcome"))
		}
		waited := func(answer string) time.Duration {
			_, ms, _ := strings.Cut(answer, " waited ")
			n, err := strconv.ParseInt(ms, 10, 64)
			if err != nil {
				t.Fatalf("%q: want how long it waited, in milliseconds", answer)
			}
			return time.Duration(n) * time.Millisecond
		}
		var admitted, refused []time.Duration
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				res, body := gw.do(t, "X-Api-Key: "+key)
				mu.Lock()
				defer mu.Unlock()
				switch outcome := res.Header.Get("X-Outcome"); {
				case res.StatusCode == http.StatusOK && strings.HasPrefix(outcome, "admitted waited "):
					admitted = append(admitted, waited(outcome))
				case res.StatusCode == http.StatusTooManyRequests && strings.HasPrefix(body, "refused waited "):
					refused = append(refused, waited(body))
				default:
					t.Errorf("%d %q, X-Outcome %q", res.StatusCode, body, outcome)
				}
			})
		}
		wg.Wait()
		if len(admitted) != 1 || len(refused) != 1 || admitted[0] < 150*time.Millisecond || admitted[0] > 280*time.Millisecond ||
			refused[0] < 280*time.Millisecond || refused[0] > 400*time.Millisecond {
			t.Fatalf("admitted after %v, refused after %v: want one admitted after about 200 ms, one refused after about 300 ms", admitted, refused)
		}
		after := scrape(t)
		if got := after[count] - before[count]; got != 2 {
			t.Fatalf("%s rose by %v, want the 2 that waited", count, got)
		}
		if after["caddy_rolter_ratelimit_waiting_requests"] != 0 {
			t.Fatal("requests are still counted as waiting")
		}
	})
}

// A client slow to send its body holds no waiting place for longer than a
// wait: a request that could wait (a second, within wait 2s) but whose
// body has not all come by the end of wait is refused then, and no longer
// counts as waiting.
func TestAClientSlowToSendItsBodyIsRefusedAtTheEndOfWait(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw := waitingGateway(t, store, "rate 1 burst 1", "2s")
		key := spentKey(t, gw)
		// Go's client buffers a request until its body is sent: this one
		// writes its headers and part of its body, then nothing.
		conn, err := net.Dial("tcp", strings.TrimPrefix(gw.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		start := time.Now()
		conn.SetDeadline(start.Add(10 * time.Second))
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nX-Api-Key: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":\"m\",", key)
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if took := time.Since(start); res.StatusCode != http.StatusTooManyRequests || took < 1900*time.Millisecond || took > 3*time.Second {
			t.Fatalf("%d after %v: want a 429 at the end of wait 2s", res.StatusCode, took)
		}
		waitWaiting(t, 0)
	})
}

// A waiting place is held only while its request waits: requests of a key
// that has a line of waiters, whose clients send their headers and then
// nothing of their bodies, are asked for their bodies but hold no place
// among max_waiting meanwhile, whether they found the line before any
// refusal or not.
func TestAnIdleUploadHoldsNoWaitingPlace(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw := startGateway(t, newFakeUpstream(t, answerWithoutUsage).URL, limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rate 0.5 burst 1
			wait 3s
			max_waiting 4`))
		key := spentKey(t, gw)
		before := waitingRequests.Load()
		hangUp := sendWaiting(t, gw, key, "")
		defer hangUp()
		for range 3 {
			startUpload(t, gw, "127.0.0.1", key, 0).askedForBody(t)
		}
		if n := waitingRequests.Load() - before; n != 1 {
			t.Fatalf("%d requests hold waiting places, want the one that waits: uploads that send nothing hold %d", n, n-1)
		}
	})
}
