package ratelimit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
	"github.com/rolter/caddy-ratelimit/internal/usage"
)

// The design of reading request bodies is in the package doc, section "What the client and the upstream choose".

// maxReadBody caps the bytes of one request body that are read; the rest of
// a larger one passes on unread, and it reserves the estimate of what was
// read.
const maxReadBody = 4 << 20

// defaultBodyMemory is the default of body_memory: sixteen bodies of the
// largest size read, or thousands of typical ones.
const defaultBodyMemory = 64 << 20

// firstBodyBuffer is the most a body's buffer starts with, once its first
// byte has come, whatever its Content-Length says; it then doubles as bytes
// arrive.
const firstBodyBuffer = 16 << 10

// bodyMemoryWait is how long a body waits for room under body_memory before
// its request is answered 503.
const bodyMemoryWait = time.Second

// bodyStall is how long a body being read may send nothing and keep its
// memory from a body that needs room: shorter than bodyMemoryWait, so that
// a body waiting for room gets that of a stalled one in time.
const bodyStall = bodyMemoryWait / 2

// errBodyMemory is a body that found no room under body_memory in time.
var errBodyMemory = errors.New("request bodies being read hold all the memory allowed to them")

// errBodyGaveWay is a body whose memory went to another body while it was
// read (bodyMemory.victimFor): its request is answered as one that found no
// room.
var errBodyGaveWay = fmt.Errorf("%w: this body gave its memory to another", errBodyMemory)

// bodyMemory is the bytes held by the bodies being read in this process,
// for every handler: each grows only while the total stays within its own
// handler's cap.
type bodyMemory struct {
	mu       sync.Mutex
	held     int64
	byClient map[string]int64 // held by the bodies of each client address
	// reading is the first of the bodies being read that hold memory,
	// those that may give way, linked through their own fields: each
	// request's body joins and leaves them, which in a map cost a hash
	// each, and left the map's groups full of deleted slots to probe.
	reading *heldBody
	freed   chan struct{} // closed when memory is given back, for waiters
}

var bodiesHeld = bodyMemory{byClient: make(map[string]int64)}

// isReading reports whether b is among the bodies being read.
func (m *bodyMemory) isReading(b *heldBody) bool { return m.reading == b || b.prevReading != nil }

// startReading adds b to the bodies being read, unless it is one.
func (m *bodyMemory) startReading(b *heldBody) {
	if m.isReading(b) {
		return
	}
	b.nextReading = m.reading
	if m.reading != nil {
		m.reading.prevReading = b
	}
	m.reading = b
}

// stopReading takes b out of the bodies being read, if it is one.
func (m *bodyMemory) stopReading(b *heldBody) {
	if !m.isReading(b) {
		return
	}
	if b.prevReading != nil {
		b.prevReading.nextReading = b.nextReading
	} else {
		m.reading = b.nextReading
	}
	if b.nextReading != nil {
		b.nextReading.prevReading = b.prevReading
	}
	b.prevReading, b.nextReading = nil, nil
}

