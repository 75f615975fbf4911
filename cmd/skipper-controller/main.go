// Command skipper-controller runs a Skipper controller replica; see package
// skipper.dev/skipper/controller and `skipper-controller --help`.
package main

import (
	"skipper.dev/skipper/controller"
	"skipper.dev/skipper/internal/cmdmain"
)

func main() { cmdmain.Main("skipper-controller", controller.Run) }
