package echo

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"skipper.dev/skipper/controller/flagenv"
	"skipper.dev/skipper/controller/instance"
)

// Config is skipper-echo's configuration: an instance runtime's, and
// its own limit on ?sleep=.
type Config struct {
	instance.RuntimeConfig
	MaxSleep time.Duration
}

// DefaultConfig returns every default, in one place.
func DefaultConfig() Config {
	return Config{RuntimeConfig: instance.DefaultRuntimeConfig(":8080"), MaxSleep: 5 * time.Minute}
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	errs := c.RuntimeConfig.Validate()
	if c.MaxSleep < 0 {
		errs = append(errs, fmt.Errorf("--max-sleep %s must not be negative", c.MaxSleep))
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
	c.AddFlags(fs, "address to serve HTTP on; in pods $(POD_IP):8080 so pods sharing a network namespace each bind their own IP",
		"largest request body echoed or accepted, in bytes")
	fs.DurationVar(&c.MaxSleep, "max-sleep", c.MaxSleep, "upper bound of ?sleep=")
	vars := flagenv.Names(fs, instance.DownwardVars)
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
