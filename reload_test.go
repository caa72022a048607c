package ratelimit

// Config reloads under load, end to end: a real Caddy (caddytest's, in this
// process), a real upstream and a redis-server of the test's own, so that the
// server's client list holds only this test's connections.
//
// Identifiers of this file other than the test are prefixed with "rl" to keep
// clear of the names used by the package's other test files.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/poll"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

const (
	reloadClients    = 8   // concurrent client goroutines, in the warm-up and the reload run
	reloadCount      = 20  // reloads during the reload run
	smallOrgRPM      = 50  // the capped org's rpm
	smallOrgPerRound = 5   // capped-org requests sent around each reload: 100 in all, twice the cap
	busyOrgRPM       = 1e6 // the busy org's rpm: never reached
	// windowNeeded is how much of the current minute period must be left
	// when the reload run starts: the capped org's 50 admissions must all
	// land in one period (with an empty previous one) for "exactly 50" to be
	// the right answer. The run takes 1–2 s under -race on two CPUs.
	windowNeeded = 10 * time.Second
	// goroutineSlack is how many goroutines more than after the warm-up
	// may remain once everything has settled. None are expected: see the
	// comment where it is used.
	goroutineSlack = 0
	// upstreamIdle is the idle timeout of reverse_proxy's connections to
	// the upstream (Caddy's default: 2m). A reload leaves behind, in the old
	// config's transport, an idle connection for about every request that
	// was in flight when it happened, whatever the handlers: HTTPTransport's
	// Cleanup calls CloseIdleConnections, but a request of the old config
	// that reaches RoundTrip afterwards undoes it (net/http's
	// queueForIdleConn resets Transport.closeIdle), and its connection then
	// idles in a transport nobody uses until this timeout closes it (three
	// goroutines each: the transport's read and write loops and the
	// upstream's conn.serve). Without the module in the chain the same run
	// leaves the same hundreds of goroutines. A short timeout lets them go
	// within the test, so that the goroutine count can be compared exactly.
	upstreamIdle = "500ms"
	// stillFor is how long the goroutine count must hold still to be read:
	// longer than upstreamIdle, and than the 500 ms at which net/http's
	// Shutdown polls for its connections to finish (old HTTP servers and the
	// admin server that every load replaces stop in goroutines of their own).
	stillFor = 1200 * time.Millisecond
)

