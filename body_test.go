package ratelimit

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/llmapi"
	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// requestOf is r as ServeHTTP reads it, without a replacer.
func requestOf(r *http.Request) *request {
	call := llmapi.Of(r.URL.Path)
	return &request{Request: r, call: call, dia: dialectOf("", call)}
}

// readWhole reads r's body as the handler does and returns it when it was
// read whole, else nil; its memory is given back when the test ends, as
// ServeHTTP gives it back when the request ends.
func readWhole(t *testing.T, r *http.Request) []byte {
	t.Helper()
	req := requestOf(r)
	body, err := readRequestBody(req, defaultBodyMemory)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(req.held.release)
	return body.whole()
}

// A body longer than the read limit reserves the estimate of what was read
// of it, so that it never reserves less than a shorter body that begins
// alike; it still reaches the upstream whole.
func TestABodyOverTheReadLimitReservesNoLessThanOneUnderIt(t *testing.T) {
	h := &Handler{}
	chain := []limiter.Limit{newLimit("org", "o", 0, limiter.MaxCap)}
	reserve := func(content int) limiter.TokenCounts {
		body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", content) + `"}]}`
		r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		read, err := readRequestBody(requestOf(r), defaultBodyMemory)
		if err != nil {
			t.Fatal(err)
		}
		if read.complete != (len(body) <= maxReadBody) {
			t.Fatalf("a body of %d bytes read complete: %v", len(body), read.complete)
		}
		reserved, _ := h.reservation(estimate(llmapi.Of(r.URL.Path), read), chain, nil)
		if forwarded, err := io.ReadAll(r.Body); err != nil || string(forwarded) != body {
			t.Fatalf("a body of %d bytes forwarded as %d bytes (%v)", len(body), len(forwarded), err)
		}
		return reserved
	}
	under, over := reserve(maxReadBody-100), reserve(maxReadBody+100)
	if over.Input < under.Input || under.Input < (maxReadBody-100)/4 {
		t.Fatalf("a body over the read limit reserves %d input tokens, one under it %d", over.Input, under.Input)
	}
}

// Every byte a body holds under body_memory is given back once the next
// handler has read it, or closed it, or the request ends unread.
func TestABodysMemoryIsGivenBackOnceReadClosedOrReleased(t *testing.T) {
	for name, finish := range map[string]func(req *request){
		"read":     func(req *request) { io.ReadAll(req.Body) },
		"closed":   func(req *request) { req.Body.Close() },
		"released": func(req *request) { req.held.release() },
	} {
		r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"`+strings.Repeat("m", 40000)+`"}`))
		r.Header.Set("Content-Type", "application/json")
		req := requestOf(r)
		b, err := readRequestBody(req, defaultBodyMemory)
		if err != nil {
			t.Fatal(err)
		}
		if bodiesHeld.bytesHeld() < int64(len(b.bytes)) {
			t.Fatalf("%s: %d bytes held for a body of %d", name, bodiesHeld.bytesHeld(), len(b.bytes))
		}
		finish(req)
		req.held.release() // as ServeHTTP does at the end, whatever came before
		if held := bodiesHeld.bytesHeld(); held != 0 {
			t.Fatalf("%s: %d bytes still held", name, held)
		}
	}
}

// upload is a client's request to a gateway on a connection of its own,
// written by hand: a chat request for a key whose headers claim a 4 MiB
// body and hold it back until asked (Expect: 100-continue); once asked,
// it sends the first bytes of the body it chose, then nothing.
type upload struct {
	conn net.Conn
	// lines are the status lines of its answers as they come: the 100
	// Continue that asks for the body, then the final answer.
	lines chan string
}

// claimedBody is the Content-Length an upload claims.
const claimedBody = 4194300

