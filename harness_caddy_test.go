package ratelimit

// The gateways under test: a real Caddy over real HTTP, on loopback.
//
// Most tests load their site into the Caddy that runs in this process
// (startGateway), whose admin API takes every test's config in turn. The
// tests of several gateways, or of one killed with SIGKILL, run each
// gateway as a Caddy process of its own (startCaddyProcesses: ./cmd/caddy,
// built once per run of the test binary), every one with its own Redis
// client.
//
// Every site and admin endpoint binds 127.0.0.1. Its port is one that
// freePort found free, but another socket can take it before Caddy binds
// it (on a busy machine, any outgoing connection's), so a gateway that
// cannot bind its port is started again on another (onFreePorts).

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// freePort is a port of 127.0.0.1 that was free a moment ago.
func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// portTries is how many times a gateway is started on ports picked anew
// before its test fails.
const portTries = 5

// onFreePorts calls start with a picker of ports (pick, at first), again
// with freePort as long as start fails because a port it was given was
// taken, up to portTries times.
func onFreePorts(t testing.TB, pick func() int, start func(pick func() int) error) {
	t.Helper()
	for try := 1; ; try++ {
		err := start(pick)
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), syscall.EADDRINUSE.Error()) || try == portTries {
			t.Fatal(err)
		}
		t.Logf("a port was taken before the gateway bound it; starting it on others: %v", err)
		pick = freePort
	}
}

// caddyAdmin is the admin port of the Caddy that runs in this process,
// started on the first call: every in-process gateway's config is loaded
// through its admin API.
var caddyAdmin = sync.OnceValue(func() int {
	for try := 1; ; try++ {
		admin := freePort()
		err := caddy.Load(fmt.Appendf(nil, `{"admin":{"listen":"localhost:%d"}}`, admin), true)
		if err == nil {
			return admin
		}
		if !strings.Contains(err.Error(), syscall.EADDRINUSE.Error()) || try == portTries {
			panic(fmt.Sprintf("starting Caddy in the test process: %v", err))
		}
	}
})

// unloadGateways loads a config of the admin API alone into the in-process
// Caddy: the sites of earlier tests stop, and their handlers let go of
// their stores.
func unloadGateways(t *testing.T) {
	t.Helper()
	admin := caddyAdmin()
	code, answer, err := postLoad(admin, fmt.Sprintf("{\n\tadmin localhost:%d\n\tpersist_config off\n}\n", admin), false)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("%d %s", code, answer)
	}
	if err != nil {
		t.Fatalf("unloading the gateways of earlier tests: %v", err)
	}
}

// gateway is a Caddy site on loopback whose routes are a test's.
type gateway struct {
	tester *caddytest.Tester // its Client talks to the site
	url    string
	port   int // for a test that loads another config on the same site
	// reload: the gateway's config replaced one on its port, and send has
	// not sent anything yet (send).
	reload bool
}

// startGateway loads a site whose routes are body, with the upstream's
// address for {upstream}, into the in-process Caddy, on a free port.
func startGateway(t *testing.T, upstreamURL string, body string) *gateway {
	t.Helper()
	return startGatewayWith(t, upstreamURL, "", body, 0)
}

// startGatewayWith is startGateway with global options besides those every
// gateway has, on port: a free one if 0, else the port of a gateway already
// running, whose config it replaces (a reload).
func startGatewayWith(t *testing.T, upstreamURL string, globals, body string, port int) *gateway {
	t.Helper()
	pick := freePort
	if port != 0 {
		pick = func() int { return port }
	}
	gw := startGatewayOn(t, pick, upstreamURL, globals, body)
	gw.reload = port != 0
	return gw
}

// startGatewayOn is startGatewayWith on the port pick chooses, or on
// another free one if it was taken.
func startGatewayOn(t *testing.T, pick func() int, upstreamURL, globals, body string) *gateway {
	t.Helper()
	admin := caddyAdmin()
	gw := &gateway{tester: caddytest.NewTester(t)}
	onFreePorts(t, pick, func(pick func() int) error {
		gw.port = pick()
		code, answer, err := postLoad(admin, gatewayCaddyfile(admin, gw.port, globals, body, upstreamURL), false)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("loading the gateway's config: %d %s", code, answer)
		}
		return err
	})
	gw.url = fmt.Sprintf("http://127.0.0.1:%d", gw.port)
	return gw
}