func TestTwentyReloadsUnderLoadLoseNoRequestAndKeepAdmissionExact(t *testing.T) {
	started := time.Now()
	srv := redistest.NewServer(t)
	probe := newConnProbe(t, srv)
	up := newUpstream(t)
	warmOrg, bigOrg, smallOrg := redistest.UniqueID(t), redistest.UniqueID(t), redistest.UniqueID(t)
	admin := caddyAdmin()
	logFile := t.TempDir() + "/caddy.log"
	globals := fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t\tlevel INFO\n\t}", logFile)

	// Generation k of the site. Odd generations differ from the one before
	// only in a comment, so their JSON is identical and only Cache-Control:
	// must-revalidate makes Caddy reload them (caddy.changeConfig compares
	// the JSON unless forceReload); even ones change a response header.
	site := func(k int) string {
		return fmt.Sprintf(`
	# generation %d
	header X-Rl-Gen g%d
	log
	rolter_ratelimit {
		redis %s {
			timeout 2s
		}
		scope org {http.request.header.X-Org} readable
		limit org %s rpm %d
		limit org * rpm %d
		on_redis_error deny
	}
	reverse_proxy {upstream} {
		transport http {
			keepalive %s
		}
	}`, k, k-k%2, srv.URL(), smallOrg, smallOrgRPM, int64(busyOrgRPM), upstreamIdle)
	}
	// The timeout of 2s is there so that a CPU-starved admission under -race
	// is not mistaken for a Redis failure; on_redis_error deny makes any
	// store failure a visible 503 rather than an uncounted 200. The short
	// upstream keepalive is explained at upstreamIdle.
	gw := startGatewayWith(t, up.URL, globals, site(0), 0)
	reloads := 0 // loads through POST /load after the first
	reload := func(k int) (int, string, error) {
		reloads++
		// The whole Caddyfile, as startGatewayWith writes it (same globals,
		// same admin address, same site address), even if unchanged.
		return postLoad(admin, gatewayCaddyfile(admin, gw.port, globals, site(k), up.URL), true)
	}

	// Our own client: one idle connection kept per client goroutine, and no
	// dial logging (caddytest's transport logs every dial).
	tr := &http.Transport{MaxIdleConns: 2 * reloadClients, MaxIdleConnsPerHost: reloadClients, IdleConnTimeout: time.Minute, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	load := &loadResult{client: client, url: gw.url + "/v1/chat/completions"}

	// Warm-up: the same load without reloads, until the shared Redis pool
	// has grown to one connection per client goroutine (it never shrinks:
	// go-redis does not reap idle connections), so that the reload run has
	// no reason to open one.
	warmStart := time.Now()
	warm := load.run(reloadClients, func(int) string { return warmOrg }, func(stop func() bool) {
		err := poll.Until(8*time.Second, pollEvery, func() error {
			if n := probe.others(t); time.Since(warmStart) < time.Second || n < reloadClients {
				return fmt.Errorf("the Redis pool reached %d connections, not %d", n, reloadClients)
			}
			return nil
		})
		if err != nil {
			t.Logf("warm-up: %v", err)
		}
	})
	warm.mustAllBe(t, "warm-up", "", 200)
	baseG, baseStacks := settledGoroutines(t, tr)
	baseRedis := probe.others(t)
	baseConns := probe.connectionsReceived(t)
	t.Logf("after the warm-up (%d requests, %d retried, in %v): %d goroutines, %d Redis connections besides the probe", warm.total(), warm.retried, time.Since(warmStart).Round(time.Millisecond), baseG, baseRedis)

	// The capped org must get its 50 admissions in one minute period.
	now := probe.now(t)
	if left := time.Duration(limiter.MinuteMillis-now.UnixMilli()%limiter.MinuteMillis) * time.Millisecond; left < windowNeeded {
		t.Logf("%v left in this minute period: waiting for the next one", left.Round(time.Millisecond))
		time.Sleep(left + 50*time.Millisecond)
	}
	atMinute := probe.now(t).UnixMilli() / limiter.MinuteMillis

	// The reload run. Around each reload, smallOrgPerRound requests of the
	// capped org are handed to the client goroutines: some before the POST,
	// so that they meet the reload, the rest once it answered. After each
	// reload, every client goroutine completes a request on the busy org
	// before the next reload starts, so every generation serves traffic.
	type reloadResult struct {
		code int
		body string
		err  error
		took time.Duration
	}
	var results []reloadResult
	var small atomic.Int64 // capped-org tickets not yet taken
	orgOf := func(int) string {
		for {
			n := small.Load()
			if n <= 0 {
				return bigOrg
			}
			if small.CompareAndSwap(n, n-1) {
				return smallOrg
			}
		}
	}
	runStart := time.Now()
	run := load.run(reloadClients, orgOf, func(stop func() bool) {
		for i := 1; i <= reloadCount && !stop(); i++ {
			small.Add(3)
			t0 := time.Now()
			code, body, err := reload(i)
			results = append(results, reloadResult{code, body, err, time.Since(t0)})
			small.Add(smallOrgPerRound - 3)
			done := load.completed(bigOrg)
			stalled := poll.Until(waitBound, pollEvery, func() error {
				if n := small.Load(); n > 0 || load.completed(bigOrg) < done+reloadClients {
					return fmt.Errorf("the load stalled (%d capped-org requests not sent)", n)
				}
				return nil
			})
			if stalled != nil {
				t.Errorf("reload %d: %v", i, stalled)
				return
			}
		}
	})
	runTook := time.Since(runStart)
	endMinute := probe.now(t).UnixMilli() / limiter.MinuteMillis

	// Every reload answered 200.
	var took []string
	for i, r := range results {
		took = append(took, r.took.Round(time.Millisecond).String())
		if r.err != nil || r.code != 200 {
			t.Errorf("reload %d: %d %q %v", i+1, r.code, r.body, r.err)
		}
	}
	if len(results) != reloadCount {
		t.Fatalf("%d reloads done, want %d", len(results), reloadCount)
	}
	t.Logf("reload run: %v, %d requests (%d transparently retried by the client on a fresh connection), reloads took %s",
		runTook.Round(time.Millisecond), run.total(), run.retried, strings.Join(took, " "))

	// No failed request: the busy org got nothing but 200s, the capped one
	// 200s and 429s.
	run.mustAllBe(t, "busy org", bigOrg, 200)
	run.mustAllBe(t, "capped org", smallOrg, 200, 429)
	if got := run.count(smallOrg, 0); got != reloadCount*smallOrgPerRound {
		t.Errorf("%d capped-org requests sent, want %d", got, reloadCount*smallOrgPerRound)
	}
	// Every generation whose header differs served requests.
	for k := 0; k <= reloadCount; k += 2 {
		if !run.gens["g"+strconv.Itoa(k)] {
			t.Errorf("no response came from generation %d (X-Rl-Gen g%d); seen: %v", k, k, run.generations())
		}
	}

	// Admission stayed exact: no reload reset or forked a counter.
	if atMinute != endMinute {
		t.Fatalf("the reload run crossed a minute boundary (minute %d to %d): the capped org's count is not comparable", atMinute, endMinute)
	}
	if got := run.count(smallOrg, 200); got != smallOrgRPM {
		t.Errorf("capped org: %d of %d requests admitted across %d reloads, want exactly %d", got, run.count(smallOrg, 0), reloadCount, smallOrgRPM)
	}
	smallKey := limiter.PeriodKey(newLimit("org", smallOrg, 0, 0).Prefix, limiter.RPM, atMinute)
	if got := probe.get(t, smallKey); got != smallOrgRPM {
		t.Errorf("Redis %s = %d, want %d", smallKey, got, smallOrgRPM)
	}
	if got, want := probe.sumReq(t, bigOrg), run.count(bigOrg, 200); got != int64(want) {
		t.Errorf("busy org: Redis counted %d requests, the clients got %d 200s", got, want)
	}
	if got, want := probe.sumReq(t, warmOrg), warm.count(warmOrg, 200); got != int64(want) {
		t.Errorf("warm-up org: Redis counted %d requests, the clients got %d 200s", got, want)
	}
	if got, want := up.hits.Load(), int64(warm.count("", 200)+run.count("", 200)); got != want {
		t.Errorf("the upstream saw %d requests, the clients got %d 200s: refused requests must not reach it, admitted ones must", got, want)
	}

	// No request reached Caddy without its answer reaching the client: the
	// transport's retries resent only requests that no server had read.
	if got, want := countLines(t, logFile, `"msg":"handled request"`), warm.total()+run.total(); got != want {
		t.Errorf("Caddy's access log has %d requests, the clients got %d answers", got, want)
	}
	// Every reload, including those whose JSON was identical, provisioned
	// the handler anew: one "rate limits loaded" line per load.
	if got, want := countLines(t, logFile, `"msg":"rate limits loaded"`), 1+reloads; got != want {
		t.Errorf("%d provisions of the handler logged, want %d (the first load and %d reloads)", got, want, reloads)
	}

	// Nothing leaked: the Redis client was shared by every generation (no
	// connection opened, none left behind), and the goroutines are back to
	// what they were after the warm-up.
	if got := probe.others(t); got != baseRedis {
		t.Errorf("%d Redis connections besides the probe after the reloads, %d after the warm-up\n%s", got, baseRedis, probe.clientList(t))
	}
	if got := probe.connectionsReceived(t) - baseConns; got != 0 {
		t.Errorf("Redis accepted %d connections during the reload run, want 0: the pool was not shared across reloads", got)
	}
	// goroutineSlack is 0: once the old servers have finished their
	// shutdown and the idle connections are closed (ours by
	// CloseIdleConnections, the upstream ones by upstreamIdle), a reload
	// leaves no goroutine behind. The count may come out lower than the
	// warm-up's: when this test is the first of the process to load a
	// config, that load's TLS storage cleaning holds a certmagic file lock
	// whose keepLockfileFresh goroutine lingers up to 5 s after its release,
	// and goroutines left by earlier tests (such as idle upstream
	// connections, see upstreamIdle) only ever go away.
	g, stacks := settleGoroutinesTo(t, tr, baseG+goroutineSlack)
	if g > baseG+goroutineSlack {
		t.Errorf("%d goroutines after the reloads, %d after the warm-up; new ones:\n%s", g, baseG, stackDiff(baseStacks, stacks))
	}
	t.Logf("after the reloads: %d goroutines (warm-up %d), %d Redis connections (warm-up %d); test took %v",
		g, baseG, probe.others(t), baseRedis, time.Since(started).Round(time.Millisecond))
}

