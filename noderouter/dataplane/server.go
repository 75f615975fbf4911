package dataplane

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"

	"skipper.dev/skipper/internal/tick"
)

// Server serves callers' connections with a Proxy: HTTP/1.1 by the
// forwarder Options name, h2c always by net/http. Serve may be called for
// several listeners (the node IP's and the node-local address's), each in
// a goroutine of the caller's; ServeHandoff in one more.
type Server struct {
	// nethttp serves h2c (and HTTP/1.1 with ForwarderNethttp).
	nethttp *http.Server
	// h1 serves HTTP/1.1 with ForwarderH1 and ForwarderLoop (nil with
	// ForwarderNethttp); it hands h2c connections to nethttp through
	// handoff.
	h1      *h1Server
	handoff *connListener
}

// NewServer makes p's server with the forwarder and loops of its Options,
// starting the event loops (stopped by Shutdown). log also takes net/http's
// own complaints (a bad TLS probe, a panic) as warnings.
func (p *Proxy) NewServer(log *slog.Logger) (*Server, error) {
	return newServer(p, log, p.opts.Forwarder, p.opts.Loops)
}

func newServer(p *Proxy, log *slog.Logger, forwarder string, loops int) (*Server, error) {
	// HTTP/1.1 and HTTP/2 cleartext (h2c, prior knowledge) on the same
	// listeners; instances are always spoken to in HTTP/1.1.
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	s := &Server{nethttp: &http.Server{Handler: p.nethttp, ReadHeaderTimeout: headerTimeout, IdleTimeout: idleTimeout,
		MaxHeaderBytes: p.maxHeaderBytes, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn), Protocols: &protocols}}
	if forwarder == ForwarderNethttp {
		return s, nil
	}
	s.handoff = newConnListener(handoffAddr{})
	s.h1 = newH1Server(p, log, s.handoff)
	if forwarder == ForwarderLoop {
		if err := s.h1.startLoops(loopCount(loops)); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Serve serves ln until Shutdown, then returns http.ErrServerClosed (or
// the error that stopped it).
func (s *Server) Serve(ln net.Listener) error {
	if s.h1 == nil {
		return s.nethttp.Serve(ln)
	}
	return s.h1.Serve(ln)
}

// ServeHandoff serves the h2c connections the h1 path hands over until
// Shutdown, then returns http.ErrServerClosed; at once with
// ForwarderNethttp, which needs no hand-over.
func (s *Server) ServeHandoff() error {
	if s.h1 == nil {
		return http.ErrServerClosed
	}
	return s.nethttp.Serve(s.handoff)
}

// Shutdown stops taking connections, lets the requests in flight finish
// until ctx ends, then closes what is left.
func (s *Server) Shutdown(ctx context.Context) error {
	var errs []error
	if s.h1 != nil {
		errs = append(errs, s.h1.Shutdown(ctx))
	}
	if err := s.nethttp.Shutdown(ctx); err != nil {
		errs = append(errs, err)
		_ = s.nethttp.Close()
	}
	return errors.Join(errs...)
}

// Run sweeps the instance pool's shared shard (each event loop sweeps its
// own) every half --idle-conn-timeout until ctx ends.
func (p *Proxy) Run(ctx context.Context) {
	tick.After(ctx, max(p.pool.idleTimeout/2, 100*time.Millisecond), p.pool.sweep)
}

// Close closes the idle instance connections once nothing serves any
// more.
func (p *Proxy) Close() {
	p.nethttp.transport.CloseIdleConnections()
	p.pool.close()
}

// SetIdentify has p tell callers apart with id (spec.callers); before it,
// every caller is unknown. Called before serving.
func (p *Proxy) SetIdentify(id Identifier) { p.identify = id }

// MarkDials has p's instance dials run control (which sets the socket
// mark) and the event loops' set mark, so BPF steering never rewrites the
// router's own connections. Called before serving.
func (p *Proxy) MarkDials(mark uint32, control func(network, address string, c syscall.RawConn) error) {
	d := instanceDialer(p.opts, control)
	p.nethttp.transport.DialContext = d.DialContext
	p.pool.dialer = d
	p.dialMark = mark
}

// handoffAddr is the address of the hand-over listener, which has none of
// its own.
type handoffAddr struct{}

func (handoffAddr) Network() string { return "handoff" }
func (handoffAddr) String() string  { return "h1-handoff" }

// DialInstance dials an instance as net/http's transport does (marked
// once MarkDials was called).
func (p *Proxy) DialInstance(ctx context.Context, network, addr string) (net.Conn, error) {
	return p.nethttp.transport.DialContext(ctx, network, addr)
}

// IdleConns counts the idle connections to addr in the pool the goroutine
// path and pre-connections share.
func (p *Proxy) IdleConns(addr string) int { return p.pool.idleCount(addr) }