// postLoad loads a Caddyfile through the admin API on port admin; with
// force, even if its JSON is the running config's. Each load replaces the
// admin server, so each POST uses a connection of its own.
func postLoad(admin int, caddyfile string, force bool) (int, string, error) {
	req, err := http.NewRequest("POST", fmt.Sprintf("http://localhost:%d/load", admin), strings.NewReader(caddyfile))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	if force {
		req.Header.Set("Cache-Control", "must-revalidate")
	}
	c := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	res, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	answer, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(answer), nil
}

// gatewayCaddyfile is the whole Caddyfile of a test gateway: the admin on
// its port, the site on port with body as its routes, and the upstream's
// address for {upstream}, all on loopback.
func gatewayCaddyfile(admin, port int, globals, body, upstreamURL string) string {
	return fmt.Sprintf(`{
	admin localhost:%d
	persist_config off
	auto_https off
	skip_install_trust
	grace_period 1ns
	default_bind 127.0.0.1
	http_port %d
%s
}
:%d {
%s
}
`, admin, port, globals, port, strings.ReplaceAll(body, "{upstream}", strings.TrimPrefix(upstreamURL, "http://")))
}

// do sends a chat completion with the given headers ("Name: value").
func (g *gateway) do(t *testing.T, headers ...string) (*http.Response, string) {
	t.Helper()
	res, body := g.send(t, "POST", "/v1/chat/completions", `{"model":"m"}`, headers...)
	return res, string(body)
}

// send sends a request with the given headers ("Name: value") and reads the
// whole answer.
func (g *gateway) send(t *testing.T, method, path, body string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	request := func() *http.Request {
		req, err := http.NewRequest(method, g.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		setHeaders(req, headers)
		return req
	}
	if g.reload {
		// Caddy's reload stops the old servers accepting only once their
		// Shutdown runs (caddyhttp.App.Stop says so): a connection they
		// accepted meanwhile is closed unanswered under the tests'
		// grace_period 1ns. The first request after a reload that gets no
		// answer at all is sent once more, on a new connection.
		g.reload = false
		res, err := g.tester.Client.Do(request())
		if err == nil {
			defer res.Body.Close()
			got, err := io.ReadAll(res.Body)
			if err != nil {
				t.Fatal(err)
			}
			return res, got
		}
		t.Logf("the first request after a reload got no answer (%v): sending it again", err)
	}
	return mustDo(t, g.tester.Client, request())
}

// mustDo sends req with c and reads the whole answer; the test fails if it
// gets none, or not all of it.
func mustDo(t *testing.T, c *http.Client, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, got
}

// setHeaders adds header lines ("Name: value"); a name given twice is sent
// twice.
func setHeaders(req *http.Request, headers []string) {
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ": ")
		req.Header.Add(name, value)
	}
}

// eachStore runs test on the in-process store (store "") and, when the
// tests have a Redis, on Redis (store its redis line), as the store
// conformance suite does: the HTTP contract holds on both.
func eachStore(t *testing.T, test func(t *testing.T, store string)) {
	t.Run("memory", func(t *testing.T) { test(t, "") })
	t.Run("redis", func(t *testing.T) { test(t, redisLine(t)) })
}

// redisLine is the store line of the gateways under test: the shared Redis.
func redisLine(t *testing.T) string {
	return "redis " + redistest.EnvURL(t)
}

// storeKind is the live view's name of the store of a store line.
func storeKind(store string) string {
	if store == "" {
		return "memory"
	}
	return "redis"
}

// flightStore is the store line of gateways that must never admit a
// request unchecked: on Redis, a client that waits for Redis up to 2 s.
// Under -race on a loaded machine a call can take longer than the default
// 100 ms, and on_redis_error would then answer for the store: these tests'
// gateways set it to deny, so that a store failure is a 503, never an
// admission unchecked that would look like a cap overshot.
func flightStore(store string) string {
	if store == "" {
		return ""
	}
	return store + " {\n\ttimeout 2s\n}"
}

