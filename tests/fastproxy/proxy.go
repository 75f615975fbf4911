package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"runtime"
	"time"

	"github.com/valyala/fasthttp"
)

// Config is fastproxy's flags.
type Config struct {
	Listen   string // host:port to accept callers on
	Upstream string // host:port of the one instance every request goes to
	Procs    int    // GOMAXPROCS; 0 keeps Go's default (the CPUs it may use)
}

// Defaults.
const (
	defaultListen = "127.0.0.1:18083"
	// maxUpstreamConns matches nginx's worker_connections and haproxy's
	// maxconn in skipper-bench's configs.
	maxUpstreamConns = 4096
	// idleTimeout is how long an idle connection is kept, on either side
	// (nginx's keepalive_timeout and haproxy's timeout http-keep-alive in
	// the bench).
	idleTimeout = 60 * time.Second
	// shutdownTimeout bounds the graceful stop: requests in flight finish,
	// idle connections are closed.
	shutdownTimeout = 3 * time.Second
)

// functionHeader is the router's routing header: the other proxies pass it
// on, this one strips it as the router does.
var functionHeader = []byte("X-Skipper-Function")

func parseFlags(args []string, stderr io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("fastproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: fastproxy -upstream host:port [-listen host:port] [-procs n]

A minimal reverse proxy on fasthttp (a Server and a HostClient to one
upstream, keep-alive, bodies streamed, no routing) that skipper-bench warm
measures beside the router, nginx and haproxy. It strips X-Skipper-Function
and passes everything else as it came. SIGINT or SIGTERM stops it gracefully.

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.Listen, "listen", defaultListen, "host:port to accept callers on")
	fs.StringVar(&c.Upstream, "upstream", "", "host:port of the upstream instance (required)")
	fs.IntVar(&c.Procs, "procs", 0, "GOMAXPROCS; 0 keeps Go's default")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return c, c.Validate()
}

// Validate checks c, all problems at once.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("-listen %q: %w", c.Listen, err))
	}
	if c.Upstream == "" {
		errs = append(errs, errors.New("-upstream: required"))
	} else if host, _, err := net.SplitHostPort(c.Upstream); err != nil || host == "" {
		errs = append(errs, fmt.Errorf("-upstream %q: want host:port", c.Upstream))
	}
	if c.Procs < 0 {
		errs = append(errs, fmt.Errorf("-procs %d: want 0 or more", c.Procs))
	}
	return errors.Join(errs...)
}

// run is fastproxy: it serves until ctx ends, then stops gracefully.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if cfg.Procs > 0 {
		runtime.GOMAXPROCS(cfg.Procs)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	return serve(ctx, ln, cfg.Upstream, log.New(stderr, "fastproxy: ", log.LstdFlags))
}

// proxy forwards every request to one upstream.
type proxy struct {
	upstream *fasthttp.HostClient
}

func newProxy(upstream string) *proxy {
	return &proxy{upstream: &fasthttp.HostClient{
		Addr:                          upstream,
		MaxConns:                      maxUpstreamConns,
		MaxIdleConnDuration:           idleTimeout,
		ConnPoolStrategy:              fasthttp.LIFO,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		// The body stays on the upstream connection until the server has
		// copied it to the caller; closing the stream (the server does,
		// after writing) returns the connection to the pool.
		StreamResponseBody: true,
	}}
}

// handle sends the caller's request to the upstream and leaves the answer
// (its body a stream from the upstream connection) for the server to write.
func (p *proxy) handle(ctx *fasthttp.RequestCtx) {
	stripHeader(&ctx.Request.Header, functionHeader)
	if err := p.upstream.Do(&ctx.Request, &ctx.Response); err != nil {
		ctx.Error("fastproxy: upstream: "+err.Error(), fasthttp.StatusBadGateway)
	}
}

// stripHeader removes every field named name, in any case: with header
// names not normalised, fasthttp's Del matches the exact bytes only.
func stripHeader(h *fasthttp.RequestHeader, name []byte) {
	for {
		var found []byte
		for k := range h.All() {
			if bytes.EqualFold(k, name) {
				found = k
				break
			}
		}
		if found == nil {
			return
		}
		h.DelBytes(found) // copies found before it changes the header
	}
}

// newServer is the fasthttp.Server in front of p.
func newServer(p *proxy, logger fasthttp.Logger) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:                       p.handle,
		Logger:                        logger,
		IdleTimeout:                   idleTimeout,
		StreamRequestBody:             true,
		DisableHeaderNamesNormalizing: true,
		DisablePreParseMultipartForm:  true,
		NoDefaultServerHeader:         true,
		NoDefaultDate:                 true,
		NoDefaultContentType:          true,
	}
}

// serve proxies ln's connections to upstream until ctx ends, then stops
// the server (requests in flight finish, within shutdownTimeout) and
// closes the idle upstream connections.
func serve(ctx context.Context, ln net.Listener, upstream string, logger fasthttp.Logger) error {
	p := newProxy(upstream)
	srv := newServer(p, logger)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		p.upstream.CloseIdleConnections()
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := srv.ShutdownWithContext(sctx)
	if serr := <-done; err == nil && serr != nil {
		err = serr
	}
	p.upstream.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
