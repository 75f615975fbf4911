// Package e2e holds the end-to-end tests: they run against the local cluster
// (tests/cluster), attaching to a running one through .skipper/env or, when
// none runs, starting one with bin/skipper-cluster up for the package's run
// and stopping it afterwards. They need root and what `make build kube
// containerd crictl image` puts in bin/ (`make e2e` does it).
package e2e
