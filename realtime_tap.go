package ratelimit

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"net"
	"sync"
	"sync/atomic"
)

// The realtime tap reads the WebSocket frames (RFC 6455) that the upstream of
// a realtime session sends the client, from a copy of the bytes taken after
// they were written to the client, and adds up the usage of every finished
// response. The OpenAI Realtime API reports it in the server event
//
//	{"type":"response.done","response":{...,"usage":{"total_tokens":N,...}}}
//
// a JSON text message. Nothing is ever held back from the client or changed.
//
// How reverse_proxy (caddy v2.11.9, reverseproxy/streaming.go) drives the
// client connection, which is what wrapHijacked has to fit:
//
//   - It writes the 101 with rw.WriteHeader, then calls
//     http.NewResponseController(rw).Hijack(). net/http flushes the response
//     header to the socket inside Hijack and hands back an empty
//     bufio.Writer, so the upgrade response never reaches the tap: the tap
//     sees the WebSocket stream from its first byte.
//   - It calls brw.Flush() once (a no-op then), writes the bytes buffered in
//     brw.Reader to the upstream, and from then on uses only the conn: the
//     upstream-to-client copier is io.CopyBuffer(conn, backConn, buf), whose
//     Writes carry whatever one Read of the upstream returned, not whole
//     frames.
//   - At the upstream's EOF it calls conn.CloseWrite() if conn has that
//     method, and ends the tunnel otherwise.
//   - The conn is registered for config unloads: closeConnections (at once,
//     or after stream_close_delay) writes a 4-byte close frame (1001 Going
//     Away) to it with one Write, from another goroutine, while the copier may
//     still be writing, and then closes it. Caddy does not wait for a frame
//     boundary (its TODO says so); a close frame that lands inside a data
//     frame corrupts the stream for the client as much as for the tap. To see
//     the bytes in the order the client receives them, the wrapped conn holds
//     one lock over each underlying Write and the tap's copy of it.
//   - Caddy's own responseRecorder (used when the request is access-logged)
//     wraps the hijacked conn in a type that embeds net.Conn and so has no
//     CloseWrite; the wrapper forwards only what the conn it is given has.

// realtimeTap parses the WebSocket frames a server sends a client (unmasked,
// RFC 6455) from a copy of the bytes, and adds each finished response's
// response.usage.total_tokens (from "response.done" events, JSON text
// messages of the OpenAI Realtime API) to a running total.
//
// Memory is bounded: a text message is gathered up to maxMessage bytes (a
// larger one is skipped unread and counted as unmetered), and the message
// buffer is reused across messages and dropped after one larger than
// realtimeRetainedBuffer.
type realtimeTap struct {
	tokens atomic.Int64 // counted since the last take
	skips  atomic.Int64 // unmetered messages

	mu         sync.Mutex // serializes Write
	maxMessage int
	dead       bool // corrupt framing (or an internal fault): the rest is ignored
	fault      bool // Write recovered from a panic (a bug; the fuzz test checks for it)

	// The frame being read.
	hdr       [14]byte // 2 + 8 (length) + 4 (mask key) at most
	hdrLen    int
	inPayload bool   // the header is read, remaining payload bytes follow
	remaining uint64 // payload bytes of the frame not yet read
	fin       bool
	data      bool // a data frame (text, binary, continuation), not a control frame
	gather    bool // its payload goes into buf
	masked    bool
	maskKey   [4]byte
	maskPos   int // payload offset in the frame, modulo 4

	// The data message being read.
	inMessage bool
	skip      bool // binary, compressed or over maxMessage: not gathered
	buf       []byte
}

// realtimeRetainedBuffer is the largest message buffer kept for the next
// message; a larger one (up to maxMessage) is released once its message ends.
const realtimeRetainedBuffer = 64 << 10

var responseDoneType = []byte(`"response.done"`)

// realtimeUsageEvent is what is decoded of a message that may be a
// response.done event.
type realtimeUsageEvent struct {
	Type     string `json:"type"`
	Response struct {
		Usage struct {
			TotalTokens json.RawMessage `json:"total_tokens"`
		} `json:"usage"`
	} `json:"response"`
}

func newRealtimeTap(maxMessage int) *realtimeTap {
	return &realtimeTap{maxMessage: max(maxMessage, 0)}
}

