// Command skipper-pause is the process of the sandbox ("pause") image: the
// kubelet starts one per pod to hold its namespaces. It blocks until
// SIGINT or SIGTERM, then exits 0, and reaps every child that exits in the
// meantime (as PID 1 of a pod sharing its PID namespace, orphans become
// its children), as Kubernetes' own pause does. It takes no arguments and
// has no Run: its whole behaviour is the signals, tested by running it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	reap() // children that exited before the handler was installed
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap() // signals coalesce: one SIGCHLD can stand for many children
	}
}

// reap collects every child that has exited, without blocking.
func reap() {
	for {
		pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
