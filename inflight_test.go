package ratelimit

// Requests in flight (concurrent, slot_lease: internal/limiter/slots.go), end to end: a real
// Caddy over real HTTP in front of an upstream that holds its requests open
// (X-Upstream: held) and measures how many it had open at once. The tests
// of several gateways, or of one killed with SIGKILL, run each gateway as a
// Caddy process of its own (harness_caddy_test.go).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/poll"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// heldBurst sends n requests at once that the upstream holds, spread over
// the gateways at urls, and returns once every one of them has either been
// answered or reached the upstream: refused holds the answers so far (the
// refused requests'). finish releases the upstream and returns all n
// answers.
func heldBurst(t *testing.T, c *http.Client, urls []string, up *fakeUpstream, n int, headers ...string) (refused []flightAnswer, finish func() []flightAnswer) {
	t.Helper()
	headers = append(slices.Clone(headers), "X-Upstream: "+upstreamHeld)
	return heldBurstOf(t, urls, up, n, func(url string) flightAnswer { return post(c, url, headers...) })
}

// heldBurstOf is heldBurst of the requests that send sends to the gateway
// at url (from any goroutine), which must ask the upstream to hold them.
func heldBurstOf(t *testing.T, urls []string, up *fakeUpstream, n int, send func(url string) flightAnswer) (refused []flightAnswer, finish func() []flightAnswer) {
	t.Helper()
	answers := make(chan flightAnswer, n)
	for i := range n {
		go func() { answers <- send(urls[i%len(urls)]) }()
	}
	deadline := time.NewTimer(waitBound)
	defer deadline.Stop()
	for arrived := 0; arrived+len(refused) < n; {
		select {
		case <-up.arrived:
			arrived++
		case a := <-answers:
			refused = append(refused, a)
		case <-deadline.C:
			t.Fatalf("%d of %d requests reached the upstream or were answered within %v", arrived+len(refused), n, waitBound)
		}
	}
	return refused, func() []flightAnswer {
		t.Helper()
		up.release()
		all := append([]flightAnswer(nil), refused...)
		deadline := time.NewTimer(waitBound)
		defer deadline.Stop()
		for len(all) < n {
			select {
			case a := <-answers:
				all = append(all, a)
			case <-deadline.C:
				t.Fatalf("%d of %d requests answered within %v of their release", len(all), n, waitBound)
			}
		}
		return all
	}
}

// concurrencyRefusalProblem says what is wrong with a, which must be a
// refusal by a concurrency cap of capacity on scope, in OpenAI's shape,
// without a wait and without the id; "" when nothing is.
func concurrencyRefusalProblem(a flightAnswer, scope string, capacity int, id string) string {
	if a.err != nil || a.status != http.StatusTooManyRequests {
		return fmt.Sprintf("%d %s %v, want 429", a.status, a.body, a.err)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		return "Content-Type " + ct
	}
	for _, h := range []string{"Retry-After", "Retry-After-Ms"} {
		if v := a.header.Get(h); v != "" {
			return fmt.Sprintf("%s %q: a concurrency cap knows no wait", h, v)
		}
	}
	var e openAIError
	if err := json.Unmarshal([]byte(a.body), &e); err != nil {
		return fmt.Sprintf("body %q: %v", a.body, err)
	}
	want := fmt.Sprintf("Concurrency limit reached for %s: %d requests in flight. ", scope, capacity)
	if e.Error.Type != "requests" || e.Error.Code != "rate_limit_exceeded" || !strings.Contains(a.body, `"param":null`) ||
		!strings.HasPrefix(e.Error.Message, want) || strings.Contains(a.body, id) {
		return fmt.Sprintf("body %s, want OpenAI's rate_limit_exceeded of type requests, its message starting %q, without the id", a.body, want)
	}
	return ""
}

// mustBeConcurrencyRefusal fails unless a is a refusal by a concurrency cap
// of capacity on scope.
func mustBeConcurrencyRefusal(t *testing.T, what string, a flightAnswer, scope string, capacity int, id string) {
	t.Helper()
	if p := concurrencyRefusalProblem(a, scope, capacity, id); p != "" {
		t.Fatalf("%s: %s", what, p)
	}
}