// take grows the memory b holds to size bytes once the total leaves room
// for them under limit: at once, or by taking the room of bodies that give
// way to it (victimFor), or once some is given back or a body being read
// has stalled, waiting at most bodyMemoryWait. A body that gave way
// meanwhile gets errBodyGaveWay.
func (m *bodyMemory) take(ctx context.Context, b *heldBody, size, limit int64) error {
	var timeout <-chan time.Time // made once it waits: most bodies never do
	for {
		freed, stalls, err := m.takeOrWait(b, size, limit)
		if freed == nil {
			return err
		}
		if timeout == nil {
			timeout = time.After(bodyMemoryWait)
		}
		var stalled <-chan time.Time // nil: none will stall
		if !stalls.IsZero() {
			stalled = time.After(time.Until(stalls))
		}
		select {
		case <-freed:
		case <-stalled:
		case <-timeout:
			return errBodyMemory
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// takeOrWait is one try of take: it grows b to size, taking the room of
// the bodies that give way to it if need be, and returns a nil freed; or,
// without room, it returns the channel closed when memory is given back,
// and when the first body being read will have stalled, if one will.
func (m *bodyMemory) takeOrWait(b *heldBody, size, limit int64) (freed chan struct{}, stalls time.Time, err error) {
	var victims []*heldBody
	defer func() {
		for _, v := range victims {
			v.giveWay()
		}
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	b.waitsForRoom = false
	if b.gaveWay.Load() {
		return nil, stalls, errBodyGaveWay
	}
	n := size - b.bytes
	for m.held+n > limit {
		var v *heldBody
		if v, stalls = m.victimFor(b, n); v == nil {
			b.waitsForRoom = true
			if m.freed == nil {
				m.freed = make(chan struct{})
			}
			return m.freed, stalls, nil
		}
		m.giveLocked(v)
		v.gaveWay.Store(true)
		victims = append(victims, v)
	}
	m.held += n
	m.byClient[b.client] += n
	b.bytes = size
	m.startReading(b)
	return nil, stalls, nil
}

// victimFor is the body being read that gives way to b, which needs n
// more bytes, if any: first, whatever its client, the one that has sent
// nothing for the longest, if that is bodyStall or more (a client that sends
// at a normal pace never pauses that long); else one of the client address
// that holds the most, if that is more than b's would hold with n more,
// the one of them that sent last the longest ago. So a client can keep no
// memory from another by stalling its bodies, nor by holding more of them
// at once, however fast it then sends. Without a victim, stalls is when the
// first body being read will have stalled, if one will. A body waiting for
// room itself (its client is not the one stalling) and one that cannot be
// made to give way (no response writer) never give way.
func (m *bodyMemory) victimFor(b *heldBody, n int64) (victim *heldBody, stalls time.Time) {
	now := time.Now()
	var stalled, greedy *heldBody
	for v := m.reading; v != nil; v = v.nextReading {
		if v == b || v.w == nil {
			continue
		}
		last := v.progress()
		if !v.waitsForRoom {
			if now.Sub(last) >= bodyStall {
				if stalled == nil || last.Before(stalled.progress()) {
					stalled = v
				}
			} else if at := last.Add(bodyStall); stalls.IsZero() || at.Before(stalls) {
				stalls = at
			}
		}
		if m.byClient[v.client] > m.byClient[b.client]+n {
			if greedy == nil || m.byClient[v.client] > m.byClient[greedy.client] ||
				m.byClient[v.client] == m.byClient[greedy.client] && last.Before(greedy.progress()) {
				greedy = v
			}
		}
	}
	switch {
	case stalled != nil:
		return stalled, time.Time{}
	case greedy != nil:
		return greedy, time.Time{}
	}
	return nil, stalls
}

// give gives back the memory b holds, if any, and wakes the bodies waiting
// for room.
func (m *bodyMemory) give(b *heldBody) {
	m.mu.Lock()
	m.giveLocked(b)
	m.mu.Unlock()
}

func (m *bodyMemory) giveLocked(b *heldBody) {
	m.stopReading(b)
	if b.bytes == 0 {
		return
	}
	m.held -= b.bytes
	if m.byClient[b.client] -= b.bytes; m.byClient[b.client] == 0 {
		delete(m.byClient, b.client)
	}
	b.bytes = 0
	if m.freed != nil {
		close(m.freed)
		m.freed = nil
	}
}

// doneReading takes b out of the bodies that may give way, as it is read
// as far as the limiter reads it (its memory is given back as the next
// handler reads it), and reports whether it gave way before.
func (m *bodyMemory) doneReading(b *heldBody) (gaveWay bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopReading(b)
	return b.gaveWay.Load()
}

// bytesHeld is the memory held now, for the gauge.
func (m *bodyMemory) bytesHeld() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held
}

// clientOf is the address whose bodies share one client's memory: Caddy's
// client IP (the remote address, or the one a trusted proxy forwards), an
// IPv6 address by its /64, which one client commonly holds whole.
func clientOf(r *http.Request) string {
	ip, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	if !strings.Contains(ip, ":") {
		return ip // IPv4, or none: parsing it would cost an error's allocation
	}
	if a, err := netip.ParseAddr(ip); err == nil && a.Is6() && !a.Is4In6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return ip
}

// requestBody is a request's body as the limiter read it.
type requestBody struct {
	// bytes are the body, or its first maxReadBody+1 bytes when it is
	// longer (complete is then false); nil when it was not read.
	bytes    []byte
	complete bool
}

// whole is the body when it was read to its end, else nil.
func (b requestBody) whole() []byte {
	if !b.complete {
		return nil
	}
	return b.bytes
}

// readable reports whether the limiter reads the request's body: one that
// is not content-encoded (Content-Encoding identity is none), to an API the classifier knows whatever method
// and type it declares (a client must not escape its model's limits or its
// reservation by declaring others), or declared JSON. A body that does not
// parse as the API's JSON reserves the default and names no model.
func readable(req *request) bool {
	r := req.Request
	return hasBody(r) && usage.Unencoded(r.Header) &&
		(req.call.API != llmapi.Unknown || strings.EqualFold(usage.MediaType(r.Header.Get("Content-Type")), "application/json"))
}

func hasBody(r *http.Request) bool { return r.Body != nil && r.Body != http.NoBody }

// worthSparing reports whether a body is worth not reading when its request
// may be refused without it: one its client holds back until asked to send
// it (Expect: 100-continue), or one longer than the first buffer, or of a
// length not known. A shorter one has mostly come with its headers, and
// reading it costs less than asking the store twice (the in-process store
// decides the whole chain to answer).
func worthSparing(r *http.Request) bool {
	return r.ContentLength < 0 || r.ContentLength > firstBodyBuffer || r.Header.Get("Expect") != ""
}

// readRequestBody reads the body of a request the limiter reads (holdBody).
func readRequestBody(req *request, limit int64) (requestBody, error) {
	if !readable(req) {
		return requestBody{}, nil
	}
	return holdBody(req, limit)
}

// heldWhole reports whether the request's body has been read to its end,
// reading it now if it was not read yet, within limit, and by the time by
// unless it is zero. Go's server notices that a client went away, and
// cancels its request's context, only once the body has been read to its
// end (net/http's background read starts at its EOF): a request that waits
// must have it read, or it would wait out a departed client and be charged
// for it. A body longer than the limiter reads, and one whose client has
// not sent it all by then (the read deadline of the request's connection),
// are not held whole. The deadline is lifted once the body is read, for the
// background read; it stays on one that was not, whose request must then be
// refused: Go's server, which reads what is left of a body before it
// answers, then gives up on it at once and closes the connection. A body
// that found no room under limit, or gave way to another, is an error
// (holdBody): what was read of it is gone, and its request must not go on.
func heldWhole(req *request, limit int64, by time.Time) (bool, error) {
	switch b, read := req.Body.(*heldBody); {
	case !hasBody(req.Request):
		return true, nil
	case read:
		return b.rest == nil, nil
	}
	rc := http.NewResponseController(req.w)
	deadline := !by.IsZero() && rc.SetReadDeadline(by) == nil
	body, err := holdBody(req, limit)
	if err != nil || !body.complete {
		return false, err
	}
	if deadline {
		// Left on, it would end the server's background read, and with it
		// the request's context, in the middle of the wait.
		return rc.SetReadDeadline(time.Time{}) == nil, nil
	}
	return true, nil
}

// holdBody reads the request's body, within limit bytes of body memory for
// the process, and gives the request a body that replays it and then the
// rest unread. Its memory is given back once the next handler has read the
// bytes held, or has closed the body, or when the request ends (req.held).
// Its first byte is read before it holds any: a client that sends headers
// alone holds none, whatever length it claims. A read that fails passes on
// what was read and the rest as they were; only a body that found no room
// under limit, or gave way to another while it was read (its read ended
// by a deadline that stays on its connection), or whose client went away
// meanwhile, is an error, and then the request must not go on.
func holdBody(req *request, limit int64) (requestBody, error) {
	r := req.Request
	first := int64(firstBodyBuffer)
	if r.ContentLength >= 0 {
		first = min(first, r.ContentLength+1) // room to read the EOF without growing
	}
	held := &heldBody{rest: r.Body, closer: r.Body, w: req.w, client: clientOf(r)}
	n, err := held.rest.Read(held.first[:])
	buf := held.first[:n:n] // holds no memory of body_memory's until it grows
	held.progressed.Store(time.Now().UnixNano())
	for err == nil && len(buf) <= maxReadBody {
		if len(buf) == cap(buf) {
			if buf, err = held.grow(r.Context(), buf, max(first, min(2*int64(cap(buf)), maxReadBody+1)), limit); err != nil {
				break
			}
		}
		n, err = held.rest.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if n > 0 {
			held.progressed.Store(time.Now().UnixNano())
		}
	}
	if bodiesHeld.doneReading(held) {
		err = errBodyGaveWay
	}
	if err != nil && err != io.EOF && (errors.Is(err, errBodyMemory) || r.Context().Err() != nil) {
		held.release()
		return requestBody{}, err
	}
	complete := err == io.EOF
	held.replay = bytes.NewReader(buf)
	if complete {
		held.rest = nil
	}
	r.Body, req.held = held, held
	return requestBody{bytes: buf, complete: complete}, nil
}

// heldBody is a request body that replays what the limiter read, then what
// it left unread. It gives that memory back, and drops it, at the replay's
// end or when the body is closed.
type heldBody struct {
	mu     sync.Mutex // guards replay: Close may come from another goroutine
	replay *bytes.Reader
	rest   io.ReadCloser // the original body; nil once it was read to its end
	closer io.Closer
	first  [1]byte // the body's first byte, read before any memory is held

	// While it is read: the writer of its request's answer, whose read
	// deadline ends its read if it gives way to another body (nil: it
	// cannot), its client's address, when its last bytes came, and
	// whether it gave way.
	w          http.ResponseWriter
	client     string
	progressed atomic.Int64 // Unix nanoseconds
	gaveWay    atomic.Bool

	// Guarded by bodiesHeld.mu: the bytes it holds under body_memory,
	// whether it waits for room, and its neighbours among the bodies being
	// read, if it is one.
	bytes                    int64
	waitsForRoom             bool
	prevReading, nextReading *heldBody
}

// grow holds the memory of a buffer of size bytes in place of buf's, and
// returns it with buf's bytes.
func (b *heldBody) grow(ctx context.Context, buf []byte, size, limit int64) ([]byte, error) {
	if err := bodiesHeld.take(ctx, b, size, limit); err != nil {
		return buf, err
	}
	grown := make([]byte, len(buf), size)
	copy(grown, buf)
	return grown, nil
}

// progress is when the body's last bytes came.
func (b *heldBody) progress() time.Time { return time.Unix(0, b.progressed.Load()) }

// giveWay ends the read of a body that gave its memory to another: its
// read, blocked or next, fails at once. Caddy's writers, HTTP/1 and
// HTTP/2 alike (one stream's), all set read deadlines; behind one that
// could not, the body would stop at its next read's return, past which
// it takes no memory (take, doneReading).
func (b *heldBody) giveWay() {
	_ = http.NewResponseController(b.w).SetReadDeadline(time.Now())
}

func (b *heldBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.replay != nil {
		n, _ := b.replay.Read(p)
		if b.replay.Len() == 0 {
			b.releaseLocked()
		}
		b.mu.Unlock()
		if n > 0 || len(p) == 0 {
			return n, nil
		}
	} else {
		b.mu.Unlock()
	}
	if b.rest == nil {
		return 0, io.EOF
	}
	return b.rest.Read(p)
}

func (b *heldBody) Close() error {
	b.release()
	if b.closer == nil {
		return nil
	}
	return b.closer.Close()
}

// release gives the memory back and drops it; nil holds nothing.
func (b *heldBody) release() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.releaseLocked()
	b.mu.Unlock()
}

func (b *heldBody) releaseLocked() {
	b.replay = nil
	bodiesHeld.give(b)
}
