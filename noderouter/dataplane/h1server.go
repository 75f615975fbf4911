package dataplane

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"skipper.dev/skipper/noderouter/h1"
)

// Forwarders of HTTP/1.1 requests (--forwarder).
const (
	// ForwarderLoop: event loops (loop.go) serve the warm exchange and
	// hand everything else to ForwarderH1's path.
	ForwarderLoop = "loop"
	// ForwarderH1: the router's own path (h1conn.go, h1forward.go): the
	// goroutine that reads a request forwards it on a pooled connection
	// and copies the answer back, with no hand-off.
	ForwarderH1 = "h1"
	// ForwarderNethttp: net/http's server and httputil.ReverseProxy.
	ForwarderNethttp = "nethttp"
)

// Server timeouts of the data plane, as net/http's server had them.
const (
	headerTimeout = 10 * time.Second // a request head's read, from its first byte
	idleTimeout   = 2 * time.Minute  // between requests on a caller's connection
)

// h1Server serves the data plane's caller connections with the h1
// forwarder: one goroutine per connection reads each request and forwards
// it itself. A connection that starts with the HTTP/2 preface (h2c, prior
// knowledge) is handed, unread, to the net/http server h2 through
// handoff, which that server serves from.
type h1Server struct {
	p       *Proxy
	log     *slog.Logger
	handoff *connListener

	shutdown atomic.Bool
	mu       sync.Mutex
	lns      map[net.Listener]struct{}
	conns    map[*h1conn]struct{}
	wg       sync.WaitGroup // connections and event loops

	// loops take the TCP listeners' connections when there are any
	// (--forwarder=loop, loop.go); closed ends Serve for them.
	loops     []*evloop
	closed    chan struct{}
	closeOnce sync.Once
	closedAll bool // Close ran (under mu): connections handed over later are closed
}

func newH1Server(p *Proxy, log *slog.Logger, handoff *connListener) *h1Server {
	return &h1Server{p: p, log: log, handoff: handoff, lns: make(map[net.Listener]struct{}), conns: make(map[*h1conn]struct{}),
		closed: make(chan struct{})}
}

// startLoops starts n event loops, which then take the connections of the
// TCP listeners Serve is given.
func (s *h1Server) startLoops(n int) error {
	for range n {
		l, err := newEvloop(s, n > 1, runtime.GOMAXPROCS(0) > n)
		if err != nil {
			for _, l := range s.loops {
				l.post(l.stop)
			}
			return fmt.Errorf("event loop: %w", err)
		}
		s.loops = append(s.loops, l)
		s.wg.Add(1)
		go l.run()
	}
	return nil
}

// loopDone is an event loop's last call.
func (s *h1Server) loopDone() { s.wg.Done() }

// Serve accepts connections on ln until Shutdown or Close, then returns
// http.ErrServerClosed (as net/http's server does), or the accept error.
// With event loops running, they accept on a TCP listener instead.
func (s *h1Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.shutdown.Load() {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	if tl, ok := ln.(*net.TCPListener); ok && len(s.loops) > 0 {
		for _, l := range s.loops {
			if err := l.listen(tl); err != nil {
				return fmt.Errorf("event loop listen: %w", err)
			}
		}
		<-s.closed
		return http.ErrServerClosed
	}
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.shutdown.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Out of file descriptors and the like: back off as
				// net/http's server does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				s.log.Warn("accept", "err", err, "retry_in", delay.String())
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		c := newH1conn(s, nc)
		s.mu.Lock()
		if s.shutdown.Load() {
			s.mu.Unlock()
			_ = nc.Close()
			return http.ErrServerClosed
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// done forgets c once its goroutine ends.
func (s *h1Server) done(c *h1conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.wg.Done()
}

// Shutdown stops accepting, closes idle connections at once and each
// active one after its current exchange, and waits for them until ctx
// ends; then it closes the rest and returns ctx's error.
func (s *h1Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.shutdown.Store(true)
	s.closeOnce.Do(func() { close(s.closed) })
	for ln := range s.lns {
		_ = ln.Close()
	}
	for _, l := range s.loops {
		l.post(l.drain)
	}
	for c := range s.conns {
		c.wakeIfIdle()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.Close()
		<-done
		return ctx.Err()
	}
}

// Close closes the listeners and every connection at once.
func (s *h1Server) Close() {
	s.mu.Lock()
	s.shutdown.Store(true)
	s.closedAll = true
	s.closeOnce.Do(func() { close(s.closed) })
	for ln := range s.lns {
		_ = ln.Close()
	}
	for _, l := range s.loops {
		l.post(l.stop)
	}
	for c := range s.conns {
		_ = c.nc.Close()
	}
	s.mu.Unlock()
}

// connListener hands connections the h1 server accepted to net/http's
// server (h2c): Accept returns them in turn until Close.
type connListener struct {
	addr   net.Addr
	ch     chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newConnListener(addr net.Addr) *connListener {
	return &connListener{addr: addr, ch: make(chan net.Conn), closed: make(chan struct{})}
}

// hand gives c to the server; false when the listener is closed.
func (l *connListener) hand(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.closed:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }

// peekedConn is a connection whose first bytes sit in r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// isH2 reads the connection's first bytes until they are, or cannot
// become, the HTTP/2 preface. A short HTTP/1.1 request cannot be mistaken
// for it: the preface differs from every method at its first space.
func isH2(br *bufio.Reader) (bool, error) {
	for n := 1; ; n++ {
		p, err := br.Peek(n)
		if err != nil {
			return false, err
		}
		if !h1.IsH2Preface(p) {
			return false, nil
		}
		if n == h1.H2PrefaceLen {
			return true, nil
		}
		if b := br.Buffered(); b > n {
			n = min(b, h1.H2PrefaceLen) - 1
		}
	}
}
