package ratelimit

import (
	"bufio"
	"io"
	"net"
	"sync"

	"github.com/rolter/caddy-ratelimit/internal/usage"
)

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
//
// How reverse_proxy (reverseproxy/streaming.go) drives the client
// connection, which is what the wrapper has to fit:
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
//
// With a gate (a session under a budget), the read side goes through it
// too: what the client sent, the bytes brw.Reader holds first, is read as
// clientEvents, and an event the gate refuses is answered to the client
// with the gate's error event, written between two of the upstream's
// messages (see inject). The returned ReadWriter's Reader then holds
// nothing: reverse_proxy writes what it holds to the upstream itself,
// past the gate.
func wrapHijacked(conn net.Conn, brw *bufio.ReadWriter, tap *usage.RealtimeTap, gate *sessionGate) (net.Conn, *bufio.ReadWriter) {
	if conn == nil || tap == nil {
		return conn, brw
	}
	tc := &tappedConn{Conn: conn, tap: tap}
	if gate != nil {
		var src io.Reader = conn
		if brw != nil && brw.Reader != nil {
			src = brw.Reader
		}
		tc.events = newClientEvents(src, func(msg []byte, whole bool) bool {
			// The client may answer bytes of a Write not yet tapped: a
			// response.done it has read is counted before the gate judges.
			tc.mu.Lock()
			tc.mu.Unlock() //nolint:staticcheck // an empty critical section: waiting for a Write in progress is the point
			refusal := gate.judge(msg, whole)
			if refusal != nil {
				tc.inject(refusal)
			}
			return refusal == nil
		})
	}
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
		var r io.Reader = conn
		if tc.events != nil {
			r = wrapped
		}
		return wrapped, bufio.NewReadWriter(bufio.NewReader(r), bufio.NewWriter(wrapped))
	}
	r, w := brw.Reader, brw.Writer
	switch {
	case tc.events != nil:
		r = bufio.NewReaderSize(wrapped, 16) // never read: reverse_proxy reads the conn
	case r == nil:
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
	tap *usage.RealtimeTap
	// mu makes each Write and its tap one step, so that the tap sees the
	// bytes of concurrent writers (reverse_proxy's copier and its graceful
	// close) in the order they went out. It adds no waiting: the conns a
	// server hijacks (net.TCPConn, tls.Conn) already serialize Writes.
	mu sync.Mutex
	// pending are the gate's messages to the client not yet written: they
	// wait for the upstream's stream to be between two messages.
	pending [][]byte
	events  *clientEvents // the client's frames, through the gate; nil: none
}

// maxPending bounds the gate's messages that wait for the upstream's
// stream to end a message; more are dropped.
const maxPending = 16

func (c *tappedConn) Read(p []byte) (int, error) {
	if c.events == nil {
		return c.Conn.Read(p)
	}
	return c.events.Read(p)
}

func (c *tappedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.tap.Write(p[:min(n, len(p))])
	}
	if err == nil {
		c.writePending()
	}
	return n, err
}

// inject writes the message msg, a whole frame, to the client as soon as
// the upstream's stream is between two messages (at once if it is): never
// inside one of the upstream's frames nor between the fragments of one of
// its messages, which would corrupt the stream, and never after its close
// frame.
func (c *tappedConn) inject(msg []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) < maxPending {
		c.pending = append(c.pending, msg)
	}
	c.writePending()
}

func (c *tappedConn) writePending() {
	for len(c.pending) > 0 && c.tap.Between() {
		msg := c.pending[0]
		c.pending = c.pending[1:]
		if _, err := c.Conn.Write(msg); err != nil {
			c.pending = nil
			return
		}
		c.tap.Write(msg) // the tap reads the stream the client reads
	}
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
