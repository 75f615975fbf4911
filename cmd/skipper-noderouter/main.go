// Command skipper-noderouter is Skipper's per-node HTTP router; see package
// noderouter.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"skipper.dev/skipper/noderouter"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := noderouter.Run(ctx, os.Args[1:], os.LookupEnv, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipper-noderouter:", err)
		os.Exit(1)
	}
}