// Write takes the next bytes the server sent, in order. Safe for concurrent
// use (calls are serialized inside): each call must then carry whole frames,
// or the interleaving of two writers' partial frames cannot be parsed. Never
// fails, never panics, never retains p.
func (t *realtimeTap) Write(p []byte) (int, error) {
	n := len(p)
	t.mu.Lock()
	defer t.mu.Unlock()
	defer func() {
		// Write runs on reverse_proxy's copier goroutine, where a panic would
		// take the whole process down: a bug here costs only the metering.
		if recover() != nil {
			t.fault = true
			t.fail()
		}
	}()
	for len(p) > 0 && !t.dead {
		if !t.inPayload {
			p = t.readHeader(p)
			continue
		}
		c := len(p)
		if uint64(c) > t.remaining {
			c = int(t.remaining)
		}
		if t.gather {
			start := len(t.buf)
			t.buf = append(t.buf, p[:c]...) // capacity reserved by beginFrame
			if t.masked {
				b := t.buf[start:]
				for i := range b {
					b[i] ^= t.maskKey[(t.maskPos+i)&3]
				}
			}
		}
		t.maskPos = (t.maskPos + c) & 3
		t.remaining -= uint64(c)
		p = p[c:]
		if t.remaining == 0 {
			t.endFrame()
		}
	}
	return n, nil
}

// take returns the tokens counted since the last take, and resets that count.
func (t *realtimeTap) take() int64 { return t.tokens.Swap(0) }

// unmetered is the number of messages that could not be read for usage: text
// messages over maxMessage, compressed (RSV1) messages, and, once, the rest
// of a stream whose framing is corrupt.
func (t *realtimeTap) unmetered() int64 { return t.skips.Load() }

// fail stops parsing for the rest of the connection.
func (t *realtimeTap) fail() {
	if !t.dead {
		t.dead = true
		t.skips.Add(1)
	}
	t.buf = nil
}

// readHeader consumes frame header bytes from p and returns the rest.
func (t *realtimeTap) readHeader(p []byte) []byte {
	for t.hdrLen < 2 && len(p) > 0 {
		t.hdr[t.hdrLen] = p[0]
		t.hdrLen++
		p = p[1:]
	}
	if t.hdrLen < 2 {
		return p
	}
	need := 2
	switch t.hdr[1] & 0x7f {
	case 126:
		need += 2
	case 127:
		need += 8
	}
	if t.hdr[1]&0x80 != 0 {
		need += 4
	}
	c := copy(t.hdr[t.hdrLen:need], p)
	t.hdrLen += c
	p = p[c:]
	if t.hdrLen == need {
		t.beginFrame(need)
	}
	return p
}

// beginFrame interprets the complete header of n bytes in t.hdr.
func (t *realtimeTap) beginFrame(n int) {
	t.hdrLen = 0
	b0, b1 := t.hdr[0], t.hdr[1]
	fin, rsv1, op := b0&0x80 != 0, b0&0x40 != 0, b0&0x0f
	length := uint64(b1 & 0x7f)
	switch length {
	case 126:
		length = uint64(binary.BigEndian.Uint16(t.hdr[2:4]))
	case 127:
		length = binary.BigEndian.Uint64(t.hdr[2:10])
	}
	// What RFC 6455 (and RFC 7692 for RSV1) tells a client to fail the
	// connection for: past it, nothing can be trusted to be a frame.
	switch {
	case length>>63 != 0, // "the most significant bit MUST be 0"
		b0&0x30 != 0,                // RSV2, RSV3: no extension defines them
		op >= 3 && op <= 7, op > 10, // reserved opcodes
		op >= 8 && (!fin || length > 125 || rsv1), // control frames
		op == 0 && (!t.inMessage || rsv1),         // continuation of nothing; RSV1 is for first frames
		(op == 1 || op == 2) && t.inMessage:       // a new message inside one
		t.fail()
		return
	}
	t.fin, t.data, t.gather = fin, op < 8, false
	t.masked = b1&0x80 != 0
	if t.masked {
		copy(t.maskKey[:], t.hdr[n-4:n])
	}
	t.maskPos = 0
	if op == 1 || op == 2 {
		t.inMessage = true
		t.skip = op == 2 // binary messages carry no usage
		if op == 1 && rsv1 {
			t.skip = true // permessage-deflate: not readable here
			t.skips.Add(1)
		}
	}
	if t.data && !t.skip {
		if uint64(len(t.buf))+length > uint64(t.maxMessage) {
			t.skip = true
			t.skips.Add(1)
			t.buf = t.buf[:0]
		} else {
			t.reserve(int(length))
			t.gather = true
		}
	}
	t.inPayload, t.remaining = true, length
	if length == 0 {
		t.endFrame()
	}
}

// reserve makes room in buf for n more bytes; len(buf)+n <= maxMessage.
func (t *realtimeTap) reserve(n int) {
	need := len(t.buf) + n
	if need <= cap(t.buf) {
		return
	}
	newCap := min(max(need, 2*cap(t.buf), 512), t.maxMessage)
	b := make([]byte, len(t.buf), newCap)
	copy(b, t.buf)
	t.buf = b
}