// startUpload opens an upload from the loopback address from, which Caddy
// reads as its client's address, for key (a new one if ""), and, once asked
// for its body, sends sent bytes of it.
func startUpload(t *testing.T, gw *gateway, from, key string, sent int) *upload {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(gw.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if key == "" {
		key = redistest.UniqueID(t)
	}
	u := &upload{conn: conn, lines: make(chan string, 2)}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nX-Api-Key: %s\r\n"+
		"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n", key, claimedBody)
	go func() {
		defer close(u.lines)
		r := bufio.NewReader(conn)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if strings.HasPrefix(line, "HTTP/") {
				u.lines <- strings.TrimSpace(line)
			}
		}
	}()
	if sent > 0 {
		u.askedForBody(t)
		if _, err := io.WriteString(conn, chatOf(sent)); err != nil {
			t.Fatal(err)
		}
	}
	return u
}

// askedForBody waits until the gateway asks for the upload's body, which it
// does once the limiter reads it: an answer instead fails the test.
func (u *upload) askedForBody(t *testing.T) {
	t.Helper()
	select {
	case line := <-u.lines:
		if !strings.HasPrefix(line, "HTTP/1.1 100") {
			t.Fatalf("an upload holding back its body was answered %q, want to be asked for it (100 Continue)", line)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("an upload holding back its body was never asked for it")
	}
}

// chatOf is the first n bytes of a long chat request's JSON.
func chatOf(n int) string {
	head := `{"model":"m","messages":[{"role":"user","content":"`
	return (head + strings.Repeat("a", max(n-len(head), 0)))[:n]
}

// bodyMemoryGateway is a gateway whose key scope reserves tokens, so that it
// reads bodies, within body_memory 8MiB.
func bodyMemoryGateway(t *testing.T, store string) *gateway {
	t.Helper()
	return startGateway(t, newUpstream(t).URL, limited(store, `
		scope key {http.request.header.X-Api-Key}
		limit key * tpm 100000000
		body_memory 8MiB`))
}

// stallAll starts n uploads from the address from that each send sent bytes
// and stall, and waits until their bodies hold all of body_memory 8MiB.
func stallAll(t *testing.T, gw *gateway, from string, n, sent int) []*upload {
	t.Helper()
	uploads := make([]*upload, n)
	for i := range uploads {
		uploads[i] = startUpload(t, gw, from, "", sent)
	}
	waitBodiesHeld(t, 8<<20)
	return uploads
}

// pacedBody is a body sent at a normal pace: chunk bytes at a time, every
// pause, as a client on a slower link sends it.
type pacedBody struct {
	rest    string
	chunk   int
	pause   time.Duration
	started bool
}

func (p *pacedBody) Read(b []byte) (int, error) {
	if p.rest == "" {
		return 0, io.EOF
	}
	if p.started {
		time.Sleep(p.pause)
	}
	p.started = true
	n := copy(b[:min(len(b), p.chunk)], p.rest)
	p.rest = p.rest[n:]
	return n, nil
}

// postPaced posts a chat request of size bytes, sent at a normal pace (16
// KiB every 2 ms, 8 MB/s), from the test's own address.
func postPaced(t *testing.T, gw *gateway, size int) (*http.Response, []byte) {
	t.Helper()
	body := chatOf(size-2) + `"}]}`
	req, err := http.NewRequest("POST", gw.url+"/v1/chat/completions", &pacedBody{rest: body, chunk: 16 << 10, pause: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	setHeaders(req, []string{"Content-Type: application/json", "X-Api-Key: " + redistest.UniqueID(t)})
	res, err := gw.tester.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	got, _ := io.ReadAll(res.Body)
	return res, got
}

// answered503 waits until one of uploads is answered 503, as a body that
// gave way is: the first answer of any of them must be that 503.
func answered503(t *testing.T, uploads []*upload) {
	t.Helper()
	cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(time.After(waitBound))}}
	for _, u := range uploads {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(u.lines)})
	}
	chosen, line, _ := reflect.Select(cases)
	if chosen == 0 {
		t.Fatal("no stalled body gave way (503)")
	}
	if !strings.HasPrefix(line.String(), "HTTP/1.1 503") {
		t.Fatalf("a stalled body was answered %q, want 503", line)
	}
}

