// Command skipper-agent serves Skipper's instance contract beside an
// application that does not; see package
// skipper.dev/skipper/cmd/skipper-agent/agent and `skipper-agent --help`.
package main

import (
	"skipper.dev/skipper/cmd/skipper-agent/agent"
	"skipper.dev/skipper/internal/cmdmain"
)

func main() { cmdmain.Main("skipper-agent", agent.Run) }