const slotsHeldMetric = `caddy_rolter_ratelimit_slots_held{scope="%s"}`

// waitSlotsHeld waits until the Caddy whose admin endpoint is on port
// admin reports that it holds want slots of scope's caps: a Redis store
// counts a free when its call is sent, after the response.
func waitSlotsHeld(t *testing.T, admin int, scope string, want float64) {
	t.Helper()
	name := fmt.Sprintf(slotsHeldMetric, scope)
	eventually(t, func() error {
		if got := scrapeAt(t, admin)[name]; got != want {
			return fmt.Errorf("the gateway with admin port %d holds %v slots of %s, want %v", admin, got, scope, want)
		}
		return nil
	})
}

// slotHoldings reads a slots hash of Redis at addr: holder → "n:lease end".
func slotHoldings(t *testing.T, addr, key string) map[string]string {
	t.Helper()
	c := redistest.Client(addr, 2*time.Second)
	defer c.Close()
	h, err := c.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// heldInHash is the slots the holdings hold, leases aside.
func heldInHash(t *testing.T, holdings map[string]string) int64 {
	t.Helper()
	sum := int64(0)
	for holder, v := range holdings {
		n, _, ok := strings.Cut(v, ":")
		slots, err := strconv.ParseInt(n, 10, 64)
		if !ok || err != nil {
			t.Fatalf("holder %s holds %q, want <slots>:<lease end>", holder, v)
		}
		sum += slots
	}
	return sum
}

// waitSlotsKeyEmpty waits until the slots hash key on Redis at addr holds
// nothing: every free has reached Redis.
func waitSlotsKeyEmpty(t *testing.T, addr, key string) {
	t.Helper()
	eventually(t, func() error {
		if h := slotHoldings(t, addr, key); len(h) != 0 {
			return fmt.Errorf("%s still holds %v once every request ended", key, h)
		}
		return nil
	})
}

// redisAddr is the host:port of a redis line's URL.
func redisAddr(t *testing.T, url string) string {
	t.Helper()
	c := redistest.TestClient(t, url)
	return c.Options().Addr
}

// slotsOf is the slots key of the key scope's limit for id, without a
// hash tag.
func slotsOf(id string) string {
	return limiter.SlotsKey(limiter.NewLimit("", "key", limiter.KeyID(false, id), limiter.Caps{}))
}

// flightGatewayOn starts an in-process gateway on loopback whose routes are
// those of limited, on store's flightStore, with on_redis_error deny.
func flightGatewayOn(t *testing.T, up *fakeUpstream, store, lines string, after ...string) *gateway {
	t.Helper()
	return flightGatewayTo(t, up.URL, store, lines, after...)
}

// flightGatewayTo is flightGatewayOn in front of the upstream at
// upstreamURL.
func flightGatewayTo(t *testing.T, upstreamURL, store, lines string, after ...string) *gateway {
	t.Helper()
	return startGatewayWith(t, upstreamURL, "", limited(flightStore(store), lines+"\non_redis_error deny", after...), 0)
}

// capOf5 is the limiter of the tests of concurrent 5 on one key.
const capOf5 = `
			scope key {http.request.header.X-Api-Key}
			limit key * concurrent 5`

// sixtyAgainstFive races 60 requests of one key (with the header lines
// more) against its concurrent 5 through the gateways at urls (whose admin
// endpoints are on the ports admins; redisAt is the Redis node that holds
// the slots key, "" for the in-process store), and checks that exactly 5
// were in flight, that the others were refused as they should be, and that
// every slot is free once all have ended.
func sixtyAgainstFive(t *testing.T, urls []string, admins []int, up *fakeUpstream, redisAt, slots, key string, more ...string) {
	t.Helper()
	c := flightClient(t)
	headers := append([]string{"X-Api-Key: " + key}, more...)
	refused, finish := heldBurst(t, c, urls, up, 60, headers...)
	if open, peak := up.open.Load(), up.peak.Load(); open != 5 || peak != 5 {
		t.Fatalf("the upstream has %d requests open and had at most %d, want exactly 5 of 60 under concurrent 5", open, peak)
	}
	if redisAt != "" {
		if n := heldInHash(t, slotHoldings(t, redisAt, slots)); n != 5 {
			t.Errorf("%s holds %d slots with 5 requests in flight", slots, n)
		}
	}
	bad := 0
	for _, a := range refused {
		if p := concurrencyRefusalProblem(a, "key", 5, key); p != "" {
			if bad++; bad == 1 {
				t.Errorf("a refused request: %s", p)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d refused requests were not concurrency refusals", bad, len(refused))
	}
	if got := statuses(finish()); got[200] != 5 || got[429] != 55 || len(got) != 2 {
		t.Fatalf("statuses %v, want 5 × 200 and 55 × 429 (a 503 is a store failure)", got)
	}
	if peak := up.peak.Load(); peak != 5 {
		t.Fatalf("the upstream had %d requests open at once, want at most 5", peak)
	}

	// Every slot is free once all have ended: five new requests are in
	// flight at once again, and a sixth is refused.
	for _, admin := range admins {
		waitSlotsHeld(t, admin, "key", 0)
	}
	refused, finish = heldBurst(t, c, urls, up, 6, headers...)
	if len(refused) != 1 || up.open.Load() != 5 {
		t.Fatalf("after all ended, %d of 6 new requests in flight and %d refused, want 5 and 1: the slots were not all freed", up.open.Load(), len(refused))
	}
	mustBeConcurrencyRefusal(t, "the sixth new request", refused[0], "key", 5, key)
	if got := statuses(finish()); got[200] != 5 {
		t.Fatalf("statuses of the new requests %v, want 5 × 200", got)
	}
	for _, admin := range admins {
		waitSlotsHeld(t, admin, "key", 0)
	}
	if redisAt != "" {
		waitSlotsKeyEmpty(t, redisAt, slots)
	}
	if peak := up.peak.Load(); peak != 5 {
		t.Fatalf("the upstream had %d requests open at once, want at most 5", peak)
	}
}

func TestSixtyRequestsAgainstConcurrent5PutExactly5InFlightAndFreeEverySlot(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := flightGatewayOn(t, up, store, capOf5)
		key := "sk-" + redistest.UniqueID(t)
		addr := ""
		if store != "" {
			addr = redisAddr(t, redistest.EnvURL(t))
		}
		sixtyAgainstFive(t, []string{gw.url}, []int{caddyAdmin()}, up, addr, slotsOf(key), key)
	})
}

func TestThreeGatewayProcessesOnRedisPutExactly5Of60InFlightAndFreeEverySlot(t *testing.T) {
	url := redistest.EnvURL(t)
	up := newUpstream(t)
	gws := startCaddyProcesses(t, 3, up, limited(flightStore("redis "+url), capOf5+"\non_redis_error deny"))
	key := "sk-" + redistest.UniqueID(t)
	sixtyAgainstFive(t, urlsOf(gws), adminsOf(gws), up, redisAddr(t, url), slotsOf(key), key)
}

// A slot is freed however its request ends: a client that hangs up
// mid-stream, an upstream that closes the connection mid-stream, an
// upstream 500.
func TestASlotIsFreedWhenTheClientHangsUpTheUpstreamCutsTheStreamOrAnswers500(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := flightGatewayOn(t, up, store, `
			scope key {http.request.header.X-Api-Key}
			limit key * concurrent 1`)
		c := flightClient(t)
		key := "sk-" + redistest.UniqueID(t)
		header := "X-Api-Key: " + key
		waitSlotsHeld(t, caddyAdmin(), "key", 0)

		// The client hangs up after the first event.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", gw.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
		setHeaders(req, []string{header, "X-Upstream: " + upstreamSSE})
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(res.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("first line of the stream %q %v", line, err)
		}
		if got := scrape(t)[fmt.Sprintf(slotsHeldMetric, "key")]; got != 1 {
			t.Fatalf("slots held during the stream: %v, want 1", got)
		}
		mustBeConcurrencyRefusal(t, "a request during the stream", post(c, gw.url, header, "X-Upstream: "+upstreamFast), "key", 1, key)
		cancel()
		res.Body.Close()
		waitSlotsHeld(t, caddyAdmin(), "key", 0)
		mustPost(t, c, gw.url, 200, "the request after the client hung up", header, "X-Upstream: "+upstreamFast)

		// The upstream closes the connection after the first event.
		if a := post(c, gw.url, header, "X-Upstream: "+upstreamCut); a.err == nil {
			t.Fatalf("a stream the upstream cut reached the client whole: %d %q", a.status, a.body)
		}
		waitSlotsHeld(t, caddyAdmin(), "key", 0)
		mustPost(t, c, gw.url, 200, "the request after the upstream cut the stream", header, "X-Upstream: "+upstreamFast)

		// The upstream answers 500: its slot is free by the time the
		// client has the answer.
		mustPost(t, c, gw.url, 500, "the upstream's 500", header, "X-Upstream: "+upstream500)
		mustPost(t, c, gw.url, 200, "the request right after the upstream's 500", header, "X-Upstream: "+upstreamFast)
		waitSlotsHeld(t, caddyAdmin(), "key", 0)
	})
}