func (t *realtimeTap) endFrame() {
	t.inPayload = false
	if !t.data || !t.fin {
		return
	}
	if !t.skip {
		t.meter(t.buf)
	}
	t.inMessage, t.skip = false, false
	if cap(t.buf) > realtimeRetainedBuffer {
		t.buf = nil
	} else {
		t.buf = t.buf[:0]
	}
}

// meter adds the usage of msg, a complete text message, if it is a
// response.done event. Any other message costs a search and no allocation.
func (t *realtimeTap) meter(msg []byte) {
	if !bytes.Contains(msg, responseDoneType) {
		return
	}
	var ev realtimeUsageEvent
	if json.Unmarshal(msg, &ev) != nil || ev.Type != "response.done" {
		return
	}
	if n, ok := parseUsageCount(ev.Response.Usage.TotalTokens); ok {
		t.tokens.Add(n)
	}
}

// wrapHijacked wraps the client connection that reverse_proxy hijacked, so
// that every byte written to the client (through the conn or through the
// returned ReadWriter's Writer) is also fed to tap, byte-identical and with no
// added delay (tap after the write succeeds, only the bytes written). The
// returned conn forwards CloseWrite (and CloseRead) to the underlying conn
// when it has them, and otherwise behaves exactly like conn. The returned
// ReadWriter keeps brw.Reader (buffered client bytes) and has a Writer that
// writes through the wrapped conn.
//
// The returned conn has no ReadFrom: *net.TCPConn's would splice or sendfile
// past the tap (io.Copy falls back to Write). Nor does it pass on WriteTo, an
// optimization of the read side only.
func wrapHijacked(conn net.Conn, brw *bufio.ReadWriter, tap *realtimeTap) (net.Conn, *bufio.ReadWriter) {
	if conn == nil || tap == nil {
		return conn, brw
	}
	tc := &tappedConn{Conn: conn, tap: tap}
	var wrapped net.Conn = tc
	_, cw := conn.(interface{ CloseWrite() error })
	_, cr := conn.(interface{ CloseRead() error })
	switch {
	case cw && cr:
		wrapped = &tappedConnCloseReadWrite{tc}
	case cw:
		wrapped = &tappedConnCloseWrite{tc}
	case cr:
		wrapped = &tappedConnCloseRead{tc}
	}

	if brw == nil {
		return wrapped, bufio.NewReadWriter(bufio.NewReader(conn), bufio.NewWriter(wrapped))
	}
	r, w := brw.Reader, brw.Writer
	if r == nil {
		r = bufio.NewReader(conn) // the read side is not tapped
	}
	switch {
	case w == nil:
		w = bufio.NewWriter(wrapped)
	case w.Buffered() == 0: // always so from net/http: reuse its buffer
		w.Reset(wrapped)
	default:
		// Bytes written before the hijack (the upgrade response, not
		// WebSocket frames) go out first, untapped.
		_ = w.Flush()
		w = bufio.NewWriterSize(wrapped, w.Size())
	}
	if r == brw.Reader && w == brw.Writer {
		return wrapped, brw
	}
	return wrapped, bufio.NewReadWriter(r, w)
}

// tappedConn is a net.Conn whose written bytes are also fed to a tap.
type tappedConn struct {
	net.Conn
	tap *realtimeTap
	// mu makes each Write and its tap one step, so that the tap sees the
	// bytes of concurrent writers (reverse_proxy's copier and its graceful
	// close) in the order they went out. It adds no waiting: the conns a
	// server hijacks (net.TCPConn, tls.Conn) already serialize Writes.
	mu sync.Mutex
}

func (c *tappedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.tap.Write(p[:min(n, len(p))])
	}
	return n, err
}

type tappedConnCloseWrite struct{ *tappedConn }

func (c *tappedConnCloseWrite) CloseWrite() error {
	return c.Conn.(interface{ CloseWrite() error }).CloseWrite()
}

type tappedConnCloseRead struct{ *tappedConn }

func (c *tappedConnCloseRead) CloseRead() error {
	return c.Conn.(interface{ CloseRead() error }).CloseRead()
}

type tappedConnCloseReadWrite struct{ *tappedConn }

func (c *tappedConnCloseReadWrite) CloseWrite() error {
	return c.Conn.(interface{ CloseWrite() error }).CloseWrite()
}

func (c *tappedConnCloseReadWrite) CloseRead() error {
	return c.Conn.(interface{ CloseRead() error }).CloseRead()
}