// loadResult sends chat completions in a loop from several goroutines and
// tallies the outcomes per org and status (status 0: no answer, a transport
// error; -1: a 200 without the upstream's body).
type loadResult struct {
	client *http.Client
	url    string

	mu      sync.Mutex
	tally   map[[2]string]int // {org, status} -> count
	errs    []string          // the first transport errors and odd answers
	gens    map[string]bool   // X-Rl-Gen values seen
	done    map[string]int    // completed requests per org
	retried atomic.Int64      // requests that the transport sent more than once
	seq     atomic.Int64
}

type requestTally struct {
	tally   map[[2]string]int
	errs    []string
	gens    map[string]bool
	retried int64
}

// run starts n client goroutines, each sending requests for orgOf(i) until
// drive returns, waits for them and returns what they saw. drive gets a
// function that reports whether the clients have stopped on their own.
func (l *loadResult) run(n int, orgOf func(i int) string, drive func(stop func() bool)) *requestTally {
	l.mu.Lock()
	l.tally, l.errs, l.gens, l.done = map[[2]string]int{}, nil, map[string]bool{}, map[string]int{}
	l.retried.Store(0)
	l.mu.Unlock()
	var stopping atomic.Bool
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stopping.Load() {
				l.one(orgOf(i))
			}
		}()
	}
	drive(stopping.Load)
	stopping.Store(true)
	wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return &requestTally{tally: l.tally, errs: l.errs, gens: l.gens, retried: l.retried.Load()}
}

