// Package nodeagent is the local cluster's kubelet stand-in: one agent per
// node registers a Node, keeps it Ready (status heartbeat and a Lease in
// kube-node-lease) and runs the containers of the pods bound to it as local
// processes inside the node's network namespace.
//
// # How a pod runs
//
//   - IP: pods get an address from --pod-cidr, added as a /32 on lo in the
//     node namespace (pods share it and each binds its own IP); hostNetwork
//     pods use --node-ip. Addresses are removed when the pod ends.
//   - Image: the image repository (any tag) maps to a directory with
//     --image-dir; the executable is <dir>/<basename of command[0]>. An
//     unmapped image leaves the container Waiting with ErrImageNeverPull.
//   - Mounts: each container process starts as the agent binary re-executed
//     with a hidden subcommand in a new mount namespace (/ made rprivate); it
//     mounts a private tmpfs on /run, the agent writes the container's
//     volumes there through /proc/<pid>/root, and the init execs the
//     container binary. Nothing is created on the host. Mount paths must be
//     under /run or /var/run; volumes are the projected service-account
//     volume (TokenRequest bound to the pod, refreshed at 80% of its life),
//     configMap, secret, downwardAPI, emptyDir (per container in v0) and
//     hostPath mounted at its own path (a no-op).
//   - Env: literal values, fieldRef, resourceFieldRef, configMapKeyRef,
//     secretKeyRef, envFrom, and $(VAR) expansion as the kubelet does, on top
//     of KUBERNETES_SERVICE_HOST/PORT from --apiserver-host/--apiserver-port.
//   - Probes: readiness httpGet and tcpSocket with initialDelay, period and
//     thresholds (probed every 500ms until the first success).
//   - Lifetime: containers lead their own process group and get SIGKILL when
//     the agent dies (PR_SET_PDEATHSIG); exits restart per restartPolicy with
//     the kubelet's backoff (10s doubling to 5m); a deleted pod gets SIGTERM,
//     its grace period, SIGKILL, then the final delete (grace 0, UID
//     precondition).
//
// # Invariants
//
// One goroutine per pod (podWorker.run) owns that pod's state; informer
// callbacks, process watchers and probers only hand it work. Every pod
// process dies with the agent. Status is written through /status only when
// it changed.
//
// # Driving it
//
// Run(ctx, args, stderr) is bin/skipper-nodeagent's command line, including
// the hidden container-init subcommand; the agent runs until ctx ends, then
// stops its pods. skipper-cluster starts one per node inside the node's
// network namespace and cgroup.
package nodeagent
