// Package cluster runs Skipper's local Kubernetes cluster: a real etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler (the multi-call
// bin/kube built from the nested module tests/kube), a registry serving
// make image's images, and real nodes: each a kubelet (bin/kube), a
// containerd (make containerd, the nested module tests/containerd) with
// Debian's runc and CNI plugins, and a kube-proxy, each node living in its
// own network namespace on a bridge in the root namespace, and in a mount
// namespace of its own. CoreDNS (tests/cluster/dns) is the cluster DNS.
//
// # Layout
//
// Names and addresses are fixed by docs/architecture.md: the bridge
// skipper-br0 holds 198.51.100.1/24 (the API server binds and advertises it on
// :6443, the registry serves on :5000); node N is the network namespace
// skipper-node<N> with eth0 = 198.51.100.<10+N>/24, pod CIDR 198.18.<N>.0/24
// routed from the root namespace via the node IP; each pod has its own
// namespace on the node's bridge cbr0 (the CNI bridge plugin's, addresses
// from host-local); kube-proxy runs in every node namespace, and the
// service range 198.19.0.0/16 is blackholed in the root namespace (the
// cluster DNS is 198.19.0.10). Node namespaces have no default route:
// nothing a pod sends can leave the machine. Node N's cgroup is
// /skipper/node<N> in the cgroup2 hierarchy and in every v1 hierarchy
// (Cgroups); its kubelet (cgroupfs driver, failCgroupV1: false: this
// machine's cgroups are hybrid, cpu and memory on v1) nests the pods'
// cgroups under it, and the node process runs, with kube-proxy, in
// /skipper/node<N>/system. The control plane runs in
// /skipper/control-plane, at a quarter of a node's CPU weight (see
// Cgroups).
//
// A node's mount namespace (RunNode) binds its own directories under
// .skipper/nodes/node<N> over /var/lib/containerd, /run/containerd,
// /var/lib/kubelet, /var/lib/cni and /var/log/containers, and a tmpfs on
// /run/netns: no two nodes share a socket, a content store, an IPAM record
// or a pod network namespace. Its mounts are shared within it (the
// router's bpffs hostPath uses HostToContainer propagation) and slaves of
// the machine's, so nothing propagates back. The node process is the
// subreaper of the runc shims, which daemonise; it stops the kubelet,
// kills what is left in the pod cgroups, stops containerd and kills every
// shim before it exits. What each daemon needs and neither defaults to is
// set in node.go, each value with its reason (maxPods 250, eviction and
// image GC that never fire on this disk, the pinned sandbox image, the
// kernel tunables bound to files of the node's own).
//
// Everything a run makes on disk lives under the state directory (.skipper/
// in the repository): the PKI and kubeconfigs (.skipper/pki, .skipper/kubeconfig
// is the admin one), etcd's data, one pid file per child process
// (.skipper/<name>.pid, plus skipper-cluster.pid for the foreground `up`),
// logs under .skipper/logs, and .skipper/env once the cluster is ready.
//
// # Invariants
//
//   - Every step of Up is idempotent and safe to re-run after a crash; Down
//     removes everything Up can have made (processes, network namespaces,
//     links, addresses, routes, mounts, cgroups, runtime state) and succeeds
//     when there is nothing to remove. Logs are kept for post-mortems.
//   - Children die with the foreground process: each runs in its own process
//     group with PR_SET_PDEATHSIG, and Up kills them explicitly on shutdown.
//   - A cluster runs when a pid file names a live process (pid and start time
//     match); Up refuses to start a second one. One cluster per machine: Up
//     also holds the abstract unix socket @skipper-local-cluster for its
//     lifetime, so a cluster with another state directory (a test's) and
//     `make up` never build the same network at once (--lock-wait).
//
// # Driving it
//
// Run(ctx, args, getenv, stderr) is the whole command line of bin/skipper-cluster
// (`up`, `down`, `stop NAME`, `start NAME`, `--help`). Up blocks until ctx
// is cancelled (SIGINT/SIGTERM) or a child dies, then tears down exactly as
// Down does.
//
// A test may stop a control-plane component (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler) and start it again while the
// cluster runs: Control(ctx, stateDir, "stop"|"start", name), or
// `bin/skipper-cluster stop kube-apiserver` and `... start kube-apiserver`
// from a shell, served by Up on <state>/control.sock (restart.go). A start
// returns once the component is ready; one left stopped is started again by
// the cluster after MaxOutage (30 s), below the node-monitor grace period, so
// nodes stay Ready. Only those components may stop: any other child exiting
// still tears the cluster down.
package cluster
