package ratelimit

// Requests in flight (concurrent, slot_lease: slots.go), end to end: a real
// Caddy over real HTTP in front of an upstream that holds its requests open
// and measures how many it had open at once. The in-process Caddy of
// module_test.go serves the tests of one gateway; the tests of several
// gateways, or of one killed with SIGKILL, run each gateway as a Caddy
// process of its own (./cmd/caddy, built once per run of the test binary),
// every one with its own Redis client, on loopback.
//
// Identifiers of this file other than the tests are prefixed with "flight"
// where a plain name could meet one of the package's other test files.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// TestMain removes the Caddy binary the process tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if flightCaddy.dir != "" {
		os.RemoveAll(flightCaddy.dir)
	}
	os.Exit(code)
}

// flightWait bounds every wait of these tests for something that happens
// at once on an idle machine (a request answered, a free counted).
const flightWait = 10 * time.Second

// How the flight upstream answers a request, by its X-Upstream header.
const (
	upstreamHeld = ""     // holds it until the test releases it, then answers a chat completion
	upstreamFast = "fast" // answers a chat completion at once
	upstream500  = "500"  // answers 500 at once
	upstreamSSE  = "sse"  // streams events until released, or for X-Hold
	upstreamCut  = "cut"  // sends the first event, then closes the connection
)

// flightUpstream plays an LLM API whose answers take as long as the test
// says, and measures the largest number of requests it had open at once.
// A WebSocket handshake opens a session that echoes every message.
type flightUpstream struct {
	*httptest.Server
	open, peak atomic.Int64
	// arrived gets one value for each held request (upstreamHeld) once it
	// has reached the upstream.
	arrived chan struct{}
	mu      sync.Mutex
	gate    chan struct{} // closed by release: the held requests that saw it answer
	closed  chan struct{} // the test is over: nothing is held any more
}

func newFlightUpstream(t *testing.T) *flightUpstream {
	u := &flightUpstream{arrived: make(chan struct{}, 1024), gate: make(chan struct{}), closed: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() {
		close(u.closed)
		u.Close()
	})
	return u
}

// release answers every request held so far; later ones are held again.
func (u *flightUpstream) release() {
	u.mu.Lock()
	defer u.mu.Unlock()
	close(u.gate)
	u.gate = make(chan struct{})
}

func (u *flightUpstream) currentGate() chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.gate
}

const flightChunk = `data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n"

func (u *flightUpstream) serve(w http.ResponseWriter, r *http.Request) {
	n := u.open.Add(1)
	defer u.open.Add(-1)
	for p := u.peak.Load(); n > p && !u.peak.CompareAndSwap(p, n); p = u.peak.Load() {
	}
	if isWebSocketHandshake(r) {
		u.echo(w, r)
		return
	}
	io.Copy(io.Discard, r.Body)
	safety := time.NewTimer(2 * flightWait) // nothing is held forever
	defer safety.Stop()
	mode := r.Header.Get("X-Upstream")
	switch mode {
	case upstreamHeld:
		gate := u.currentGate()
		u.arrived <- struct{}{}
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		case <-u.closed:
		case <-safety.C:
		}
	case upstream500:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"error":{"message":"upstream failed","type":"server_error"}}`)
		return
	case upstreamSSE, upstreamCut:
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		io.WriteString(w, flightChunk)
		rc.Flush()
		if mode == upstreamCut {
			if conn, _, err := rc.Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		var hold <-chan time.Time
		if d, err := time.ParseDuration(r.Header.Get("X-Hold")); err == nil {
			timer := time.NewTimer(d)
			defer timer.Stop()
			hold = timer.C
		}
		gate, tick := u.currentGate(), time.NewTicker(250*time.Millisecond)
		defer tick.Stop()
	stream:
		for {
			select {
			case <-tick.C:
				io.WriteString(w, flightChunk)
				rc.Flush()
			case <-hold:
				break stream
			case <-gate:
				break stream
			case <-r.Context().Done():
				return
			case <-u.closed:
				return
			case <-safety.C:
				return
			}
		}
		io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"object":"chat.completion","usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`)
}

// echo serves a WebSocket session that echoes every message until either
// side closes it.
func (u *flightUpstream) echo(w http.ResponseWriter, r *http.Request) {
	conn, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer conn.Close()
	for {
		kind, msg, err := conn.ReadMessage()
		if err != nil || conn.WriteMessage(kind, msg) != nil {
			return
		}
	}
}

