package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"skipper.dev/skipper/cmd/skipper-echo/echo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := echo.Run(ctx, os.Args[1:], os.LookupEnv, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipper-echo:", err)
		os.Exit(1)
	}
}
