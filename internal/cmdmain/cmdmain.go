package cmdmain

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// RunFunc is a command's Run.
type RunFunc func(ctx context.Context, args []string, getenv func(string) (string, bool), stderr io.Writer) error

// Main runs run with the process's arguments, environment and stderr under
// a context that ends at SIGINT or SIGTERM (further signals are ignored
// until run returns: it decides how long its shutdown takes); when run
// fails it prints the error after name and exits 1. A run that returns
// flag.ErrHelp (wrapped or not) has printed its usage: that exits 0.
func Main(name string, run RunFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.LookupEnv, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}
