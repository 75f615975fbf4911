package echo

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Config is skipper-echo's configuration.
type Config struct {
	Listen          string
	PodName         string
	PodUID          string
	AssignKey       string
	MaxSleep        time.Duration
	MaxBody         int64
	ShutdownTimeout time.Duration
}

// DefaultConfig returns every default, in one place.
func DefaultConfig() Config {
	return Config{
		Listen:          ":8080",
		AssignKey:       "/var/run/skipper/assign-key/ed25519.pub",
		MaxSleep:        5 * time.Minute,
		MaxBody:         1 << 20,
		ShutdownTimeout: 10 * time.Second,
	}
}

// Validate reports every problem at once.
func (c Config) Validate() error {
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
	if c.MaxSleep < 0 {
		errs = append(errs, fmt.Errorf("--max-sleep %s must not be negative", c.MaxSleep))
	}
	if c.MaxBody <= 0 {
		errs = append(errs, fmt.Errorf("--max-body %d must be positive", c.MaxBody))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout %s must be positive", c.ShutdownTimeout))
	}
	return errors.Join(errs...)
}

// ParseConfig reads flags, falling back to the environment variables named
// in each flag's usage (an empty variable counts as unset). It returns
// flag.ErrHelp after printing --help.
func ParseConfig(args []string, stderr io.Writer) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("skipper-echo", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	env := map[string][]string{}
	str := func(p *string, name string, envs []string, usage string) {
		fs.StringVar(p, name, *p, usage)
		env[name] = envs
	}
	dur := func(p *time.Duration, name string, envs []string, usage string) {
		fs.DurationVar(p, name, *p, usage)
		env[name] = envs
	}
	str(&c.Listen, "listen", []string{"SKIPPER_LISTEN"},
		"address to serve HTTP on; in pods $(POD_IP):8080 so pods sharing a network namespace each bind their own IP")
	str(&c.PodName, "pod-name", []string{"SKIPPER_POD_NAME", "POD_NAME"},
		"this pod's name (downward API metadata.name), echoed back")
	str(&c.PodUID, "pod-uid", []string{"SKIPPER_POD_UID", "POD_UID"},
		"this pod's UID (downward API metadata.uid): the audience an assign token must name")
	str(&c.AssignKey, "assign-key", []string{"SKIPPER_ASSIGN_KEY"},
		"path of the PEM ed25519 public keys that verify assign tokens (ConfigMap skipper-assign-key; several blocks while a key rotates); read again at an assign at most once a second")
	dur(&c.MaxSleep, "max-sleep", []string{"SKIPPER_MAX_SLEEP"},
		"upper bound of ?sleep=")
	fs.Int64Var(&c.MaxBody, "max-body", c.MaxBody, "largest request body echoed or accepted, in bytes")
	env["max-body"] = []string{"SKIPPER_MAX_BODY"}
	dur(&c.ShutdownTimeout, "shutdown-timeout", []string{"SKIPPER_SHUTDOWN_TIMEOUT"},
		"how long SIGTERM waits for in-flight requests")

	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		for _, e := range env[f.Name] {
			if v, ok := os.LookupEnv(e); ok && v != "" {
				if err := f.Value.Set(v); err != nil {
					errs = append(errs, fmt.Errorf("env %s=%q: %w", e, v, err))
				}
				return
			}
		}
	})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stderr, fs, env)
			return c, flag.ErrHelp
		}
		return c, err
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments: %q", fs.Args()))
	}
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	return c, c.Validate()
}

func printUsage(w io.Writer, fs *flag.FlagSet, env map[string][]string) {
	fmt.Fprintln(w, "Usage: skipper-echo [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "skipper-echo is the reference instance runtime: it accepts assignments at")
	fmt.Fprintln(w, "POST /__skipper/assign and echoes every other request as JSON.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Flags (each falls back to the environment variables shown):")
	fs.VisitAll(func(f *flag.Flag) {
		fmt.Fprintf(w, "  --%s\n", f.Name)
		fmt.Fprintf(w, "        %s\n", f.Usage)
		fmt.Fprintf(w, "        default %q; env %s\n", f.DefValue, strings.Join(env[f.Name], ", "))
	})
}
