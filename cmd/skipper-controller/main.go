// Command skipper-controller runs a Skipper controller replica; see package
// skipper.dev/skipper/controller and `skipper-controller --help`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"skipper.dev/skipper/controller"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := controller.Run(ctx, os.Args[1:], os.LookupEnv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "skipper-controller:", err)
		stop()
		os.Exit(1)
	}
}