// twoLeasesGateway starts an in-process gateway on store whose two
// handlers cap the key scope's requests in flight at concurrent: one for
// the requests with the header X-Lease: long, under the default lease
// (30 s), and one for the others, under slot_lease 1s.
func twoLeasesGateway(t *testing.T, up *fakeUpstream, store string, concurrent int) *gateway {
	t.Helper()
	return startGatewayWith(t, up.URL, "", fmt.Sprintf(`
	@long header X-Lease long
	@short not header X-Lease long
	rolter_ratelimit @long {
		%[1]s
		scope key {http.request.header.X-Api-Key}
		limit key * concurrent %[2]d
		on_redis_error deny
	}
	rolter_ratelimit @short {
		%[1]s
		scope key {http.request.header.X-Api-Key}
		limit key * concurrent %[2]d
		slot_lease 1s
		on_redis_error deny
	}
	reverse_proxy {upstream}`, flightStore(store), concurrent), 0)
}

// A stream that lasts three leases keeps its slot all along: the store
// renews it every third of a lease, even while it holds a slot of another
// handler's longer lease (the default 30s), which it renews ten times less
// often.
func TestAStreamLastingThreeLeasesKeepsItsSlotAllAlong(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		const lease = time.Second
		up := newUpstream(t)
		gw := twoLeasesGateway(t, up, store, 1)
		c := flightClient(t)
		key := "sk-" + redistest.UniqueID(t)
		header := "X-Api-Key: " + key
		refused, finishLong := heldBurst(t, c, []string{gw.url}, up, 1, "X-Api-Key: sk-"+redistest.UniqueID(t), "X-Lease: long")
		if len(refused) != 0 {
			t.Fatalf("the request of the longer lease: %d %s", refused[0].status, refused[0].body)
		}
		req, _ := http.NewRequest("POST", gw.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
		setHeaders(req, []string{header, "X-Upstream: " + upstreamSSE, "X-Hold: 3500ms"})
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		stream := bufio.NewReader(res.Body)
		if line, err := stream.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("first line of the stream %q %v", line, err)
		}
		started := time.Now()
		var rest []byte
		ended := make(chan error, 1)
		go func() {
			var err error
			rest, err = io.ReadAll(stream)
			ended <- err
		}()
		// Waiting on the clock is the point: a slot whose lease were not
		// renewed would be free after 1 s.
		for _, at := range []time.Duration{lease / 5, lease + lease/5, 2*lease + lease/5, 3*lease + lease/20} {
			time.Sleep(time.Until(started.Add(at)))
			select {
			case err := <-ended:
				t.Fatalf("the stream ended %v after it started (%v), before the probe at %v", time.Since(started), err, at)
			default:
			}
			mustBeConcurrencyRefusal(t, fmt.Sprintf("a request %v into the stream", at), post(c, gw.url, header, "X-Upstream: "+upstreamFast), "key", 1, key)
		}
		select {
		case err := <-ended:
			if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
				t.Fatalf("the stream ended with %q %v", rest, err)
			}
		case <-time.After(waitBound):
			t.Fatal("the stream did not end")
		}
		t.Logf("the stream lasted %v", time.Since(started).Round(time.Millisecond))
		mustPost(t, c, gw.url, 200, "the request right after the stream ended", header, "X-Upstream: "+upstreamFast)
		if got := statuses(finishLong()); got[200] != 1 {
			t.Fatalf("the request of the longer lease: %v", got)
		}
	})
}

