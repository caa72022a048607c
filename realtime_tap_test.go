package ratelimit

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/tokenest"
	"github.com/rolter/caddy-ratelimit/internal/usage"
	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// tcpConnPair is a connected loopback TCP pair: server is the side a server
// would hijack.
func tcpConnPair(t *testing.T) (server, client *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { s.Close(); c.Close() })
	return s.(*net.TCPConn), c.(*net.TCPConn)
}

// tapSession is a stream of server frames with the tokens it reports.
func tapSession() ([]byte, usage.Usage) {
	done := []byte(usagetest.Done(13, 2000))
	return usagetest.Stream(
		usagetest.Text(usagetest.AudioDelta),
		usagetest.Text(usagetest.Done(30, 70000)),
		usagetest.Frame{Op: usagetest.OpText, Payload: done[:1000]}.Bytes(),
		[]byte{0x89, 0x00},
		usagetest.Frame{Op: usagetest.OpCont, Fin: true, Payload: done[1000:]}.Bytes(),
		usagetest.Frame{Op: usagetest.OpBinary, Fin: true, Payload: []byte{0, 1, 2}}.Bytes(),
	), doneUsage(30+13, 2)
}

// doneUsage is what n usagetest.Done events of total tokens in all report:
// each has 1 input token and 2 output tokens.
func doneUsage(total, n int64) usage.Usage {
	return usage.Usage{Total: total, Input: n, Output: 2 * n, UncachedInput: n}
}

// onlyReader hides a reader's WriterTo, as reverse_proxy's upstream body does
// not offer one: io.CopyBuffer then writes buffer by buffer.
type onlyReader struct{ io.Reader }

func TestWrapHijackedTCPDeliversBytesIdenticallyTapsThemAndHalfCloses(t *testing.T) {
	server, client := tcpConnPair(t)
	stream, want := tapSession()
	tap := usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{}))
	conn, _ := wrapHijacked(server, bufio.NewReadWriter(bufio.NewReader(server), bufio.NewWriter(server)), tap, nil)

	if _, ok := conn.(io.ReaderFrom); ok {
		t.Error("the wrapped conn has ReadFrom, which would let io.Copy bypass the tap")
	}
	received := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(client) // to EOF: the wrapped CloseWrite must reach the socket
		received <- b
	}()
	// reverse_proxy's copier: io.CopyBuffer(conn, backConn, buf), buffers
	// that cut frames anywhere.
	if _, err := io.CopyBuffer(conn, onlyReader{bytes.NewReader(stream)}, make([]byte, 777)); err != nil {
		t.Fatal(err)
	}
	cw, ok := conn.(interface{ CloseWrite() error })
	if !ok {
		t.Fatal("the wrapped *net.TCPConn has no CloseWrite: reverse_proxy would end the tunnel instead of half-closing")
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-received:
		if !bytes.Equal(got, stream) {
			t.Fatalf("the client received %d bytes that differ from the %d sent", len(got), len(stream))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client never saw EOF after CloseWrite")
	}
	usagetest.CheckTap(t, tap, want, 0)

	// Only the write half is closed: the client can still send.
	if _, err := client.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "bye" {
		t.Fatalf("read after CloseWrite: %q, %v", buf, err)
	}
	cr, ok := conn.(interface{ CloseRead() error })
	if !ok {
		t.Fatal("the wrapped *net.TCPConn has no CloseRead")
	}
	if err := cr.CloseRead(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Read(buf); n != 0 || err == nil {
		t.Fatalf("read after CloseRead = %d, %v; want 0 and an error", n, err)
	}
}

func TestWrapHijackedBufferedWriterIsTappedAndReaderKeepsClientBytes(t *testing.T) {
	server, client := tcpConnPair(t)
	if _, err := client.Write([]byte("early client bytes")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(server)
	if _, err := br.Peek(len("early client bytes")); err != nil {
		t.Fatal(err)
	}
	brw := bufio.NewReadWriter(br, bufio.NewWriter(server))
	tap := usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{}))
	conn, wbrw := wrapHijacked(server, brw, tap, nil)
	if wbrw.Reader != br || wbrw.Reader.Buffered() != len("early client bytes") {
		t.Fatal("the client bytes buffered before the hijack are not in the returned Reader")
	}
	stream, want := tapSession()
	received := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(client)
		received <- b
	}()
	if _, err := wbrw.Write(stream[:100]); err != nil {
		t.Fatal(err)
	}
	if err := wbrw.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(stream[100:5000]); err != nil { // both paths, in order
		t.Fatal(err)
	}
	if _, err := wbrw.Write(stream[5000:]); err != nil {
		t.Fatal(err)
	}
	if err := wbrw.Flush(); err != nil {
		t.Fatal(err)
	}
	conn.(interface{ CloseWrite() error }).CloseWrite()
	if got := <-received; !bytes.Equal(got, stream) {
		t.Fatalf("the client received %d bytes that differ from the %d sent", len(got), len(stream))
	}
	usagetest.CheckTap(t, tap, want, 0)
	if b, _ := wbrw.ReadString('s'); b != "early client bytes" {
		t.Fatalf("Reader gave %q", b)
	}
}