// waitBodiesHeld waits until the bodies being read hold want bytes of
// body_memory.
func waitBodiesHeld(t *testing.T, want int64) {
	t.Helper()
	waitCount(t, "bytes held by the bodies being read", bodiesHeld.bytesHeld, want)
}

// One client cannot keep body_memory from another: four connections each
// send 1.1 MB of a 4 MiB body (a buffer of 2 MiB each, all of body_memory
// 8MiB) and then nothing; a client that sends a 512 KiB body at a normal
// pace is admitted, and one of the stalled bodies gives way, answered 503,
// its connection closed. So it is whether the stalled bodies come from
// another address (they hold more than the client's), or from the
// client's own (behind a proxy, every client is one address), once they
// have sent nothing for half a second.
func TestStalledBodiesGiveWayToABodySentAtANormalPace(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		for _, from := range []string{"127.0.0.2", "127.0.0.1"} {
			gw := bodyMemoryGateway(t, store)
			stalled := stallAll(t, gw, from, 4, 1_100_000)
			if res, got := postPaced(t, gw, 512<<10); res.StatusCode != http.StatusOK {
				t.Fatalf("a body sent at a normal pace while bodies from %s stalled, holding body_memory: %d %s", from, res.StatusCode, got)
			}
			answered503(t, stalled)
			for _, u := range stalled {
				u.conn.Close()
			}
			waitBodiesHeld(t, 0)
		}
	})
}

// So they do on HTTP/2, where one connection carries many bodies: four
// streams of one h2c connection from one address each send 1.1 MB and then
// nothing, holding all of body_memory 8MiB; a client at another address
// is admitted, and one stream gives way, answered 503.
func TestStalledHTTP2StreamsGiveWayToAnotherClientsBody(t *testing.T) {
	eachStore(t, func(t *testing.T, store string) {
		gw := startGatewayWith(t, newUpstream(t).URL, "\tservers {\n\t\tprotocols h1 h2c\n\t}", limited(store, `
			scope key {http.request.header.X-Api-Key}
			limit key * tpm 100000000
			body_memory 8MiB`), 0)
		var protocols http.Protocols
		protocols.SetUnencryptedHTTP2(true)
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
		h2c := &http.Client{Transport: &http.Transport{Protocols: &protocols, DialContext: d.DialContext}}
		t.Cleanup(h2c.CloseIdleConnections)
		statuses := make(chan int, 4)
		for range 4 {
			body, send := io.Pipe()
			t.Cleanup(func() { send.Close() })
			go send.Write([]byte(chatOf(1_100_000)))
			req, _ := http.NewRequest("POST", gw.url+"/v1/chat/completions", body)
			req.ContentLength = claimedBody
			setHeaders(req, []string{"Content-Type: application/json", "X-Api-Key: " + redistest.UniqueID(t)})
			go func() {
				res, err := h2c.Do(req)
				if err != nil {
					statuses <- 0
					return
				}
				res.Body.Close()
				if res.ProtoMajor != 2 {
					t.Errorf("a stream was answered over %s, want HTTP/2", res.Proto)
				}
				statuses <- res.StatusCode
			}()
		}
		waitBodiesHeld(t, 8<<20)
		if res, got := postPaced(t, gw, 512<<10); res.StatusCode != http.StatusOK {
			t.Fatalf("a body sent at a normal pace while another address's stalled streams held body_memory: %d %s", res.StatusCode, got)
		}
		select {
		case status := <-statuses:
			if status != http.StatusServiceUnavailable {
				t.Fatalf("a stalled stream was answered %d, want 503", status)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no stalled stream gave way (503)")
		}
	})
}
