package ratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// fakeUpstream plays the LLM APIs behind the gateways under test. What it
// answers is its mode's (upstreamMode); whatever the mode, it
//   - counts the requests that reach it (hits), those it has open and the
//     most it had open at once (open, peak);
//   - keeps each request as it arrived, body and all (requests, arrivals);
//   - answers a request whose X-Answer header names an answer the test
//     scripted (script) with that answer;
//   - holds a request that asks for it (X-Upstream: held) until the test
//     releases it (release), then answers it by its mode.
type fakeUpstream struct {
	*httptest.Server
	mode             upstreamMode
	hits, open, peak atomic.Int64
	// arrived gets a value for each held request once it has reached the
	// upstream, and abandoned one for each the gateway gave up while held.
	arrived, abandoned chan struct{}
	// creates counts the response.create events of the realtime sessions
	// (answerRealtime).
	creates atomic.Int64
	closed  chan struct{} // the test is over: nothing is held any more

	mu       sync.Mutex
	gate     chan struct{} // closed by release
	received []upstreamRequest
	answers  []scriptedAnswer
}

// An upstreamMode answers a request that reached u, its body read (and
// readable again).
type upstreamMode func(u *fakeUpstream, w http.ResponseWriter, r *http.Request)

// upstreamRequest is a request as the upstream received it.
type upstreamRequest struct {
	at            time.Time
	header        http.Header
	contentLength int64
	body          []byte
}

type scriptedAnswer struct {
	status      int
	contentType string
	body        string
}

// newUpstream is the upstream most tests need: it answers as each request
// asks (answerAsAsked).
func newUpstream(t *testing.T) *fakeUpstream {
	return newFakeUpstream(t, answerAsAsked)
}

func newFakeUpstream(t *testing.T, mode upstreamMode) *fakeUpstream {
	u := &fakeUpstream{mode: mode, arrived: make(chan struct{}, 1024), abandoned: make(chan struct{}, 1024), gate: make(chan struct{}), closed: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(func() {
		close(u.closed)
		u.Close()
	})
	return u
}

// How a request asks answerAsAsked, or any mode for held, to answer it, in
// its X-Upstream header.
const (
	upstreamFast = "fast" // a chat completion at once, as without the header
	upstreamHeld = "held" // held until the test releases it, then answered by the mode
	upstream500  = "500"  // 500 at once
	upstreamSSE  = "sse"  // events until released, or for the duration in X-Hold
	upstreamCut  = "cut"  // the first event, then the connection closed
)

func (u *fakeUpstream) serve(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	u.hits.Add(1)
	n := u.open.Add(1)
	defer u.open.Add(-1)
	for p := u.peak.Load(); n > p && !u.peak.CompareAndSwap(p, n); p = u.peak.Load() {
	}
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body)) // for the mode to read again
	u.mu.Lock()
	u.received = append(u.received, upstreamRequest{at: at, header: r.Header.Clone(), contentLength: r.ContentLength, body: body})
	u.mu.Unlock()
	if a, ok := u.scripted(r); ok {
		w.Header().Set("Content-Type", a.contentType)
		w.WriteHeader(a.status)
		writeInFlushedChunks(w, []byte(a.body), 97)
		return
	}
	if r.Header.Get("X-Upstream") == upstreamHeld && !u.hold(r) {
		return
	}
	u.mode(u, w, r)
}

// hold holds r until the test releases it (or ends, or a safety bound has
// passed: nothing is held forever), and says whether r is still to be
// answered: not if the gateway gave it up first.
func (u *fakeUpstream) hold(r *http.Request) bool {
	gate := u.currentGate()
	u.arrived <- struct{}{}
	safety := time.NewTimer(2 * waitBound)
	defer safety.Stop()
	select {
	case <-gate:
	case <-u.closed:
	case <-safety.C:
	case <-r.Context().Done():
		u.abandoned <- struct{}{}
		return false
	}
	return true
}

// release answers every request held so far; later ones are held again.
func (u *fakeUpstream) release() {
	u.mu.Lock()
	defer u.mu.Unlock()
	close(u.gate)
	u.gate = make(chan struct{})
}

func (u *fakeUpstream) currentGate() chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.gate
}

// requests is every request received so far, in the order they arrived.
func (u *fakeUpstream) requests() []upstreamRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.received)
}

// lastRequest is the request received last; the test fails if none was.
func (u *fakeUpstream) lastRequest(t *testing.T) upstreamRequest {
	t.Helper()
	all := u.requests()
	if len(all) == 0 {
		t.Fatal("no request reached the upstream")
	}
	return all[len(all)-1]
}