func (l *loadResult) one(org string) {
	attempts := 0
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { attempts++ }}
	ctx := httptrace.WithClientTrace(context.Background(), trace)
	idempotencyKey := org + "-" + strconv.FormatInt(l.seq.Add(1), 10)
	send := func() (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", l.url, strings.NewReader(`{"model":"m"}`))
		req.Header.Set("X-Org", org)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", idempotencyKey)
		return l.client.Do(req)
	}
	// A reload closes the old server's idle keep-alive connections, and a
	// request the client has just written on one of them is lost unanswered:
	// net/http's HTTP/1.1 race, with or without the module (the same run
	// without it loses as many requests). Like the LLM SDKs, which retry on
	// connection errors, the client sends the request again on a fresh
	// connection, which Go's transport does for a POST only when it carries
	// an Idempotency-Key and the server closed the connection before
	// answering a byte. Such a request was never read, so never admitted:
	// the exact counts below would show a double admission.
	status, gen, note := 0, "", ""
	res, err := send()
	// A connection reset while it is dialled (the listener is handed over
	// during a reload), or one closed again before it answered (the next
	// reload closed it idle): the request never reached the handler either.
	// Send again, as an SDK would, a few times at most.
	for tries := 1; tries < 4 && isConnectionLoss(err); tries++ {
		attempts++
		res, err = send()
	}
	if err != nil {
		note = err.Error()
	} else {
		body, rerr := io.ReadAll(res.Body)
		res.Body.Close()
		status, gen = res.StatusCode, res.Header.Get("X-Rl-Gen")
		switch {
		case rerr != nil:
			status, note = 0, "reading the body: "+rerr.Error()
		case status == 200 && !bytes.Contains(body, []byte("chat.completion")):
			status, note = -1, "a 200 without the upstream's body: "+string(body)
		case status != 200 && status != 429:
			note = fmt.Sprintf("%d %s", status, body)
		}
	}
	if attempts > 1 {
		l.retried.Add(1)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tally[[2]string{org, strconv.Itoa(status)}]++
	l.done[org]++
	if gen != "" {
		l.gens[gen] = true
	}
	if note != "" && len(l.errs) < 20 {
		l.errs = append(l.errs, org+": "+note)
	}
}

