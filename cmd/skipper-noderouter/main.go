// Command skipper-noderouter is Skipper's per-node HTTP router; see package
// noderouter.
package main

import (
	"skipper.dev/skipper/internal/cmdmain"
	"skipper.dev/skipper/noderouter"
)

func main() { cmdmain.Main("skipper-noderouter", noderouter.Run) }
