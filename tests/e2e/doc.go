// Package e2e holds the end-to-end tests: they run against the local cluster
// (tests/cluster), attaching to a running one through .skipper/env or, when
// none runs, starting one with bin/skipper-cluster up for the package's run
// and stopping it afterwards. They need root and the binaries `make build`
// and `make kube` put in bin/ (`make e2e` does both).
package e2e
