// Command skipper-image builds Skipper's images as an OCI image layout and
// serves them from an in-process registry; see package
// skipper.dev/skipper/tests/image and `skipper-image --help`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"skipper.dev/skipper/tests/image"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := image.Run(ctx, os.Args[1:], os.LookupEnv, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipper-image:", err)
		os.Exit(1)
	}
}