// Bytes a bufio.Writer still held at the hijack (net/http never leaves any)
// go out first and are not fed to the tap, which would read them as frames.
func TestWrapHijackedFlushesBytesBufferedBeforeTheHijackUntapped(t *testing.T) {
	server, client := tcpConnPair(t)
	brw := bufio.NewReadWriter(bufio.NewReader(server), bufio.NewWriter(server))
	header := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
	brw.WriteString(header)
	tap := usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{}))
	conn, wbrw := wrapHijacked(server, brw, tap, nil)
	stream, want := tapSession()
	received := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(client)
		received <- b
	}()
	wbrw.Write(stream)
	wbrw.Flush()
	conn.(interface{ CloseWrite() error }).CloseWrite()
	if got := <-received; string(got) != header+string(stream) {
		t.Fatalf("the client received %d bytes, want the header and the stream (%d)", len(got), len(header)+len(stream))
	}
	usagetest.CheckTap(t, tap, want, 0)
}

// closeWriteConn and closeReadConn stand for conns with one half-close.
type closeWriteConn struct {
	net.Conn
	closedWrite bool
}

func (c *closeWriteConn) CloseWrite() error { c.closedWrite = true; return nil }

type closeReadConn struct {
	net.Conn
	closedRead bool
}

func (c *closeReadConn) CloseRead() error { c.closedRead = true; return nil }

func TestWrapHijackedOffersOnlyTheHalfClosesTheConnHas(t *testing.T) {
	p, peer := net.Pipe()
	defer p.Close()
	defer peer.Close()
	tap := usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{}))
	type cw = interface{ CloseWrite() error }
	type cr = interface{ CloseRead() error }

	plain, _ := wrapHijacked(p, nil, tap, nil) // net.Pipe, or Caddy's access-log hijackedConn: neither
	if _, ok := plain.(cw); ok {
		t.Error("CloseWrite offered over a conn without it")
	}
	if _, ok := plain.(cr); ok {
		t.Error("CloseRead offered over a conn without it")
	}

	w := &closeWriteConn{Conn: p} // like *tls.Conn
	wc, _ := wrapHijacked(w, nil, tap, nil)
	if _, ok := wc.(cr); ok {
		t.Error("CloseRead offered over a conn without it")
	}
	if c, ok := wc.(cw); !ok {
		t.Error("CloseWrite not offered")
	} else if c.CloseWrite(); !w.closedWrite {
		t.Error("CloseWrite did not reach the conn")
	}

	r := &closeReadConn{Conn: p}
	rc, _ := wrapHijacked(r, nil, tap, nil)
	if _, ok := rc.(cw); ok {
		t.Error("CloseWrite offered over a conn without it")
	}
	if c, ok := rc.(cr); !ok {
		t.Error("CloseRead not offered")
	} else if c.CloseRead(); !r.closedRead {
		t.Error("CloseRead did not reach the conn")
	}

	// Over net.Pipe the bytes and the tap are the same as over TCP.
	stream, want := tapSession()
	received := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(peer)
		received <- b
	}()
	conn, brw := wrapHijacked(p, nil, tap, nil)
	brw.Write(stream[:10])
	brw.Flush()
	conn.Write(stream[10:])
	conn.Close()
	if got := <-received; !bytes.Equal(got, stream) {
		t.Fatal("bytes differ over net.Pipe")
	}
	usagetest.CheckTap(t, tap, want, 0)
	if conn.LocalAddr() != p.LocalAddr() || conn.RemoteAddr() != p.RemoteAddr() {
		t.Error("addresses are not the conn's")
	}
}

// shortConn accepts only part of one Write, with an error.
type shortConn struct {
	net.Conn
	out       bytes.Buffer
	shortOnce int // accept only this many bytes of the next Write
}

func (c *shortConn) Write(p []byte) (int, error) {
	if c.shortOnce > 0 {
		n := c.shortOnce
		c.shortOnce = 0
		c.out.Write(p[:n])
		return n, errors.New("timeout")
	}
	return c.out.Write(p)
}

func TestWrapHijackedTapsOnlyTheBytesWritten(t *testing.T) {
	stream := usagetest.Stream(usagetest.Text(usagetest.Done(5, 0)), usagetest.Text(usagetest.Done(6, 0)))
	sc := &shortConn{shortOnce: 17}
	tap := usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{}))
	conn, _ := wrapHijacked(sc, nil, tap, nil)
	n, err := conn.Write(stream)
	if n != 17 || err == nil {
		t.Fatalf("Write = %d, %v; want the conn's 17 and its error", n, err)
	}
	if _, err := conn.Write(stream[n:]); err != nil { // the caller retries the rest
		t.Fatal(err)
	}
	if !bytes.Equal(sc.out.Bytes(), stream) {
		t.Fatal("bytes differ")
	}
	usagetest.CheckTap(t, tap, doneUsage(11, 2), 0)
}

