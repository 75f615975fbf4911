// Package linuxhost is the host plumbing of the local cluster
// (tests/cluster) and its tests: named network namespaces
// (entered, created, deleted, their processes found), netlink dumps that
// survive concurrent changes, sysctls, and cgroup hierarchies (the cgroup2
// mount and the v1 hierarchies of the controllers pods are accounted in).
//
// # Invariants
//
//   - No function leaves the calling goroutine's thread in another network
//     namespace: namespaces are entered on a dedicated locked thread that
//     returns to its namespace, or is retired by the runtime when it cannot.
//   - Mounts are read from the mount table (github.com/moby/sys/mountinfo),
//     never assumed.
//   - Creation and removal are idempotent: a missing piece on removal, or an
//     existing one on creation, is not an error.
package linuxhost
