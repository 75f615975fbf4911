// Command skipper-cluster starts and stops Skipper's local Kubernetes cluster
// (root only): `skipper-cluster up` in the foreground, `skipper-cluster down`
// from any shell. See package skipper.dev/skipper/tests/cluster.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"skipper.dev/skipper/tests/cluster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cluster.Run(ctx, os.Args[1:], os.LookupEnv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "skipper-cluster:", err)
		stop()
		os.Exit(1)
	}
}