// Writers sharing the wrapped conn, each Write carrying whole frames: the
// tap reads the bytes in the order the client receives them.
func TestWrapHijackedConcurrentWritersAreTappedInWireOrder(t *testing.T) {
	server, client := tcpConnPair(t)
	tap := usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{}))
	conn, _ := wrapHijacked(server, nil, tap, nil)
	received := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(client)
		received <- b
	}()
	done := []byte(usagetest.Done(1, 300))
	var wg sync.WaitGroup
	wg.Go(func() { // the copier: a fragmented message per three Writes
		for range 400 {
			conn.Write(usagetest.Frame{Op: usagetest.OpText, Payload: done[:100]}.Bytes())
			conn.Write(usagetest.Frame{Op: usagetest.OpCont, Payload: done[100:200]}.Bytes())
			conn.Write(usagetest.Frame{Op: usagetest.OpCont, Fin: true, Payload: done[200:]}.Bytes())
		}
	})
	wg.Go(func() { // writeCloseControl and pings
		for range 400 {
			conn.Write([]byte{0x88, 0x02, 0x03, 0xe9})
		}
	})
	wg.Wait()
	conn.(interface{ CloseWrite() error }).CloseWrite()
	got := <-received
	usagetest.CheckTap(t, tap, doneUsage(400, 400), 0)
	// The client's bytes, parsed alone, say the same.
	parsed := usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{}))
	usagetest.Feed(parsed, got)
	usagetest.CheckTap(t, parsed, doneUsage(400, 400), 0)
}

// Through net/http's own Hijack, as reverse_proxy does it: the 101 goes out
// inside Hijack, before the wrap, so the tap reads frames from the first byte.
func TestWrapHijackedOverNetHTTPHijackTapsOnlyTheFramesAfterThe101(t *testing.T) {
	stream, want := tapSession()
	tap := usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{}))
	fromClient := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Upgrade", "websocket")
		w.Header().Set("Connection", "Upgrade")
		w.WriteHeader(http.StatusSwitchingProtocols)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn, brw = wrapHijacked(conn, brw, tap, nil)
		defer conn.Close()
		if err := brw.Flush(); err != nil {
			t.Error(err)
			return
		}
		b := make([]byte, len("client frame"))
		io.ReadFull(brw, b) // buffered by net/http, or still on the wire
		fromClient <- string(b)
		io.CopyBuffer(conn, onlyReader{bytes.NewReader(stream)}, make([]byte, 4096))
		conn.(interface{ CloseWrite() error }).CloseWrite()
	}))
	defer srv.Close()

	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\nclient frame"))
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d", res.StatusCode)
	}
	got, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, stream) {
		t.Fatalf("the client received %d bytes that differ from the %d sent", len(got), len(stream))
	}
	if s := <-fromClient; s != "client frame" {
		t.Fatalf("the server read %q from the client", s)
	}
	usagetest.CheckTap(t, tap, want, 0)
}

// stallConn records the bytes written in wire order and, at its stallAt-th
// Write, returns only when released: the writer is held between its write
// and its tap, as a preempted goroutine would be.
type stallConn struct {
	net.Conn
	mu       sync.Mutex
	wire     bytes.Buffer
	calls    int
	stallAt  int
	stalled  chan struct{}
	released chan struct{}
}

func (c *stallConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.wire.Write(p)
	c.calls++
	stall := c.calls == c.stallAt
	c.mu.Unlock()
	if stall {
		close(c.stalled)
		<-c.released
	}
	return len(p), nil
}

// The copier's Writes cut frames anywhere. When its Write ends at a frame
// boundary and the graceful close's frame goes out right after, the client's
// stream is valid; the tap must then not read the close frame before the
// copier's bytes that preceded it on the wire.
func TestWrapHijackedTapsEachWriteBeforeAnotherWriterCanWrite(t *testing.T) {
	done := usagetest.Text(usagetest.Done(9, 0))
	sc := &stallConn{stallAt: 2, stalled: make(chan struct{}), released: make(chan struct{})}
	tap := usage.NewRealtimeTap(usage.MaxEvent, usageCeiling(tokenest.Estimate{}))
	conn, _ := wrapHijacked(sc, nil, tap, nil)
	copier := make(chan struct{})
	go func() {
		defer close(copier)
		conn.Write(done[:20]) // half a frame
		conn.Write(done[20:]) // its end: stalls after the write, before the tap
	}()
	<-sc.stalled
	closer := make(chan struct{})
	go func() {
		defer close(closer)
		conn.Write([]byte{0x88, 0x02, 0x03, 0xe9})
	}()
	select {
	case <-closer: // not serialized: the close frame was tapped first
	case <-time.After(50 * time.Millisecond):
	}
	close(sc.released)
	<-copier
	<-closer
	if !bytes.Equal(sc.wire.Bytes(), usagetest.Stream(done, []byte{0x88, 0x02, 0x03, 0xe9})) {
		t.Fatalf("wire order: % x", sc.wire.Bytes())
	}
	usagetest.CheckTap(t, tap, doneUsage(9, 1), 0)
}