// isConnectionLoss reports an error of a connection that was lost before any
// answer: refused or reset at dial, or closed unanswered.
func isConnectionLoss(err error) bool {
	var opErr *net.OpError
	return err != nil && (errors.As(err, &opErr) && opErr.Op == "dial" ||
		errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || strings.Contains(err.Error(), "server closed idle connection"))
}

// completed is how many requests for org have completed so far.
func (l *loadResult) completed(org string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done[org]
}

// count is the number of requests for org ("": any) that got status (0:
// any status, including transport errors).
func (r *requestTally) count(org string, status int) int {
	n := 0
	for k, v := range r.tally {
		if (org == "" || k[0] == org) && (status == 0 || k[1] == strconv.Itoa(status)) {
			n += v
		}
	}
	return n
}

func (r *requestTally) total() int { return r.count("", 0) }

func (r *requestTally) generations() []string {
	var out []string
	for g := range r.gens {
		out = append(out, g)
	}
	sort.Strings(out)
	return out
}

// mustAllBe fails unless every request for org ("": any) got one of the
// statuses.
func (r *requestTally) mustAllBe(t *testing.T, what, org string, statuses ...int) {
	t.Helper()
	allowed := map[string]bool{}
	for _, s := range statuses {
		allowed[strconv.Itoa(s)] = true
	}
	bad := map[string]int{}
	for k, v := range r.tally {
		if (org == "" || k[0] == org) && !allowed[k[1]] {
			bad[k[1]] += v
		}
	}
	if len(bad) > 0 {
		t.Errorf("%s: unexpected answers (status 0: no answer, -1: a 200 without the upstream's body) %v of %d requests; first problems:\n%s", what, bad, r.count(org, 0), strings.Join(r.errs, "\n"))
	}
}

// connProbe is the test's own connection to its redis-server, used to read
// the server's state; it is excluded from the connection counts.
type connProbe struct {
	c  *redis.Client
	id int64
}

