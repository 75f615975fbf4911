// Command skipper-nodeagent is the local cluster's kubelet stand-in; see
// package skipper.dev/skipper/tests/nodeagent.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"skipper.dev/skipper/tests/nodeagent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := nodeagent.Run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "skipper-nodeagent:", err)
		stop()
		os.Exit(1)
	}
}
