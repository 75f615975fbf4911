package echo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"
)

// Run parses args (with their environment fallbacks looked up by getenv,
// package os's LookupEnv from main), serves until ctx is cancelled and then
// shuts down gracefully. --help prints usage and returns flag.ErrHelp.
func Run(ctx context.Context, args []string, getenv func(string) (string, bool), stderr io.Writer) error {
	cfg, err := ParseConfig(args, getenv, stderr)
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
	return srv.holder.Run(ctx, ln, srv, cfg.ShutdownTimeout, log)
}
