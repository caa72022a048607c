package redistest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ResetProxy is a TCP proxy on a loopback port in front of a Redis. After
// ResetAtNextCommand, each connection that was open then dies when its client
// next sends anything: the bytes are not forwarded, the client side is closed
// with an RST and the upstream side is closed. go-redis checks idle pooled
// connections before handing them out and quietly drops those the server has
// closed, so a plain close is invisible to it; this proxy instead makes a
// connection fail in the middle of a command, after it was handed out.
type ResetProxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[*proxyConn]struct{}
	closed bool

	closeOnce sync.Once
}

type proxyConn struct {
	client, upstream *net.TCPConn
	armed            atomic.Bool
	once             sync.Once
}

// NewResetProxy starts a proxy to target (host:port) on a free loopback port.
// It is closed, with all its connections, in t.Cleanup.
func NewResetProxy(t testing.TB, target string) *ResetProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("reset proxy: listen: %v", err)
	}
	p := &ResetProxy{target: target, ln: ln, conns: make(map[*proxyConn]struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port; point the client here.
func (p *ResetProxy) Addr() string { return p.ln.Addr().String() }

// ResetAtNextCommand arms every connection open now: the next bytes its client
// sends are dropped and the connection is reset. Connections accepted later
// work normally (as does one accepted but not yet connected upstream now).
func (p *ResetProxy) ResetAtNextCommand() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pc := range p.conns {
		pc.armed.Store(true)
	}
}

// Connections is the number of client connections open through the proxy.
func (p *ResetProxy) Connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines. It is safe to call more than once.
func (p *ResetProxy) Close() {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		open := make([]*proxyConn, 0, len(p.conns))
		for pc := range p.conns {
			open = append(open, pc)
		}
		p.mu.Unlock()
		_ = p.ln.Close()
		for _, pc := range open {
			p.closeConn(pc, false)
		}
		p.wg.Wait()
	})
}

func (p *ResetProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // listener closed
		}
		p.wg.Add(1)
		go p.serve(c.(*net.TCPConn))
	}
}

func (p *ResetProxy) serve(client *net.TCPConn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	pc := &proxyConn{client: client, upstream: up.(*net.TCPConn)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = client.Close()
		_ = up.Close()
		return
	}
	p.conns[pc] = struct{}{}
	p.mu.Unlock()

	// upstream -> client
	p.wg.Go(func() {
		_, _ = io.Copy(pc.client, pc.upstream)
		p.closeConn(pc, false)
	})

	// client -> upstream, checking the trigger before forwarding anything.
	buf := make([]byte, 32<<10)
	for {
		n, err := pc.client.Read(buf)
		if n > 0 {
			if pc.armed.Load() {
				p.closeConn(pc, true)
				return
			}
			if _, werr := pc.upstream.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	p.closeConn(pc, false)
}

// closeConn closes both sides of pc once; with reset, the client side is
// closed with an RST rather than a FIN.
func (p *ResetProxy) closeConn(pc *proxyConn, reset bool) {
	pc.once.Do(func() {
		if reset {
			_ = pc.client.SetLinger(0)
		}
		_ = pc.client.Close()
		_ = pc.upstream.Close()
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	})
}