// arrivals is when each request arrived, in order.
func (u *fakeUpstream) arrivals() []time.Time {
	var times []time.Time
	for _, r := range u.requests() {
		times = append(times, r.at)
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	return times
}

// script scripts an answer and returns the header line that asks for it.
func (u *fakeUpstream) script(status int, contentType, body string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.answers = append(u.answers, scriptedAnswer{status, contentType, body})
	return "X-Answer: " + strconv.Itoa(len(u.answers)-1)
}

// json scripts a 200 with a JSON body.
func (u *fakeUpstream) json(body string) string {
	return u.script(http.StatusOK, "application/json", body)
}

// sse scripts a 200 that streams the server-sent events.
func (u *fakeUpstream) sse(events ...string) string {
	return u.script(http.StatusOK, "text/event-stream", strings.Join(events, "\n\n")+"\n\n")
}

// scripted is the answer r's X-Answer header names, if it names one; a
// request that names one never scripted is answered 418.
func (u *fakeUpstream) scripted(r *http.Request) (scriptedAnswer, bool) {
	name := r.Header.Get("X-Answer")
	if name == "" {
		return scriptedAnswer{}, false
	}
	n, err := strconv.Atoi(name)
	u.mu.Lock()
	defer u.mu.Unlock()
	if err != nil || n < 0 || n >= len(u.answers) {
		return scriptedAnswer{http.StatusTeapot, "text/plain; charset=utf-8", "no answer scripted for X-Answer " + name + "\n"}, true
	}
	return u.answers[n], true
}

func writeInFlushedChunks(w http.ResponseWriter, body []byte, size int) {
	for len(body) > 0 {
		n := min(size, len(body))
		w.Write(body[:n])
		w.(http.Flusher).Flush()
		body = body[n:]
	}
}

const (
	chatCompletion = `{"object":"chat.completion","usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`
	chatChunk      = `data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n"
	// absurdCompletion reports 1e20 tokens of each kind: an upstream's bug.
	absurdCompletion = `{"object":"chat.completion","usage":{"prompt_tokens":1e20,"completion_tokens":1e20,"total_tokens":1e20}}`
)

// answerAsAsked answers as the request's X-Upstream header asks; by
// default with a chat completion of 3 input and 4 output tokens, which
// carries the provider's own rate-limit headers. A WebSocket handshake
// opens a session that echoes every message.
func answerAsAsked(u *fakeUpstream, w http.ResponseWriter, r *http.Request) {
	if isWebSocketHandshake(r) {
		echo(w, r)
		return
	}
	switch mode := r.Header.Get("X-Upstream"); mode {
	case upstream500:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"error":{"message":"upstream failed","type":"server_error"}}`)
	case upstreamSSE, upstreamCut:
		u.stream(w, r, mode == upstreamCut)
	default:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Ratelimit-Limit-Requests", "99999")
		w.Header().Set("X-Ratelimit-Remaining-Tokens", "12345")
		io.WriteString(w, chatCompletion)
	}
}

// stream sends chat completion chunks every 250 ms until the test releases
// the request or the duration in its X-Hold header has passed, then [DONE];
// cut closes the connection after the first chunk.
func (u *fakeUpstream) stream(w http.ResponseWriter, r *http.Request, cut bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	io.WriteString(w, chatChunk)
	rc.Flush()
	if cut {
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
	safety := time.NewTimer(2 * waitBound) // nothing streams forever
	defer safety.Stop()
	gate, tick := u.currentGate(), time.NewTicker(250*time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			io.WriteString(w, chatChunk)
			rc.Flush()
			continue
		case <-hold:
		case <-gate:
		case <-r.Context().Done():
			return
		case <-u.closed:
			return
		case <-safety.C:
			return
		}
		io.WriteString(w, "data: [DONE]\n\n")
		return
	}
}