// A gateway killed while it holds slots (SIGKILL: nothing is freed) loses
// them once their lease has passed: another gateway refuses at first, then
// admits again within a lease and a margin.
func TestAGatewayKilledWhileHoldingSlotsLosesThemWithinALease(t *testing.T) {
	const lease = time.Second
	url := redistest.EnvURL(t)
	addr := redisAddr(t, url)
	up := newUpstream(t)
	gws := startCaddyProcesses(t, 2, up, limited(flightStore("redis "+url), capOf5+"\nslot_lease 1s\non_redis_error deny"))
	killed, survivor := gws[0], gws[1]
	c := flightClient(t)
	key := "sk-" + redistest.UniqueID(t)
	header := "X-Api-Key: " + key
	slots := slotsOf(key)
	refused, finish := heldBurst(t, c, []string{killed.url}, up, 5, header)
	if len(refused) != 0 {
		t.Fatalf("%d of 5 requests refused under concurrent 5", len(refused))
	}
	if h := slotHoldings(t, addr, slots); len(h) != 1 || heldInHash(t, h) != 5 {
		t.Fatalf("%s holds %v, want one holder of 5 slots", slots, h)
	}
	mustBeConcurrencyRefusal(t, "a request to the other gateway", post(c, survivor.url, header, "X-Upstream: "+upstreamFast), "key", 5, key)

	at := killed.kill(t)
	a := post(c, survivor.url, header, "X-Upstream: "+upstreamFast)
	mustBeConcurrencyRefusal(t, "the first request to the other gateway after the kill", a, "key", 5, key)
	var took time.Duration
	err := poll.Until(5*lease-time.Since(at), pollEvery, func() error {
		sent := time.Now()
		a = post(c, survivor.url, header, "X-Upstream: "+upstreamFast)
		if a.err == nil && a.status == 200 {
			took = sent.Sub(at)
			return nil
		}
		if p := concurrencyRefusalProblem(a, "key", 5, key); p != "" {
			t.Fatalf("a request to the other gateway after the kill: %s", p)
		}
		return errors.New("refused")
	})
	if err != nil {
		t.Fatalf("the killed gateway's slots still held %v after the kill", time.Since(at))
	}
	t.Logf("the killed gateway's 5 slots were free %v after the kill (slot_lease %v)", took.Round(time.Millisecond), lease)
	if took > lease+lease/2 {
		t.Errorf("the killed gateway's slots held %v after the kill, want at most the lease and a margin (%v)", took, lease+lease/2)
	}
	if got := statuses(finish()); got[0] != 5 {
		t.Fatalf("the killed gateway's clients got %v, want 5 without an answer", got)
	}
	// All 5 lapsed, not just one, and the survivor removed the dead holder.
	refused, finish = heldBurst(t, c, []string{survivor.url}, up, 6, header)
	if len(refused) != 1 {
		t.Fatalf("%d of 6 requests to the survivor refused, want 1", len(refused))
	}
	mustBeConcurrencyRefusal(t, "the sixth request to the survivor", refused[0], "key", 5, key)
	if got := statuses(finish()); got[200] != 5 {
		t.Fatalf("statuses %v, want 5 × 200", got)
	}
	waitSlotsKeyEmpty(t, addr, slots)
}

