package noderouter

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"

	"skipper.dev/skipper/bpf"
	"skipper.dev/skipper/controller/flagenv"
	"skipper.dev/skipper/noderouter/localaddr"
)

// CleanupConfig configures `skipper-noderouter bpf-cleanup`.
type CleanupConfig struct {
	// BPFPinDir is the pin directory to detach and remove; empty: skip.
	BPFPinDir string
	// LocalAddress is the node-local address to remove (with skipper0);
	// empty: only skipper0 is removed.
	LocalAddress string
}

// ParseCleanupConfig parses bpf-cleanup's flags with the router's defaults
// and env fallbacks, looked up by getenv, by flagenv's rules. It returns
// flag.ErrHelp after writing usage to w.
func ParseCleanupConfig(args []string, getenv func(string) (string, bool), w io.Writer) (CleanupConfig, error) {
	d := DefaultConfig()
	c := CleanupConfig{BPFPinDir: d.BPFPinDir, LocalAddress: d.LocalAddress}
	fs := flag.NewFlagSet("skipper-noderouter bpf-cleanup", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.BPFPinDir, "bpf-pin-dir", c.BPFPinDir, "bpffs directory whose pinned steering links are detached and pins removed; empty: skip")
	fs.StringVar(&c.LocalAddress, "local-address", c.LocalAddress, "node-local address removed from lo (label lo:skipper); dummy link skipper0 is always removed; empty: only skipper0")
	vars := flagenv.Names(fs, nil)
	err := flagenv.Parse(fs, vars, args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(w, `Usage: skipper-noderouter bpf-cleanup [flags]

Uninstalls what the router leaves on a node: detaches the pinned BPF steering
links (even from a router still running) and removes every pin under
--bpf-pin-dir, then removes dummy link skipper0 and the labelled node-local
address. Safe to repeat; nothing present is not an error. Needs CAP_BPF,
CAP_NET_ADMIN and write access to the pin directory.

Flags (each falls back to the environment variables shown; flags win):
`)
		flagenv.PrintFlags(w, fs, vars)
		return c, err
	}
	errs := []error{err}
	if c.LocalAddress != "" {
		if a, err := netip.ParseAddr(c.LocalAddress); err != nil || !a.Is4() {
			errs = append(errs, fmt.Errorf("--local-address %q: want an IPv4 address, or empty", c.LocalAddress))
		}
	}
	return c, errors.Join(errs...)
}

func runCleanup(args []string, getenv func(string) (string, bool), stderr io.Writer) error {
	c, err := ParseCleanupConfig(args, getenv, stderr)
	if err != nil {
		return fmt.Errorf("bpf-cleanup: %w", err)
	}
	return cleanup(c, &localaddr.Manager{})
}

// cleanup removes the pins, then the address (with m's handle). Both are
// attempted; errors are joined.
func cleanup(c CleanupConfig, m *localaddr.Manager) error {
	var errs []error
	if c.BPFPinDir != "" {
		errs = append(errs, bpf.Cleanup(c.BPFPinDir))
	}
	if c.LocalAddress != "" {
		m.Addr = netip.MustParseAddr(c.LocalAddress) // validated
	}
	errs = append(errs, m.Remove())
	return errors.Join(errs...)
}