// flightAnswer is one request's answer as its client got it; err is set
// when it got none, or not all of it.
type flightAnswer struct {
	status int
	header http.Header
	body   string
	err    error
}

// flightClient keeps a connection per request that may be in flight at
// once, so that no request waits for a connection.
func flightClient(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 100, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 3 * flightWait}
}

// post sends a chat completion to the gateway at url with the given header
// lines ("Name: value") and reads the whole answer. It may run in any
// goroutine: it reports what went wrong in the answer.
func post(c *http.Client, url string, headers ...string) flightAnswer {
	return postTo(c, url, "/v1/chat/completions", `{"model":"m"}`, headers...)
}

// postTo is post of body to path.
func postTo(c *http.Client, url, path, body string, headers ...string) flightAnswer {
	req, err := http.NewRequest("POST", url+path, strings.NewReader(body))
	if err != nil {
		return flightAnswer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	setHeaders(req, headers)
	res, err := c.Do(req)
	if err != nil {
		return flightAnswer{err: err}
	}
	defer res.Body.Close()
	answer, err := io.ReadAll(res.Body)
	return flightAnswer{status: res.StatusCode, header: res.Header, body: string(answer), err: err}
}

// mustPost sends a request that must be answered with want.
func mustPost(t *testing.T, c *http.Client, url string, want int, what string, headers ...string) flightAnswer {
	t.Helper()
	a := post(c, url, headers...)
	if a.err != nil || a.status != want {
		t.Fatalf("%s: %d %s %v, want %d", what, a.status, a.body, a.err, want)
	}
	return a
}

// heldBurst sends n held requests at once, spread over the gateways at
// urls, and returns once every one of them has either been answered or
// reached the upstream: refused holds the answers so far (the refused
// requests'). finish releases the upstream and returns all n answers.
func heldBurst(t *testing.T, c *http.Client, urls []string, up *flightUpstream, n int, headers ...string) (refused []flightAnswer, finish func() []flightAnswer) {
	t.Helper()
	return heldBurstOf(t, urls, up, n, func(url string) flightAnswer { return post(c, url, headers...) })
}

// heldBurstOf is heldBurst of the requests that send sends to the gateway
// at url (from any goroutine).
func heldBurstOf(t *testing.T, urls []string, up *flightUpstream, n int, send func(url string) flightAnswer) (refused []flightAnswer, finish func() []flightAnswer) {
	t.Helper()
	answers := make(chan flightAnswer, n)
	for i := range n {
		go func() { answers <- send(urls[i%len(urls)]) }()
	}
	deadline := time.NewTimer(flightWait)
	defer deadline.Stop()
	for arrived := 0; arrived+len(refused) < n; {
		select {
		case <-up.arrived:
			arrived++
		case a := <-answers:
			refused = append(refused, a)
		case <-deadline.C:
			t.Fatalf("%d of %d requests reached the upstream or were answered within %v", arrived+len(refused), n, flightWait)
		}
	}
	return refused, func() []flightAnswer {
		t.Helper()
		up.release()
		all := append([]flightAnswer(nil), refused...)
		deadline := time.NewTimer(flightWait)
		defer deadline.Stop()
		for len(all) < n {
			select {
			case a := <-answers:
				all = append(all, a)
			case <-deadline.C:
				t.Fatalf("%d of %d requests answered within %v of their release", len(all), n, flightWait)
			}
		}
		return all
	}
}

// statuses counts the answers by status, 0 for a request that got none.
func statuses(answers []flightAnswer) map[int]int {
	out := map[int]int{}
	for _, a := range answers {
		if a.err != nil {
			out[0]++
		} else {
			out[a.status]++
		}
	}
	return out
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
	deadline := time.Now().Add(flightWait)
	for {
		got := scrapeAt(t, admin)[name]
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway with admin port %d holds %v slots of %s, want %v", admin, got, scope, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
	deadline := time.Now().Add(flightWait)
	for {
		h := slotHoldings(t, addr, key)
		if len(h) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still holds %v once every request ended", key, h)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// redisAddr is the host:port of a redis line's URL.
func redisAddr(t *testing.T, url string) string {
	t.Helper()
	c := redisClient(t, url)
	return c.Options().Addr
}

// slotsOf is the slots key of the key scope's limit for id, without a
// hash tag.
func slotsOf(id string) string {
	return slotsKey(newTaggedLimit("", "key", keyID(false, id), limitCaps{}))
}

// flightStore is the store line of the gateways of these tests: on Redis,
// a client that waits for Redis up to 2 s. Under -race on a loaded machine
// a call can take longer than the default 100 ms, and on_redis_error would
// then answer for the store: these tests' gateways set it to deny, so that
// a store failure is a 503, never an admission unchecked that would look
// like a cap overshot.
func flightStore(store string) string {
	if store == "" {
		return ""
	}
	return store + " {\n\ttimeout 2s\n}"
}

// flightGatewayOn starts an in-process gateway on loopback whose routes are
// those of limited, on store's flightStore, with on_redis_error deny.
func flightGatewayOn(t *testing.T, up *flightUpstream, store, lines string, after ...string) *gateway {
	t.Helper()
	return flightGatewayTo(t, up.URL, store, lines, after...)
}

// flightGatewayTo is flightGatewayOn in front of the upstream at
// upstreamURL.
func flightGatewayTo(t *testing.T, upstreamURL, store, lines string, after ...string) *gateway {
	t.Helper()
	return startGatewayWith(t, upstreamURL, "\tdefault_bind 127.0.0.1", limited(flightStore(store), lines+"\non_redis_error deny", after...), freePort())
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
func sixtyAgainstFive(t *testing.T, urls []string, admins []int, up *flightUpstream, redisAt, slots, key string, more ...string) {
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
		up := newFlightUpstream(t)
		gw := flightGatewayOn(t, up, store, capOf5)
		key := "sk-" + uniqueID(t)
		addr := ""
		if store != "" {
			addr = redisAddr(t, redisURLFromEnv(t))
		}
		sixtyAgainstFive(t, []string{gw.url}, []int{caddyAdmin()}, up, addr, slotsOf(key), key)
	})
}

func TestThreeGatewayProcessesOnRedisPutExactly5Of60InFlightAndFreeEverySlot(t *testing.T) {
	url := redisURLFromEnv(t)
	up := newFlightUpstream(t)
	gws := startCaddyProcesses(t, 3, up, limited(flightStore("redis "+url), capOf5+"\non_redis_error deny"))
	key := "sk-" + uniqueID(t)
	sixtyAgainstFive(t, urlsOf(gws), adminsOf(gws), up, redisAddr(t, url), slotsOf(key), key)
}

// A slot is freed however its request ends: a client that hangs up
// mid-stream, an upstream that closes the connection mid-stream, an
// upstream 500.
func TestASlotIsFreedWhenTheClientHangsUpTheUpstreamCutsTheStreamOrAnswers500(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		up := newFlightUpstream(t)
		gw := flightGatewayOn(t, up, store, `
			scope key {http.request.header.X-Api-Key}
			limit key * concurrent 1`)
		c := flightClient(t)
		key := "sk-" + uniqueID(t)
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
func twoLeasesGateway(t *testing.T, up *flightUpstream, store string, concurrent int) *gateway {
	t.Helper()
	return startGatewayWith(t, up.URL, "\tdefault_bind 127.0.0.1", fmt.Sprintf(`
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
	reverse_proxy {upstream}`, flightStore(store), concurrent), freePort())
}

// A stream that lasts three leases keeps its slot all along: the store
// renews it every third of a lease, even while it holds a slot of another
// handler's longer lease (the default 30s), which it renews ten times less
// often.
func TestAStreamLastingThreeLeasesKeepsItsSlotAllAlong(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		const lease = time.Second
		up := newFlightUpstream(t)
		gw := twoLeasesGateway(t, up, store, 1)
		c := flightClient(t)
		key := "sk-" + uniqueID(t)
		header := "X-Api-Key: " + key
		refused, finishLong := heldBurst(t, c, []string{gw.url}, up, 1, "X-Api-Key: sk-"+uniqueID(t), "X-Lease: long")
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
		case <-time.After(flightWait):
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
	url := redisURLFromEnv(t)
	addr := redisAddr(t, url)
	up := newFlightUpstream(t)
	gws := startCaddyProcesses(t, 2, up, limited(flightStore("redis "+url), capOf5+"\nslot_lease 1s\non_redis_error deny"))
	killed, survivor := gws[0], gws[1]
	c := flightClient(t)
	key := "sk-" + uniqueID(t)
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
	for {
		sent := time.Now()
		a = post(c, survivor.url, header, "X-Upstream: "+upstreamFast)
		if a.err == nil && a.status == 200 {
			took := sent.Sub(at)
			t.Logf("the killed gateway's 5 slots were free %v after the kill (slot_lease %v)", took.Round(time.Millisecond), lease)
			if took > lease+lease/2 {
				t.Errorf("the killed gateway's slots held %v after the kill, want at most the lease and a margin (%v)", took, lease+lease/2)
			}
			break
		}
		if p := concurrencyRefusalProblem(a, "key", 5, key); p != "" {
			t.Fatalf("a request to the other gateway after the kill: %s", p)
		}
		if time.Since(at) > 5*lease {
			t.Fatalf("the killed gateway's slots still held %v after the kill", time.Since(at))
		}
		time.Sleep(20 * time.Millisecond)
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
		up := newFlightUpstream(t)
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
func slotsInStore(t *testing.T, storeLine string, l limit) int64 {
	t.Helper()
	return peekInStore(t, storeLine, l).counts[0].slots
}

// peekInStore reads l's counters in the store of a gateway's store line
// ("" for the in-process store).
func peekInStore(t *testing.T, storeLine string, l limit) decision {
	t.Helper()
	var s store
	if storeLine == "" {
		m, release, err := acquireMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		s = m
	} else {
		s = newTestRedisStore(t, strings.TrimPrefix(storeLine, "redis "))
	}
	d, err := s.peek(context.Background(), []limit{l})
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
		up := newFlightUpstream(t)
		gw := flightGatewayOn(t, up, store, `
			scope key {http.request.header.X-Api-Key}
			limit key * rpm 2 concurrent 1`)
		c := flightClient(t)
		key := "sk-" + uniqueID(t)
		header := "X-Api-Key: " + key
		l := newSlotLimit("key", keyID(false, key), 1, 2, defaultSlotLease)

		refused, finish := heldBurst(t, c, []string{gw.url}, up, 1, header)
		if len(refused) != 0 {
			t.Fatalf("the first request was refused: %d %s", refused[0].status, refused[0].body)
		}
		mustBeConcurrencyRefusal(t, "a second request while the first is in flight", post(c, gw.url, header, "X-Upstream: "+upstreamFast), "key", 1, key)
		if n := windowHolds(t, store, l, rpm); n != 1 {
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
		if n := windowHolds(t, store, l, rpm); n != 2 {
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
	c := startRedisCluster(t, 3)
	up := newFlightUpstream(t)
	gws := startCaddyProcesses(t, 3, up, limited(flightStore("redis cluster "+strings.Join(c.URLs(), " ")), `
			scope key {http.request.header.X-Api-Key}
			scope org {http.request.header.X-Org} readable
			limit key * concurrent 5
			on_redis_error deny`))
	key, org := "sk-"+uniqueID(t), uniqueID(t)
	root := chainTag("org", keyID(true, org))
	slots := slotsKey(newTaggedLimit(root, "key", keyID(false, key), limitCaps{}))
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
		up := newFlightUpstream(t)
		logFile := t.TempDir() + "/caddy.log"
		gw := startGatewayWith(t, up.URL, fmt.Sprintf("\tdefault_bind 127.0.0.1\n\tlog {\n\t\toutput file %s\n\t\tlevel DEBUG\n\t}", logFile),
			limited(flightStore(store), `
			scope key {http.request.header.X-Api-Key}
			limit key * concurrent 3
			on_refusal error
			on_redis_error deny`, `
	handle_errors {
		header X-Refused-Kind {http.rolter_ratelimit.refused_kind}
		respond "{http.rolter_ratelimit.outcome} by {http.rolter_ratelimit.refused_scope} on {http.rolter_ratelimit.refused_kind}, cap {http.rolter_ratelimit.refused_limit}" {err.status_code}
	}`), freePort())
		const refusals = `caddy_rolter_ratelimit_refusals_total{kind="concurrency",scope="key",shadow="false",window=""}`
		slotsHeld := fmt.Sprintf(slotsHeldMetric, "key")
		waitSlotsHeld(t, caddyAdmin(), "key", 0)
		before := scrape(t)[refusals]
		c := flightClient(t)
		key := "sk-" + uniqueID(t)
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
		if !strings.Contains(string(logs), `"msg":"refused","scope":"key","id":"`+keyID(false, key)+`","kind":"concurrency"`) {
			t.Errorf("no debug line of the refusal with kind concurrency in the log:\n%s", logs)
		}
	})
}

// flightCaddy is ./cmd/caddy, built once per run of the test binary, in a
// directory TestMain removes.
var flightCaddy struct {
	once      sync.Once
	dir, path string
	err       error
}

// caddyBinary builds ./cmd/caddy on its first call; a failed build fails
// every test that needs it.
func caddyBinary(t *testing.T) string {
	t.Helper()
	flightCaddy.once.Do(func() {
		flightCaddy.dir, flightCaddy.err = os.MkdirTemp("", "rolter-inflight-caddy-")
		if flightCaddy.err != nil {
			return
		}
		path := filepath.Join(flightCaddy.dir, "caddy")
		out, err := exec.Command("go", "build", "-o", path, "./cmd/caddy").CombinedOutput()
		if err != nil {
			flightCaddy.err = fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
			return
		}
		flightCaddy.path = path
	})
	if flightCaddy.err != nil {
		t.Fatal(flightCaddy.err)
	}
	return flightCaddy.path
}

// caddyProcess is a gateway in a Caddy process of its own, on loopback,
// with its admin endpoint on a port of its own.
type caddyProcess struct {
	url    string
	admin  int
	cmd    *exec.Cmd
	exited chan struct{}
}

// startCaddyProcesses starts n gateway processes whose routes are body,
// with the upstream's address for {upstream}, and stops them in
// t.Cleanup.
func startCaddyProcesses(t *testing.T, n int, up *flightUpstream, body string) []*caddyProcess {
	t.Helper()
	bin := caddyBinary(t)
	out := make([]*caddyProcess, n)
	for i := range out {
		out[i] = startCaddyProcess(t, bin, up.URL, body)
	}
	return out
}

func startCaddyProcess(t *testing.T, bin, upstreamURL, body string) *caddyProcess {
	t.Helper()
	return startCaddyProcessWith(t, bin, upstreamURL, "", body)
}

// startCaddyProcessWith starts a gateway process with global options
// beside those every one has.
func startCaddyProcessWith(t *testing.T, bin, upstreamURL, globals, body string) *caddyProcess {
	t.Helper()
	dir := t.TempDir()
	port, admin := freePort(), freePort()
	config := gatewayCaddyfile(admin, port, "\tpersist_config off\n\tdefault_bind 127.0.0.1\n"+globals, body+"\n\trespond /__ready 200", upstreamURL)
	file := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "caddy.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the process has its own descriptor
	cmd := exec.Command(bin, "run", "--config", file, "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir, "HOME="+dir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = diesWithTheTest()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &caddyProcess{url: fmt.Sprintf("http://127.0.0.1:%d", port), admin: admin, cmd: cmd, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill(t)
		if t.Failed() {
			log, _ := os.ReadFile(logFile.Name())
			t.Logf("log of the gateway process on %s:\n%s", p.url, log)
		}
	})
	// Ready once its site answers.
	c := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(flightWait); ; {
		res, err := c.Get(p.url + "/__ready")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return p
			}
		}
		select {
		case <-p.exited:
			log, _ := os.ReadFile(logFile.Name())
			t.Fatalf("the gateway process exited: %v\n%s", cmd.ProcessState, log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway process on %s did not answer within %v (%v)", p.url, flightWait, err)
		}
	}
}

// kill kills the process with SIGKILL (kill -9) and returns when it did,
// once it has exited.
func (p *caddyProcess) kill(t *testing.T) time.Time {
	t.Helper()
	at := time.Now()
	select {
	case <-p.exited:
		return at
	default:
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Errorf("killing the gateway process on %s: %v", p.url, err)
	}
	select {
	case <-p.exited:
	case <-time.After(flightWait):
		t.Errorf("the gateway process on %s did not exit", p.url)
	}
	return at
}

func urlsOf(gws []*caddyProcess) []string {
	out := make([]string, len(gws))
	for i, g := range gws {
		out[i] = g.url
	}
	return out
}

func adminsOf(gws []*caddyProcess) []int {
	out := make([]int, len(gws))
	for i, g := range gws {
		out[i] = g.admin
	}
	return out
}

// A request whose upstream cannot be reached ends in handle_errors, and
// its slot is free by then: the next request reaches handle_errors too,
// not a refusal.
func TestASlotIsFreedWhenTheRequestEndsInHandleErrors(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		dead := fmt.Sprintf("http://127.0.0.1:%d", freePort()) // nothing listens
		gw := startGatewayWith(t, dead, "\tdefault_bind 127.0.0.1", limited(flightStore(store), `
			scope key {http.request.header.X-Api-Key}
			limit key * concurrent 1
			on_redis_error deny`, "\thandle_errors {\n\t\trespond \"upstream unreachable\" 502\n\t}"), freePort())
		c := flightClient(t)
		header := "X-Api-Key: sk-" + uniqueID(t)
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
		up := newFlightUpstream(t)
		gw := twoLeasesGateway(t, up, store, 2)
		c := flightClient(t)
		key := "sk-" + uniqueID(t)
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
