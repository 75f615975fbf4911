package echo

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"skipper.dev/skipper/controller/flagenv"
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
// in --help, by flagenv's rules; getenv is package os's LookupEnv in
// production. It returns flag.ErrHelp after printing --help.
func ParseConfig(args []string, getenv func(string) (string, bool), stderr io.Writer) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("skipper-echo", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.Listen, "listen", c.Listen,
		"address to serve HTTP on; in pods $(POD_IP):8080 so pods sharing a network namespace each bind their own IP")
	fs.StringVar(&c.PodName, "pod-name", c.PodName,
		"this pod's name (downward API metadata.name), echoed back")
	fs.StringVar(&c.PodUID, "pod-uid", c.PodUID,
		"this pod's UID (downward API metadata.uid): the audience an assign token must name")
	fs.StringVar(&c.AssignKey, "assign-key", c.AssignKey,
		"path of the PEM ed25519 public keys that verify assign tokens (ConfigMap skipper-assign-key; several blocks while a key rotates); read again at an assign at most once a second")
	fs.DurationVar(&c.MaxSleep, "max-sleep", c.MaxSleep, "upper bound of ?sleep=")
	fs.Int64Var(&c.MaxBody, "max-body", c.MaxBody, "largest request body echoed or accepted, in bytes")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout,
		"how long SIGTERM waits for in-flight requests")
	vars := flagenv.Names(fs, flagenv.Vars{"pod-name": {"POD_NAME"}, "pod-uid": {"POD_UID"}})
	if err := flagenv.Parse(fs, vars, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stderr, fs, vars)
		}
		return c, err
	}
	return c, c.Validate()
}

func printUsage(w io.Writer, fs *flag.FlagSet, vars flagenv.Vars) {
	fmt.Fprintln(w, "Usage: skipper-echo [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "skipper-echo is the reference instance runtime: it accepts assignments at")
	fmt.Fprintln(w, "POST /__skipper/assign and echoes every other request as JSON.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Flags (each falls back to the environment variables shown):")
	flagenv.PrintFlags(w, fs, vars)
}
