package agent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"time"

	"skipper.dev/skipper/controller/flagenv"
	"skipper.dev/skipper/controller/instance"
	"skipper.dev/skipper/internal/loglevel"
)

// Config is skipper-agent's configuration: an instance runtime's, and
// how it hands the assignment on.
type Config struct {
	instance.RuntimeConfig
	// Dir is where the assignment is handed to the application (a shared
	// emptyDir).
	Dir string
	// Hook is the application's URL an assignment is POSTed to before the
	// instance accepts it; empty: none.
	Hook string
	// HookTimeout bounds the hook's answer.
	HookTimeout time.Duration
	LogLevel    string
}

// DefaultConfig returns every default, in one place.
func DefaultConfig() Config {
	return Config{
		RuntimeConfig: instance.DefaultRuntimeConfig(":7070"),
		Dir:           "/var/run/skipper/assignment",
		HookTimeout:   2 * time.Second,
		LogLevel:      "info",
	}
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	errs := c.RuntimeConfig.Validate()
	if !filepath.IsAbs(c.Dir) {
		errs = append(errs, fmt.Errorf("--dir %q: want an absolute path", c.Dir))
	}
	if c.Hook != "" {
		if u, err := url.Parse(c.Hook); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--hook %q: want an http:// URL of the application, such as http://127.0.0.1:8080/skipper/assigned", c.Hook))
		}
	}
	if c.HookTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--hook-timeout %s must be positive", c.HookTimeout))
	}
	if _, err := loglevel.Parse(c.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %w", err))
	}
	return errors.Join(errs...)
}

// ParseConfig reads flags, falling back to the environment variables named
// in --help, by flagenv's rules; getenv is package os's LookupEnv in
// production. It returns flag.ErrHelp after printing --help.
func ParseConfig(args []string, getenv func(string) (string, bool), stderr io.Writer) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("skipper-agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.AddFlags(fs, "address serving the instance contract (POST and GET /__skipper/assign): the pod's container port named skipper-assign; the application's own port takes the calls",
		"largest assign request body accepted, in bytes")
	fs.StringVar(&c.Dir, "dir", c.Dir,
		"directory the assignment is handed to the application in, a volume both containers mount: function (namespace/name), config.json (spec.config), assignment.json (function, config, callers, oneshot, timeoutSeconds; written last)")
	fs.StringVar(&c.Hook, "hook", c.Hook,
		"URL of the application the assignment (assignment.json's JSON) is POSTed to before the instance accepts it: a non-2xx answer refuses the claim (503 handover_failed: the controller gives the pod up, the pool replaces it, and the call that claimed it gets 503); empty: none")
	fs.DurationVar(&c.HookTimeout, "hook-timeout", c.HookTimeout, "how long the application's hook may take to answer")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	vars := flagenv.Names(fs, instance.DownwardVars)
	if err := flagenv.Parse(fs, vars, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "Usage: skipper-agent [flags]")
			fmt.Fprintln(stderr)
			fmt.Fprintln(stderr, "skipper-agent serves Skipper's instance contract beside an application that")
			fmt.Fprintln(stderr, "does not (a native sidecar in a pool pod): it accepts the pod's assignment and")
			fmt.Fprintln(stderr, "hands it to the application as files and, if asked, a POST. It is never on")
			fmt.Fprintln(stderr, "the path of a call: calls go to the application's own port.")
			fmt.Fprintln(stderr)
			fmt.Fprintln(stderr, "Flags (each falls back to the environment variables shown):")
			flagenv.PrintFlags(stderr, fs, vars)
		}
		return c, err
	}
	return c, c.Validate()
}
