package echo

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Run parses args (with their environment fallbacks looked up by getenv,
// package os's LookupEnv from main), serves until ctx is cancelled and then
// shuts down gracefully. --help prints usage and returns nil.
func Run(ctx context.Context, args []string, getenv func(string) (string, bool), stderr io.Writer) error {
	cfg, err := ParseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("Config: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil)).With("pod", cfg.PodName)

	srv := NewServer(cfg, log)
	// Before listening, so before the pod is ready: a claim finds the
	// code it runs warm.
	start := time.Now()
	if err := srv.Warm(); err != nil {
		log.Warn("warm-up failed: the first assign pays for it", "err", err)
	} else {
		log.Debug("warmed up", "took", time.Since(start))
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	kctx, stopKeys := context.WithCancel(ctx)
	var keys sync.WaitGroup
	keys.Go(func() { srv.holder.KeepKeys(kctx) })
	defer func() { stopKeys(); keys.Wait() }()
	return serve(ctx, ln, srv, cfg.ShutdownTimeout, log)
}

// serve runs handler on ln until ctx ends, then drains for at most timeout.
func serve(ctx context.Context, ln net.Listener, h http.Handler, timeout time.Duration, log *slog.Logger) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String())

	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", timeout.String())
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
