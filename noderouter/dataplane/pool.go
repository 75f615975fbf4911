package dataplane

import (
	"bufio"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// upstreamPool is the instance pool's shared shard (idleShard): the idle
// keep-alive connections of the h1 path, which pre-connections fill. Each
// event loop keeps a shard of its own, of the same kind, without a lock.
// It starts no goroutine: the router's Run sweeps it (sweep), and get
// closes the expired connections it meets.
type upstreamPool struct {
	dialer      *net.Dialer
	maxIdle     int // per address
	idleTimeout time.Duration

	mu     sync.Mutex
	idle   idleShard[*upConn]
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

func (c *upConn) idleSince() time.Time { return c.since }

func closeUpConn(c *upConn) { _ = c.Close() }

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
	return &upstreamPool{dialer: d, maxIdle: maxIdle, idleTimeout: idleTimeout}
}

// get returns the most recently used idle connection to addr, nil when
// there is none. Expired ones found on the way are closed.
func (p *upstreamPool) get(addr string, now time.Time) *upConn {
	p.mu.Lock()
	c, ok := p.idle.take(addr, now, p.idleTimeout, closeUpConn)
	p.mu.Unlock()
	if !ok {
		return nil
	}
	c.reused = true
	return c
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
	kept := !p.closed && p.idle.put(c.addr, c, p.maxIdle)
	p.mu.Unlock()
	if !kept {
		_ = c.Close()
	}
}

// sweep closes connections idle since before now-idleTimeout; Run calls
// it every half idle timeout.
func (p *upstreamPool) sweep(now time.Time) {
	var stale []*upConn
	p.mu.Lock()
	p.idle.sweep(now, p.idleTimeout, false, func(c *upConn) { stale = append(stale, c) })
	p.mu.Unlock()
	for _, c := range stale {
		_ = c.Close()
	}
}

// idleCount is the number of idle connections to addr.
func (p *upstreamPool) idleCount(addr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.idle.count(addr)
}

// isClosed reports that close was called (the event loops then close
// their own idle connections too).
func (p *upstreamPool) isClosed() bool { return p.closedFlag.Load() }

// close closes every idle connection; connections put later are closed.
func (p *upstreamPool) close() {
	var all []*upConn
	p.mu.Lock()
	p.closed = true
	p.closedFlag.Store(true)
	p.idle.sweep(time.Time{}, 0, true, func(c *upConn) { all = append(all, c) })
	p.mu.Unlock()
	for _, c := range all {
		_ = c.Close()
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
