// Package nodeagent is the local cluster's kubelet stand-in: one agent per
// node registers a Node, keeps it Ready (status heartbeat and a Lease in
// kube-node-lease) and runs the containers of the pods bound to it as local
// processes inside the node's network namespace.
//
// # How a pod runs
//
//   - Network: as the CNI bridge plugin does it. The agent keeps a bridge
//     cbr0 in the node namespace holding the pod CIDR's first address (the
//     gateway), with forwarding and br_netfilter's bridge-nf-call-iptables
//     on (kube-proxy's rules see traffic between pods of one bridge). Each
//     pod gets a named network namespace <--pod-netns-prefix><uid> whose
//     eth0 (a veth peered with a cbr0 port) holds its IP from --pod-cidr,
//     with a default route via the gateway; its processes start inside it.
//     hostNetwork pods run in the node namespace on --node-ip. A pod's
//     namespace and veth are removed when it ends; at start and exit the
//     agent removes every namespace with its prefix.
//   - Cgroups: with --cgroup (the node's cgroup2 directory), each container
//     runs in <node>/kubepods/<qos>/pod<uid>/<container> (kubepods/pod<uid>
//     for Guaranteed), named as the kubelet's cgroupfs driver names pod
//     cgroups, in the cgroup2 hierarchy and at the same relative path in
//     the v1 hierarchies of cpu, cpuacct, memory and pids where the machine
//     has them. They are removed (stragglers killed) when the pod ends; at
//     start and exit the agent removes the node's whole kubepods tree.
//   - Image: the image repository (any tag) maps to a directory with
//     --image-dir; the executable is <dir>/<basename of command[0]>. An
//     unmapped image leaves the container Waiting with ErrImageNeverPull.
//   - Mounts: each container process starts as the container init
//     (bin/skipper-container-init, package containerinit: a small binary of
//     its own, since a Go program pays for its packages' initialisation at
//     every start) in a new mount namespace (/ made rprivate); it
//     detaches the host's mounts under /run (copies of other pods' netns
//     bind mounts would pin them) and mounts a private tmpfs on /run, the
//     agent moves it into its cgroups, writes the container's
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
//     thresholds (until the first success, probed 10ms after start and then
//     at doubling intervals up to 500ms).
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
// Run(ctx, args, stderr) is bin/skipper-nodeagent's command line (it finds
// the container init beside itself, or at --container-init); the agent runs until ctx ends, then
// stops its pods. skipper-cluster starts one per node inside the node's
// network namespace, in the leaf <node cgroup>/system.
package nodeagent