// A realtime session holds its slot for its whole life.
func TestARealtimeSessionHoldsOneSlotUntilItCloses(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		waitOpenSessions(t, 0)
		up := newUpstream(t)
		gw := flightGatewayOn(t, up, store, `
			scope key {http.request.header.Authorization}
			limit key * concurrent 1`)
		id := realtimeIDs(t)
		conn := mustDial(t, gw, id)
		if err := conn.WriteMessage(websocket.TextMessage, []byte("echo")); err != nil {
			t.Fatal(err)
		}
		if _, msg, err := conn.ReadMessage(); err != nil || string(msg) != "echo" {
			t.Fatalf("the session's echo: %q %v", msg, err)
		}
		c := flightClient(t)
		header := "Authorization: " + id.key
		mustBeConcurrencyRefusal(t, "a request while the session is open", post(c, gw.url, header, "X-Upstream: "+upstreamFast), "key", 1, id.key)
		if _, status, body := dial(t, gw, id, false); status != 429 || !strings.Contains(body, "Concurrency limit reached") {
			t.Fatalf("a second session while one is open: %d %s, want 429", status, body)
		}
		closeAndWait(t, conn)
		mustPost(t, c, gw.url, 200, "the request right after the session closed", header, "X-Upstream: "+upstreamFast)
	})
}