// echo serves a WebSocket session that echoes every message until either
// side closes it.
func echo(w http.ResponseWriter, r *http.Request) {
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

// answerUsage answers a chat completion reporting usage input tokens and
// no output, or, for a status of 400 or more, an error that reports none.
func answerUsage(status int, usage int64) upstreamMode {
	return func(_ *fakeUpstream, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if status >= 400 {
			io.WriteString(w, `{"error":{"message":"upstream failed","type":"server_error"}}`)
			return
		}
		fmt.Fprintf(w, `{"object":"chat.completion","usage":{"prompt_tokens":%d,"completion_tokens":0,"total_tokens":%d}}`, usage, usage)
	}
}

// answerWithoutUsage answers a body of no API's, which reports no usage.
func answerWithoutUsage(_ *fakeUpstream, w http.ResponseWriter, _ *http.Request) {
	w.Write([]byte(`{"ok":true}`))
}

// answerAsEachAPI answers each API in its own success shape.
func answerAsEachAPI(_ *fakeUpstream, w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case strings.HasSuffix(r.URL.Path, "/v1/messages"):
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1}}`)
	case strings.HasSuffix(r.URL.Path, ":generateContent"):
		io.WriteString(w, `{"candidates":[{"content":{"parts":[{"text":"ok"}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":1,"totalTokenCount":4}}`)
	default:
		io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}
}

// answerSamples serves the golden samples of usagetest as an LLM provider
// would: GET /samples/<file>?coding=<coding>, SSE in small flushed writes.
func answerSamples(t *testing.T) upstreamMode {
	return func(_ *fakeUpstream, w http.ResponseWriter, r *http.Request) {
		file := strings.TrimPrefix(r.URL.Path, "/samples/")
		coding := r.URL.Query().Get("coding")
		body := usagetest.Encode(t, coding, usagetest.Read(t, file))
		w.Header().Set("Content-Type", usagetest.ContentType(file))
		if coding != "identity" {
			w.Header().Set("Content-Encoding", usagetest.EncodingHeader(coding))
		}
		writeInFlushedChunks(w, body, 97)
	}
}

// answerStream answers every request with stream, server-sent events, in
// flushed writes of chunk bytes: chunked, or under a Content-Length, as
// some backends send it.
func answerStream(stream []byte, chunk int, contentLength bool) upstreamMode {
	return func(_ *fakeUpstream, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if contentLength {
			w.Header().Set("Content-Length", strconv.Itoa(len(stream)))
		}
		writeInFlushedChunks(w, stream, chunk)
	}
}

// answerCutStreams streams the events of the cutStream that each request
// names by its path, then holds until the gateway gives the request up;
// gone gets a value once it has.
func answerCutStreams(streams ...cutStream) (mode upstreamMode, gone <-chan struct{}) {
	g := make(chan struct{}, 16)
	return func(u *fakeUpstream, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, s := range streams {
			if s.path == r.URL.Path {
				for _, ev := range s.events {
					io.WriteString(w, ev+"\n\n")
				}
			}
		}
		w.(http.Flusher).Flush()
		select { // the rest never comes
		case <-r.Context().Done():
			g <- struct{}{}
		case <-u.closed:
		}
	}, g
}

// createResponse is a response.create event asking the upstream for a
// response of n tokens.
func createResponse(eventID string, n int) []byte {
	return fmt.Appendf(nil, `{"type":"response.create","event_id":%q,"response":{"metadata":{"tokens":"%d"}}}`, eventID, n)
}

// answerRealtime plays OpenAI's Realtime API: it accepts every session
// (permessage-deflate when offered) and, for each response.create event
// (createResponse) it sends a response.done event whose usage totals the
// tokens its metadata asks for, in frames of at most 64 bytes with a ping
// between the fragments; it echoes any other message.
func answerRealtime(u *fakeUpstream, w http.ResponseWriter, r *http.Request) {
	upgrader := websocket.Upgrader{WriteBufferSize: 64, EnableCompression: true}
	conn, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer conn.Close()
	for {
		_, msg, err := conn.ReadMessage()
		if err != nil {
			return
		}
		var create struct {
			Type     string
			Response struct{ Metadata struct{ Tokens string } }
		}
		if json.Unmarshal(msg, &create) != nil || create.Type != "response.create" {
			conn.WriteMessage(websocket.TextMessage, msg)
			continue
		}
		u.creates.Add(1)
		n, _ := strconv.Atoi(create.Response.Metadata.Tokens)
		event := fmt.Sprintf(`{"type":"response.done","event_id":"evt_1","response":{"id":"resp_1","object":"realtime.response","status":"completed","output":[{"type":"message","content":[{"type":"audio","transcript":"%s"}]}],"usage":{"total_tokens":%d,"input_tokens":%d,"output_tokens":%d}}}`,
			strings.Repeat("la ", 100), n, n/2, n-n/2)
		fw, err := conn.NextWriter(websocket.TextMessage)
		if err != nil {
			return
		}
		for i, part := range strings.Split(event, ",") { // fragments, with pings between them
			if i > 0 {
				fw.Write([]byte(","))
			}
			fw.Write([]byte(part))
			conn.WriteControl(websocket.PingMessage, []byte("p"), time.Now().Add(time.Second))
		}
		fw.Close()
	}
}

// planAuth is a small auth service for forward_auth: it answers each
// request 200 with, in the header named header, the plan of its X-Api-Key,
// or without it for a key without a plan, as a real one would attach a
// tenant's limits.
type planAuth struct {
	*fakeUpstream
	header string
	mu     sync.Mutex
	plans  map[string]string // by X-Api-Key
}

func newPlanAuth(t *testing.T, header string, plans map[string]string) *planAuth {
	a := &planAuth{header: header, plans: plans}
	a.fakeUpstream = newFakeUpstream(t, a.answer)
	return a
}

// setPlan changes a key's plan, as a signup or an upgrade does.
func (a *planAuth) setPlan(key, plan string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.plans[key] = plan
}

func (a *planAuth) answer(_ *fakeUpstream, w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	plan, ok := a.plans[r.Header.Get("X-Api-Key")]
	a.mu.Unlock()
	if ok {
		w.Header().Set(a.header, plan)
	}
}
