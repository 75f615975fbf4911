// Package attach finds the local cluster that the suites under tests/ run
// against: it attaches to the running one through .skipper/env, or starts
// one with bin/skipper-cluster up and returns how to stop it. One cluster
// per machine: callers run under the machine's cluster flock.
package attach