// slotsInStore is how many slots of l every holder holds in store (a redis
// line, or "" for the in-process store), read as an admission reads them.
func slotsInStore(t *testing.T, storeLine string, l limiter.Limit) int64 {
	t.Helper()
	return peekInStore(t, storeLine, l).Counts[0].Slots
}

// peekInStore reads l's counters in the store of a gateway's store line
// ("" for the in-process store).
func peekInStore(t *testing.T, storeLine string, l limiter.Limit) limiter.Decision {
	t.Helper()
	var s limiter.Store
	if storeLine == "" {
		m, release, err := acquireMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		s = m
	} else {
		r, release, err := acquireRedisStore(&RedisConfig{URL: strings.TrimPrefix(storeLine, "redis ")}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		s = r
	}
	d, err := s.Peek(context.Background(), []limiter.Limit{l})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Through Caddy, with rpm 2 and concurrent 1 on one limit: a request
// refused by the slot counts no request, and one refused by rpm takes no
// slot.
func TestARefusalByTheSlotTakesNoRPMAndARefusalByRPMTakesNoSlot(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		gw := flightGatewayOn(t, up, store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rpm 2 concurrent 1`)
		c := flightClient(t)
		key := "sk-" + redistest.UniqueID(t)
		header := "X-Api-Key: " + key
		l := capsLimit(t, LimitConfig{Scope: "key", ID: limiter.KeyID(false, key), RPM: 2, Concurrent: 1})

		refused, finish := heldBurst(t, c, []string{gw.url}, up, 1, header)
		if len(refused) != 0 {
			t.Fatalf("the first request was refused: %d %s", refused[0].status, refused[0].body)
		}
		mustBeConcurrencyRefusal(t, "a second request while the first is in flight", post(c, gw.url, header, "X-Upstream: "+upstreamFast), "key", 1, key)
		if n := windowHolds(t, store, l, limiter.RPM); n != 1 {
			t.Fatalf("rpm counts %d requests after a refusal by the slot, want the admitted one's 1", n)
		}
		if got := statuses(finish()); got[200] != 1 {
			t.Fatalf("the first request: %v", got)
		}
		mustPost(t, c, gw.url, 200, "a third request, the second of rpm 2", header, "X-Upstream: "+upstreamFast)

		a := post(c, gw.url, header, "X-Upstream: "+upstreamFast)
		var e openAIError
		if a.err != nil || a.status != 429 || json.Unmarshal([]byte(a.body), &e) != nil || !strings.HasPrefix(e.Error.Message, "Rate limit reached for key: limit 2 RPM") || a.header.Get("Retry-After") == "" {
			t.Fatalf("a fourth request over rpm 2: %d %s %v, want 429 by rpm with Retry-After", a.status, a.body, a.err)
		}
		if n := windowHolds(t, store, l, limiter.RPM); n != 2 {
			t.Fatalf("rpm counts %d requests, want 2", n)
		}
		if n := slotsInStore(t, store, l); n != 0 {
			t.Fatalf("%d slots held after a refusal by rpm with nothing in flight, want 0", n)
		}
		waitSlotsHeld(t, caddyAdmin(), "key", 0)
	})
}

// On Redis Cluster a chain's slots live in its root's hash slot, and three
// gateways, each with its own cluster client, cap requests in flight
// exactly.
func TestOnRedisClusterSlotsLiveInTheChainRootsSlotAndThreeGatewaysCapExactly(t *testing.T) {
	c := sharedCluster(t)
	up := newUpstream(t)
	gws := startCaddyProcesses(t, 3, up, limited(flightStore("redis cluster "+strings.Join(c.URLs(), " ")), `
			scope key {http.request.header.X-Api-Key}
			scope org {http.request.header.X-Org} readable
			limit key * concurrent 5
			on_redis_error deny`))
	key, org := "sk-"+redistest.UniqueID(t), redistest.UniqueID(t)
	root := limiter.ChainTag("org", limiter.KeyID(true, org))
	slots := limiter.SlotsKey(limiter.NewLimit(root, "key", limiter.KeyID(false, key), limiter.Caps{}))
	if c.KeySlot(slots) != c.KeySlot(root) {
		t.Fatalf("%s is not in the hash slot of the chain's root %s", slots, root)
	}
	sixtyAgainstFive(t, urlsOf(gws), adminsOf(gws), up, c.SlotOwner(slots), slots, key, "X-Org: "+org)
}

// A refusal by a concurrency cap sets refused_kind concurrency (here in a
// header of handle_errors' answer, with on_refusal error) and counts in
// refusals_total; slots_held counts the slots held while their requests
// are in flight, and none once they have ended.
func TestAConcurrencyRefusalSetsItsPlaceholdersMetricAndLogLineAndSlotsHeldFollowsRequestsInFlight(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newUpstream(t)
		logFile := t.TempDir() + "/caddy.log"
		gw := startGatewayWith(t, up.URL, fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t\tlevel DEBUG\n\t}", logFile),
			limited(flightStore(store), `
			scope key {http.request.header.X-Api-Key}
			limit key * concurrent 3
			on_refusal error
			on_redis_error deny`, `
	handle_errors {
		header X-Refused-Kind {http.rolter_ratelimit.refused_kind}
		respond "{http.rolter_ratelimit.outcome} by {http.rolter_ratelimit.refused_scope} on {http.rolter_ratelimit.refused_kind}, cap {http.rolter_ratelimit.refused_limit}" {err.status_code}
	}`), 0)
		const refusals = `caddy_rolter_ratelimit_refusals_total{kind="concurrency",scope="key",shadow="false",window=""}`
		slotsHeld := fmt.Sprintf(slotsHeldMetric, "key")
		waitSlotsHeld(t, caddyAdmin(), "key", 0)
		before := scrape(t)[refusals]
		c := flightClient(t)
		key := "sk-" + redistest.UniqueID(t)
		refused, finish := heldBurst(t, c, []string{gw.url}, up, 4, "X-Api-Key: "+key)
		if len(refused) != 1 {
			t.Fatalf("%d of 4 requests refused under concurrent 3, want 1", len(refused))
		}
		a := refused[0]
		if a.status != 429 || a.body != "refused by key on concurrency, cap 3" || a.header.Get("X-Refused-Kind") != "concurrency" || a.header.Get("Retry-After") != "" {
			t.Fatalf("handle_errors' answer: %d %q, X-Refused-Kind %q, Retry-After %q; want 429 refused by key on concurrency, cap 3, without a wait",
				a.status, a.body, a.header.Get("X-Refused-Kind"), a.header.Get("Retry-After"))
		}
		m := scrape(t)
		if got := m[refusals] - before; got != 1 {
			t.Errorf("refusals_total{kind=concurrency} rose by %v, want 1", got)
		}
		if got := m[slotsHeld]; got != 3 {
			t.Errorf("slots_held{scope=key} is %v with 3 requests in flight, want 3", got)
		}
		if got := statuses(finish()); got[200] != 3 {
			t.Fatalf("statuses %v, want 3 × 200", got)
		}
		waitSlotsHeld(t, caddyAdmin(), "key", 0)
		logs, err := os.ReadFile(logFile)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(logs), `"msg":"refused","scope":"key","id":"`+limiter.KeyID(false, key)+`","kind":"concurrency"`) {
			t.Errorf("no debug line of the refusal with kind concurrency in the log:\n%s", logs)
		}
	})
}

// A request whose upstream cannot be reached ends in handle_errors, and
// its slot is free by then: the next request reaches handle_errors too,
// not a refusal.
func TestASlotIsFreedWhenTheRequestEndsInHandleErrors(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		dead := fmt.Sprintf("http://127.0.0.1:%d", freePort()) // nothing listens
		gw := startGatewayWith(t, dead, "", limited(flightStore(store), `
			scope key {http.request.header.X-Api-Key}
			limit key * concurrent 1
			on_redis_error deny`, "\thandle_errors {\n\t\trespond \"upstream unreachable\" 502\n\t}"), 0)
		c := flightClient(t)
		header := "X-Api-Key: sk-" + redistest.UniqueID(t)
		for i := range 3 {
			a := mustPost(t, c, gw.url, http.StatusBadGateway, fmt.Sprintf("request %d to an unreachable upstream", i+1), header)
			if a.body != "upstream unreachable" {
				t.Fatalf("request %d: %q, want handle_errors' answer", i+1, a.body)
			}
			waitSlotsHeld(t, caddyAdmin(), "key", 0)
		}
	})
}

// Two handlers that cap one key's requests in flight alike but with
// different slot_lease values (1 s and the default 30 s) share its slots:
// whichever lease a request took its slot under, the slots held last as
// long as the longest of them, so that no more than the cap are ever in
// flight, however long the requests run past the shorter lease.
func TestTwoHandlersOfDifferentSlotLeasesSharingALimitNeverPutMoreThanItsCapInFlight(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		const short = time.Second
		up := newUpstream(t)
		gw := twoLeasesGateway(t, up, store, 2)
		c := flightClient(t)
		key := "sk-" + redistest.UniqueID(t)
		header := "X-Api-Key: " + key
		// One request of each lease in flight: the longer lease's first.
		var finishes []func() []flightAnswer
		for _, lease := range []string{"long", "short"} {
			refused, finish := heldBurst(t, c, []string{gw.url}, up, 1, header, "X-Lease: "+lease)
			if len(refused) != 0 {
				t.Fatalf("the request of the %s lease: %d %s", lease, refused[0].status, refused[0].body)
			}
			finishes = append(finishes, finish)
		}
		started := time.Now()
		// Waiting on the clock is the point: slots whose lease were cut to
		// the shorter one would be free after 1 s, as the store renews them
		// only every third of the longer one.
		for _, at := range []time.Duration{short / 2, short + short/4, 2 * short, 3 * short} {
			time.Sleep(time.Until(started.Add(at)))
			for _, lease := range []string{"long", "short"} {
				mustBeConcurrencyRefusal(t, fmt.Sprintf("a request of the %s lease %v after both were in flight", lease, at),
					post(c, gw.url, header, "X-Lease: "+lease, "X-Upstream: "+upstreamFast), "key", 2, key)
			}
		}
		for _, finish := range finishes {
			if got := statuses(finish()); got[200] != 1 {
				t.Fatalf("a held request: %v", got)
			}
		}
		if peak := up.peak.Load(); peak != 2 {
			t.Fatalf("the upstream had %d requests open at once, want at most concurrent 2", peak)
		}
		waitSlotsHeld(t, caddyAdmin(), "key", 0)
	})
}
