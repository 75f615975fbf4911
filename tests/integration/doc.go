// Package integration wires the real router (noderouter.Run, in process,
// over real sockets) to the real controllers of the local cluster (the
// skipper-controller replicas it runs, found through their EndpointSlices
// as in production) and to the cluster's pool of skipper-echo instances.
// The tests attach to a running cluster through .skipper/env or start one
// (tests/attach); they need root and what `make build kube containerd
// crictl image` puts in bin/, and run under the machine's cluster flock:
//
//	flock /tmp/skipper-cluster.flock bash -c 'make build kube containerd crictl image && timeout 900 go test -p 1 -count=1 ./tests/integration/; make down'
//
// Each test creates its own Functions on the example pool default/echo (the
// record test: pods of a pool of its own) and deletes them afterwards.
package integration
