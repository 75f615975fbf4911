package instance

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"skipper.dev/skipper/controller/flagenv"
)

// RuntimeConfig is what every instance runtime (skipper-echo,
// skipper-agent) is told: where it serves the contract, which pod it is,
// its key file, its limits.
type RuntimeConfig struct {
	Listen          string
	PodName         string
	PodUID          string
	AssignKey       string
	MaxBody         int64
	ShutdownTimeout time.Duration
}

// DefaultRuntimeConfig returns the defaults of a runtime serving on
// listen.
func DefaultRuntimeConfig(listen string) RuntimeConfig {
	return RuntimeConfig{
		Listen:          listen,
		AssignKey:       "/var/run/skipper/assign-key/ed25519.pub",
		MaxBody:         DefaultMaxBody,
		ShutdownTimeout: 10 * time.Second,
	}
}

// DownwardVars are the variables the downward API sets in a pool pod,
// read after SKIPPER_POD_NAME and SKIPPER_POD_UID (flagenv).
var DownwardVars = flagenv.Vars{"pod-name": {"POD_NAME"}, "pod-uid": {"POD_UID"}}

// AddFlags defines c's flags on fs; listenUsage and maxBodyUsage say what
// the runtime serves there and which bodies the limit binds.
func (c *RuntimeConfig) AddFlags(fs *flag.FlagSet, listenUsage, maxBodyUsage string) {
	fs.StringVar(&c.Listen, "listen", c.Listen, listenUsage)
	fs.StringVar(&c.PodName, "pod-name", c.PodName, "this pod's name (downward API metadata.name), in the assign's answer and the logs")
	fs.StringVar(&c.PodUID, "pod-uid", c.PodUID, "this pod's UID (downward API metadata.uid): the audience an assign token must name")
	fs.StringVar(&c.AssignKey, "assign-key", c.AssignKey,
		"path of the PEM ed25519 public keys that verify assign tokens (ConfigMap skipper-assign-key; several blocks while a key rotates); read again at an assign at most once a second")
	fs.Int64Var(&c.MaxBody, "max-body", c.MaxBody, maxBodyUsage)
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "how long SIGTERM waits for in-flight requests")
}

// Validate returns every problem with c.
func (c RuntimeConfig) Validate() []error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New("--listen is required"))
	}
	if c.PodUID == "" {
		errs = append(errs, errors.New("--pod-uid is required (env SKIPPER_POD_UID or POD_UID, from the downward API metadata.uid): assign tokens are verified against it"))
	}
	if c.AssignKey == "" {
		errs = append(errs, errors.New("--assign-key is required"))
	}
	if c.MaxBody <= 0 {
		errs = append(errs, fmt.Errorf("--max-body %d must be positive", c.MaxBody))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout %s must be positive", c.ShutdownTimeout))
	}
	return errs
}

// Holder is the Config of c's Holder, each assignment handed to onAssign
// (nil: none).
func (c RuntimeConfig) Holder(onAssign func(Assignment) error) Config {
	return Config{PodUID: c.PodUID, PodName: c.PodName, KeyFile: c.AssignKey, MaxBody: c.MaxBody, OnAssign: onAssign}
}

// Run serves handler (h registered on it) on ln and keeps h's keys until
// ctx ends, then drains for at most timeout (Serve).
func (h *Holder) Run(ctx context.Context, ln net.Listener, handler http.Handler, timeout time.Duration, log *slog.Logger) error {
	kctx, stopKeys := context.WithCancel(ctx)
	var keys sync.WaitGroup
	keys.Go(func() { h.KeepKeys(kctx) })
	defer func() { stopKeys(); keys.Wait() }()
	return Serve(ctx, ln, handler, timeout, log)
}
