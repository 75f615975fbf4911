package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"

	"skipper.dev/skipper/controller/instance"
	"skipper.dev/skipper/internal/loglevel"
)

// Run parses args (their environment fallbacks looked up by getenv,
// package os's LookupEnv from main), serves the contract until ctx is
// cancelled, then shuts down gracefully. --help prints usage and returns
// flag.ErrHelp.
func Run(ctx context.Context, args []string, getenv func(string) (string, bool), stderr io.Writer) error {
	cfg, err := ParseConfig(args, getenv, stderr)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	level, _ := loglevel.Parse(cfg.LogLevel) // validated
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})).With("pod", cfg.PodName)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	return serve(ctx, cfg, log, ln)
}

// serve serves the contract on ln until ctx ends.
func serve(ctx context.Context, cfg Config, log *slog.Logger, ln net.Listener) error {
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		_ = ln.Close()
		return fmt.Errorf("--dir: %w", err)
	}
	a := &agent{cfg: cfg, log: log, client: &http.Client{
		// The application is on the pod's own loopback: no proxy, and a
		// redirect is not followed (the hook's answer is its answer).
		Transport:     &http.Transport{Proxy: nil},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	defer a.client.CloseIdleConnections()
	h := instance.New(cfg.Holder(a.handOver), log)
	if err := h.LoadKeys(); err != nil {
		// The first assign reads the file again; the key ConfigMap may
		// appear after the pod.
		log.Warn("assign key not loaded yet", "path", cfg.AssignKey, "err", err)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return h.Run(ctx, ln, mux, cfg.ShutdownTimeout, log)
}

// agent hands each assignment to the application.
type agent struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client
	// held is what the application was last handed (nil: nothing yet).
	// handOver's calls never overlap (instance.Config.OnAssign).
	held *Handed
}

// handOver writes a's files, then tells the application's hook, when it
// has one. A failure refuses the assign, and the files go back to what
// the application held (none, before its first function): the files
// never say the application holds what it refused. It is
// instance.Config.OnAssign.
func (a *agent) handOver(as instance.Assignment) error {
	h := handedOf(as.Request)
	if err := writeFiles(a.cfg.Dir, h); err != nil {
		a.restore()
		return err
	}
	if a.cfg.Hook != "" {
		if err := callHook(context.Background(), a.client, a.cfg.Hook, h, a.cfg.HookTimeout); err != nil {
			a.restore()
			return fmt.Errorf("the application's hook: %w", err)
		}
	}
	a.held = &h
	a.log.Info("assignment handed over", "function", h.Function, "dir", a.cfg.Dir, "hook", a.cfg.Hook != "")
	return nil
}

// restore puts back the files of what the application held; with
// nothing held, it removes them. A failure here is logged: the instance
// holds nothing it did not hand over (its Holder keeps what it held), and
// the controller retires a pod whose assign failed.
func (a *agent) restore() {
	var err error
	if a.held != nil {
		err = writeFiles(a.cfg.Dir, *a.held)
	} else {
		err = removeFiles(a.cfg.Dir)
	}
	if err != nil {
		a.log.Warn("the assignment's files may say what the application refused", "dir", a.cfg.Dir, "err", err)
	}
}
