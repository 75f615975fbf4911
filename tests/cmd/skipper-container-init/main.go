// Command skipper-container-init is the node agent's container init; see
// package skipper.dev/skipper/tests/nodeagent/containerinit. The agent
// starts it with fds 3 and 4 as its pipes; it is not for running by hand.
package main

import (
	"fmt"
	"os"

	"skipper.dev/skipper/tests/nodeagent/containerinit"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "skipper-container-init: takes no arguments; the node agent starts it with its pipes as fds 3 and 4")
		os.Exit(2)
	}
	err := containerinit.Run()
	// Run returns only on failure; it has told the agent on fd 4.
	fmt.Fprintln(os.Stderr, "skipper-container-init:", err)
	os.Exit(127)
}
