// Command skipper-cluster starts and stops Skipper's local Kubernetes cluster
// (root only): `skipper-cluster up` in the foreground, `skipper-cluster down`
// from any shell. See package skipper.dev/skipper/tests/cluster.
package main

import (
	"skipper.dev/skipper/internal/cmdmain"
	"skipper.dev/skipper/tests/cluster"
)

func main() { cmdmain.Main("skipper-cluster", cluster.Run) }
