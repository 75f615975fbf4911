// Command skipper-echo is the runtime of Skipper's demo function and pool
// pods; see package skipper.dev/skipper/cmd/skipper-echo/echo and
// `skipper-echo --help`.
package main

import (
	"skipper.dev/skipper/cmd/skipper-echo/echo"
	"skipper.dev/skipper/internal/cmdmain"
)

func main() { cmdmain.Main("skipper-echo", echo.Run) }