// limited is the routes of a test site: a rolter_ratelimit block on store
// (a redis line, or "" for the in-process store) holding lines, the reverse
// proxy to the test upstream, then the site's other directives.
func limited(store, lines string, after ...string) string {
	var b strings.Builder
	b.WriteString("\trolter_ratelimit {\n")
	for l := range strings.Lines(store + "\n" + lines) {
		if l = strings.TrimSpace(l); l != "" {
			b.WriteString("\t\t" + l + "\n")
		}
	}
	b.WriteString("\t}\n\treverse_proxy {upstream}\n")
	for _, a := range after {
		b.WriteString(a + "\n")
	}
	return b.String()
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
	return &http.Client{Transport: tr, Timeout: 3 * waitBound}
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

// caddyBuild is ./cmd/caddy, built once per run of the test binary, in a
// directory TestMain removes.
var caddyBuild struct {
	once      sync.Once
	dir, path string
	err       error
}

// caddyBinary builds ./cmd/caddy on its first call; a failed build fails
// every test that needs it.
func caddyBinary(t *testing.T) string {
	t.Helper()
	caddyBuild.once.Do(func() {
		caddyBuild.dir, caddyBuild.err = os.MkdirTemp("", "rolter-test-caddy-")
		if caddyBuild.err != nil {
			return
		}
		path := filepath.Join(caddyBuild.dir, "caddy")
		out, err := exec.Command("go", "build", "-o", path, "./cmd/caddy").CombinedOutput()
		if err != nil {
			caddyBuild.err = fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
			return
		}
		caddyBuild.path = path
	})
	if caddyBuild.err != nil {
		t.Fatal(caddyBuild.err)
	}
	return caddyBuild.path
}

// caddyProcess is a gateway in a Caddy process of its own, on loopback,
// with its admin endpoint on a port of its own.
type caddyProcess struct {
	url    string
	admin  int
	log    string // the file of its log: Caddy's JSON lines
	cmd    *exec.Cmd
	exited chan struct{}
}

// startCaddyProcesses starts n gateway processes whose routes are body,
// with the upstream's address for {upstream}, and stops them in
// t.Cleanup.
func startCaddyProcesses(t *testing.T, n int, up *fakeUpstream, body string) []*caddyProcess {
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
// besides those every gateway has, and returns once it serves its site.
func startCaddyProcessWith(t *testing.T, bin, upstreamURL, globals, body string) *caddyProcess {
	t.Helper()
	return startCaddyProcessOn(t, freePort, bin, upstreamURL, globals, body)
}

// startCaddyProcessOn is startCaddyProcessWith on the ports pick chooses
// (its site's, then its admin endpoint's), or on other free ones if one was
// taken.
func startCaddyProcessOn(t *testing.T, pick func() int, bin, upstreamURL, globals, body string) *caddyProcess {
	t.Helper()
	var p *caddyProcess
	onFreePorts(t, pick, func(pick func() int) error {
		var err error
		port, admin := pick(), pick()
		p, err = tryCaddyProcess(t, bin, port, admin, gatewayCaddyfile(admin, port, globals, body, upstreamURL))
		return err
	})
	return p
}

// tryCaddyProcess starts a gateway process of caddyfile, whose site is on
// port and admin endpoint on admin, and returns once Caddy says (--pingback) that it
// runs its config; an error once the process has exited without, or if it
// has not said so within waitBound (then it is killed).
func tryCaddyProcess(t *testing.T, bin string, port, admin int, caddyfile string) (*caddyProcess, error) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "caddy.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the process has its own descriptor
	// Caddy dials the pingback address once its config runs and writes
	// there what it read on its stdin: this test's own random bytes, so
	// that no other connection passes for it. The listener picks its port.
	pingback, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pingback.Close()
	confirm := []byte(rand.Text())
	cmd := exec.Command(bin, "run", "--config", file, "--adapter", "caddyfile", "--pingback", pingback.Addr().String())
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir, "HOME="+dir)
	cmd.Stdin = bytes.NewReader(confirm)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = diesWithTheTest()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &caddyProcess{url: fmt.Sprintf("http://127.0.0.1:%d", port), admin: admin, log: logFile.Name(), cmd: cmd, exited: make(chan struct{})}
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
	confirmed := make(chan bool, 1)
	go func() {
		conn, err := pingback.Accept()
		if err != nil {
			confirmed <- false
			return
		}
		defer conn.Close()
		got, _ := io.ReadAll(io.LimitReader(conn, int64(len(confirm))+1))
		confirmed <- bytes.Equal(got, confirm)
	}()
	select {
	case ok := <-confirmed:
		if ok {
			return p, nil
		}
		return nil, errors.New("the gateway process's pingback did not confirm its start")
	case <-p.exited:
		log, _ := os.ReadFile(logFile.Name())
		return nil, fmt.Errorf("the gateway process exited: %v\n%s", cmd.ProcessState, log)
	case <-time.After(waitBound):
		p.kill(t)
		return nil, fmt.Errorf("the gateway process on %s did not start within %v", p.url, waitBound)
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
	case <-time.After(waitBound):
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

func logsOf(gws []*caddyProcess) []string {
	out := make([]string, len(gws))
	for i, g := range gws {
		out[i] = g.log
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