func newConnProbe(t *testing.T, srv *redistest.Server) *connProbe {
	c := redistest.Client(srv.Addr(), 5*time.Second) // one connection, kept
	t.Cleanup(func() { c.Close() })
	id, err := c.ClientID(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return &connProbe{c: c, id: id}
}

func (p *connProbe) clientList(t *testing.T) string {
	t.Helper()
	list, err := p.c.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// others counts the server's client connections other than the probe's,
// from CLIENT LIST, and checks INFO clients agrees.
func (p *connProbe) others(t *testing.T) int {
	t.Helper()
	n := 0
	self := false
	for _, line := range strings.Split(strings.TrimSpace(p.clientList(t)), "\n") {
		if strings.HasPrefix(line, "id="+strconv.FormatInt(p.id, 10)+" ") {
			self = true
			continue
		}
		if line != "" {
			n++
		}
	}
	if !self {
		t.Fatal("the probe's connection is not in CLIENT LIST: it reconnected")
	}
	if connected := p.infoField(t, "clients", "connected_clients"); connected != int64(n+1) {
		// The two are read one after the other: a connection may come or go
		// in between, which the callers' own comparisons will show.
		t.Logf("CLIENT LIST has %d connections, INFO clients says %d", n+1, connected)
	}
	return n
}

func (p *connProbe) connectionsReceived(t *testing.T) int64 {
	return p.infoField(t, "stats", "total_connections_received")
}

func (p *connProbe) infoField(t *testing.T, section, field string) int64 {
	t.Helper()
	info, err := p.c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in INFO %s", field, section)
	return 0
}

// now is the Redis server's clock, which decides the periods.
func (p *connProbe) now(t *testing.T) time.Time {
	t.Helper()
	now, err := p.c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

func (p *connProbe) get(t *testing.T, key string) int64 {
	t.Helper()
	n, err := p.c.Get(context.Background(), key).Int64()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// sumReq adds up every req period of the org, whatever minute it is in.
func (p *connProbe) sumReq(t *testing.T, org string) int64 {
	t.Helper()
	keys, err := p.c.Keys(context.Background(), newLimit("org", org, 0, 0).Prefix+"req:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, k := range keys {
		sum += p.get(t, k)
	}
	return sum
}

// settledGoroutines closes the client's idle connections and waits until the
// goroutine count has held still for stillFor.
func settledGoroutines(t *testing.T, tr *http.Transport) (int, map[string]int) {
	t.Helper()
	tr.CloseIdleConnections()
	// caddytest loads and checks configs with http.DefaultTransport, whose
	// idle connections to the admin server would otherwise count until that
	// server is replaced by the next load.
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	last, since := runtime.NumGoroutine(), time.Now()
	err := poll.Until(waitBound, pollEvery, func() error {
		if g := runtime.NumGoroutine(); g != last {
			last, since = g, time.Now()
		}
		if time.Since(since) < stillFor {
			return fmt.Errorf("goroutines still changing: %d", last)
		}
		return nil
	})
	if err != nil {
		t.Logf("after %v: %v", waitBound, err)
	}
	return last, goroutineStacks()
}

// settleGoroutinesTo waits, for a bounded time, until at most want goroutines are
// left, then until the count holds still.
func settleGoroutinesTo(t *testing.T, tr *http.Transport, want int) (int, map[string]int) {
	t.Helper()
	tr.CloseIdleConnections()
	poll.Until(waitBound, pollEvery, func() error {
		if g := runtime.NumGoroutine(); g > want {
			return fmt.Errorf("%d goroutines, want at most %d", g, want)
		}
		return nil
	})
	return settledGoroutines(t, tr)
}

// goroutineStacks counts the goroutines by their stack (pprof's debug=1 groups).
func goroutineStacks() map[string]int {
	var buf bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&buf, 1)
	out := map[string]int{}
	for _, group := range strings.Split(buf.String(), "\n\n")[1:] {
		head, rest, _ := strings.Cut(group, " @ ")
		n, err := strconv.Atoi(strings.TrimSpace(head))
		if err != nil {
			continue
		}
		_, frames, _ := strings.Cut(rest, "\n")
		if strings.Contains(frames, ".goroutineStacks+") {
			continue // the goroutine asking
		}
		out[frames] += n
	}
	return out
}

// stackDiff lists the stacks that have more goroutines in after than in
// before.
func stackDiff(before, after map[string]int) string {
	var b strings.Builder
	for stack, n := range after {
		if d := n - before[stack]; d > 0 {
			fmt.Fprintf(&b, "+%d:\n%s\n", d, stack)
		}
	}
	return b.String()
}

// countLines counts the lines of file that contain s.
func countLines(t *testing.T, file, s string) int {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), s)
}
