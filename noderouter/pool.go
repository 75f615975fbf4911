package noderouter

import (
	"bufio"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// upstreamPool keeps the h1 forwarder's idle keep-alive connections to
// instances, last in first out per instance address: the connection used
// last is warm in every cache and the oldest ones age out when a function
// needs fewer. It starts no goroutine; the router's sweep closes
// connections idle longer than idleTimeout.
type upstreamPool struct {
	dialer      *net.Dialer
	maxIdle     int // per address
	idleTimeout time.Duration

	mu     sync.Mutex
	idle   map[string][]*upConn
	closed bool
	// closedFlag is closed, read without mu (by the event loops).
	closedFlag atomic.Bool
}

// upConn is one connection to an instance with its buffers.
type upConn struct {
	net.Conn
	d     *sock // Conn, when it is TCP (raw socket calls; a request's last write goes with the wait for its answer)
	addr  string
	br    *bufio.Reader
	bw    *bufio.Writer
	since time.Time // idle since (in the pool)
	// reused: it served an exchange before; a failure before any response
	// byte may be the instance closing it while idle.
	reused bool
	// deadline is the one set on Conn (setDeadline).
	deadline time.Time
}

// setDeadline sets the read and write deadline, unless it is on already
// (each set is a timer change of the runtime's).
func (c *upConn) setDeadline(t time.Time) {
	if t.Equal(c.deadline) {
		return
	}
	_ = c.Conn.SetDeadline(t)
	c.deadline = t
}

const upstreamBufSize = 16 << 10

func newUpstreamPool(d *net.Dialer, maxIdle int, idleTimeout time.Duration) *upstreamPool {
	return &upstreamPool{dialer: d, maxIdle: maxIdle, idleTimeout: idleTimeout, idle: make(map[string][]*upConn)}
}

// get returns the most recently used idle connection to addr, nil when
// there is none. Expired ones found on the way are closed.
func (p *upstreamPool) get(addr string, now time.Time) *upConn {
	p.mu.Lock()
	l := p.idle[addr]
	for len(l) > 0 {
		c := l[len(l)-1]
		l[len(l)-1] = nil
		l = l[:len(l)-1]
		if now.Sub(c.since) < p.idleTimeout {
			p.idle[addr] = l
			p.mu.Unlock()
			c.reused = true
			return c
		}
		_ = c.Close()
	}
	if l != nil {
		delete(p.idle, addr)
	}
	p.mu.Unlock()
	return nil
}

// dial opens a new connection to addr.
func (p *upstreamPool) dial(ctx context.Context, addr string) (*upConn, error) {
	nc, err := p.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err // a *net.OpError with Op "dial": classify and isDialError rely on it
	}
	return newUpConn(nc, addr, nil), nil
}

// newUpConn makes an upConn of nc, a connection to addr; prefix holds
// bytes read from it already (an event loop's, handed over), read first.
func newUpConn(nc net.Conn, addr string, prefix []byte) *upConn {
	nc, d := newSock(nc, true)
	var r io.Reader = nc
	if len(prefix) > 0 {
		r = &prefixReader{p: prefix, r: nc}
	}
	return &upConn{Conn: nc, d: d, addr: addr, br: bufio.NewReaderSize(r, upstreamBufSize), bw: bufio.NewWriterSize(nc, upstreamBufSize)}
}

// prefixReader reads p, then r.
type prefixReader struct {
	p []byte
	r io.Reader
}

func (r *prefixReader) Read(b []byte) (int, error) {
	if len(r.p) > 0 {
		n := copy(b, r.p)
		r.p = r.p[n:]
		return n, nil
	}
	return r.r.Read(b)
}

// put returns c after a complete exchange that left it reusable; the pool
// closes it when it is full or closed.
func (p *upstreamPool) put(c *upConn, now time.Time) {
	if c.br.Buffered() > 0 {
		// Bytes after the response: the instance broke framing.
		_ = c.Close()
		return
	}
	c.since = now
	p.mu.Lock()
	if p.closed || len(p.idle[c.addr]) >= p.maxIdle {
		p.mu.Unlock()
		_ = c.Close()
		return
	}
	p.idle[c.addr] = append(p.idle[c.addr], c)
	p.mu.Unlock()
}

// sweep closes connections idle since before now-idleTimeout (the oldest
// sit at the front of each list).
func (p *upstreamPool) sweep(now time.Time) {
	var stale []*upConn
	p.mu.Lock()
	for addr, l := range p.idle {
		n := 0
		for n < len(l) && now.Sub(l[n].since) >= p.idleTimeout {
			n++
		}
		if n == 0 {
			continue
		}
		stale = append(stale, l[:n]...)
		if n == len(l) {
			delete(p.idle, addr)
		} else {
			p.idle[addr] = append(l[:0], l[n:]...)
		}
	}
	p.mu.Unlock()
	for _, c := range stale {
		_ = c.Close()
	}
}

// idleCount is the number of idle connections to addr.
func (p *upstreamPool) idleCount(addr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle[addr])
}

// isClosed reports that close was called (the event loops then close
// their own idle connections too).
func (p *upstreamPool) isClosed() bool { return p.closedFlag.Load() }

// close closes every idle connection; connections put later are closed.
func (p *upstreamPool) close() {
	p.mu.Lock()
	p.closed = true
	p.closedFlag.Store(true)
	idle := p.idle
	p.idle = make(map[string][]*upConn)
	p.mu.Unlock()
	for _, l := range idle {
		for _, c := range l {
			_ = c.Close()
		}
	}
}

// abort closes c from another goroutine than the one using it (the watch
// of a caller gone): nothing pending is written.
func (c *upConn) abort() {
	if c.d != nil {
		_ = c.d.abort()
		return
	}
	_ = c.Conn.Close()
}
