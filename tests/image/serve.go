package image

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// ServeOptions configures Serve. The zero value serves with the stated
// defaults.
type ServeOptions struct {
	// ShutdownTimeout bounds the wait for requests in flight once ctx
	// ends; then connections are closed. Zero: 5s.
	ShutdownTimeout time.Duration
	// Log receives the registry's request lines (at debug) and errors.
	// Nil: nothing is logged.
	Log *slog.Logger
	// Ready, if not nil, is called once every image is pushed, with the
	// address served and what was pushed, before Serve waits for ctx.
	Ready func(addr string, pushed []Summary)
}

// Serve serves a registry (go-containerregistry's, blobs and manifests in
// memory) on ln, pushes every image into it under its repository and tag
// with ln's address as the registry ("ghcr.io/skipper-dev/skipper:dev" is
// served as <addr>/skipper-dev/skipper:dev), and serves until ctx ends.
// It closes ln. It returns nil after a graceful shutdown.
func Serve(ctx context.Context, ln net.Listener, images []Tagged, o ServeOptions) error {
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 5 * time.Second
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv := &http.Server{
		Handler:           registry.New(registry.Logger(slog.NewLogLogger(log.Handler(), slog.LevelDebug))),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	addr := pushAddr(ln.Addr())
	pushed, err := pushAll(ctx, addr, images)
	if err == nil {
		if o.Ready != nil {
			o.Ready(ln.Addr().String(), pushed)
		}
		select {
		case <-ctx.Done():
		case err = <-served:
			return fmt.Errorf("registry: %w", err)
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ShutdownTimeout)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		srv.Close()
		log.Warn("registry shutdown cut short", "timeout", o.ShutdownTimeout, "err", serr)
	}
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, fmt.Errorf("registry: %w", serr))
	}
	return err
}

// pushAll pushes images to the registry at addr and returns their
// references there.
func pushAll(ctx context.Context, addr string, images []Tagged) ([]Summary, error) {
	// A transport of its own, closed after: no idle connection (and its
	// goroutines) outlives the pushes.
	tr := remote.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	var out []Summary
	for _, t := range images {
		ref, err := name.NewTag(addr+"/"+t.Ref.RepositoryStr()+":"+t.Ref.TagStr(), name.StrictValidation, name.Insecure)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.Ref, err)
		}
		if err := remote.Write(ref, t.Image, remote.WithContext(ctx), remote.WithTransport(tr)); err != nil {
			return nil, fmt.Errorf("push %s as %s: %w", t.Ref, ref, err)
		}
		s, err := summarize(ref.Name(), t.Image)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// pushAddr is the address Serve pushes to: ln's, with an unspecified IP
// ("0.0.0.0", "::": Go listens on both families) replaced by 127.0.0.1.
func pushAddr(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return a.String()
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port))
}
