package ratelimit

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
	"github.com/rolter/caddy-ratelimit/internal/usage"
)

// A request's body is read to estimate the tokens it reserves, to find the
// model it asks for and to add the stream option. Reading it costs memory
// that a client chooses, so it is read only when the admission needs it,
// after whatever can be refused without it, and in memory the client cannot
// inflate: the buffer grows with the bytes that arrive, never with what
// Content-Length claims, and the bytes held by every body being read in this
// process are capped (body_memory). A body the cap has no room for waits
// briefly for some, then is answered 503: it is never admitted unreserved.

// maxReadBody caps the bytes of one request body that are read; the rest of
// a larger one passes on unread, and it reserves the estimate of what was
// read.
const maxReadBody = 4 << 20

// defaultBodyMemory is the default of body_memory: sixteen bodies of the
// largest size read, or thousands of typical ones.
const defaultBodyMemory = 64 << 20

// firstBodyBuffer is the most a body's buffer starts with, whatever its
// Content-Length says; it then doubles as bytes arrive.
const firstBodyBuffer = 16 << 10

// bodyMemoryWait is how long a body waits for room under body_memory before
// its request is answered 503.
const bodyMemoryWait = time.Second

// errBodyMemory is a body that found no room under body_memory in time.
var errBodyMemory = errors.New("request bodies being read hold all the memory allowed to them")

// bodyMemory is the bytes held by the bodies being read in this process,
// for every handler: each grows only while the total stays within its own
// handler's cap.
type bodyMemory struct {
	mu    sync.Mutex
	held  int64
	freed chan struct{} // closed when memory is given back, for waiters
}

var bodiesHeld bodyMemory

// take holds n more bytes once the total leaves room for them under limit,
// waiting at most bodyMemoryWait.
func (m *bodyMemory) take(ctx context.Context, n, limit int64) error {
	var timeout <-chan time.Time
	for {
		m.mu.Lock()
		if m.held+n <= limit {
			m.held += n
			m.mu.Unlock()
			return nil
		}
		if m.freed == nil {
			m.freed = make(chan struct{})
		}
		freed := m.freed
		m.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(bodyMemoryWait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-freed:
		case <-timeout:
			return errBodyMemory
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// give returns n bytes and wakes the bodies waiting for room.
func (m *bodyMemory) give(n int64) {
	m.mu.Lock()
	m.held -= n
	if m.freed != nil {
		close(m.freed)
		m.freed = nil
	}
	m.mu.Unlock()
}

// bytesHeld is the memory held now, for the gauge.
func (m *bodyMemory) bytesHeld() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held
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
// for it. A body longer than the limiter reads, one that finds no room
// under limit, and one whose client has not sent it all by then (the read
// deadline of w's connection), are not held whole. The deadline is lifted
// once the body is read, for the background read; it stays on one that was
// not, whose request must then be refused: Go's server, which reads what is
// left of a body before it answers, then gives up on it at once and closes
// the connection.
func heldWhole(w http.ResponseWriter, req *request, limit int64, by time.Time) bool {
	switch b, read := req.Body.(*heldBody); {
	case !hasBody(req.Request):
		return true
	case read:
		return b.rest == nil
	}
	rc := http.NewResponseController(w)
	deadline := !by.IsZero() && rc.SetReadDeadline(by) == nil
	body, err := holdBody(req, limit)
	whole := err == nil && body.complete
	if whole && deadline {
		// Left on, it would end the server's background read, and with it
		// the request's context, in the middle of the wait.
		whole = rc.SetReadDeadline(time.Time{}) == nil
	}
	return whole
}

// holdBody reads the request's body, within limit bytes of body memory for
// the process, and gives the request a body that replays it and then the
// rest unread. Its memory is given back once the next handler has read the
// bytes held, or has closed the body, or when the request ends (req.held).
// A read that fails passes on what was read and the rest as they were;
// only a body that found no room under limit (or whose client went away
// meanwhile) is an error, and then the request must not go on.
func holdBody(req *request, limit int64) (requestBody, error) {
	r := req.Request
	first := int64(firstBodyBuffer)
	if r.ContentLength >= 0 {
		first = min(first, r.ContentLength+1) // room to read the EOF without growing
	}
	held := &heldBody{rest: r.Body, closer: r.Body}
	buf, err := held.grow(r.Context(), nil, first, limit)
	for err == nil && len(buf) <= maxReadBody {
		if len(buf) == cap(buf) {
			if buf, err = held.grow(r.Context(), buf, min(2*int64(cap(buf)), maxReadBody+1), limit); err != nil {
				break
			}
		}
		var n int
		n, err = held.rest.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
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
	mu       sync.Mutex // guards replay: Close may come from another goroutine
	replay   *bytes.Reader
	rest     io.ReadCloser // the original body; nil once it was read to its end
	closer   io.Closer
	bytes    int64 // held under body_memory
	released bool
}

// grow holds the memory of a buffer of size bytes in place of buf's, and
// returns it with buf's bytes.
func (b *heldBody) grow(ctx context.Context, buf []byte, size, limit int64) ([]byte, error) {
	if err := bodiesHeld.take(ctx, size-int64(cap(buf)), limit); err != nil {
		return buf, err
	}
	b.bytes += size - int64(cap(buf))
	grown := make([]byte, len(buf), size)
	copy(grown, buf)
	return grown, nil
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
	if !b.released {
		b.released = true
		bodiesHeld.give(b.bytes)
	}
}
