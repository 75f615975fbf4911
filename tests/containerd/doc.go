// Command containerd builds the container runtime of the local cluster's nodes
// from github.com/containerd/containerd/v2, pinned in this module's go.mod, so
// that each node's kubelet talks CRI to a real containerd 2.x without a
// download of release binaries: containerd (the daemon with CRI, the overlayfs
// and native snapshotters, the runc v2 runtime), containerd-shim-runc-v2 (the
// per-pod shim, which runs Debian's runc) and ctr, in one multi-call binary.
// The component is chosen by the first argument when it names one
// (`containerd ctr version`: the binary is itself named containerd), else by
// the name it is invoked as (bin/containerd-shim-runc-v2, bin/ctr).
//
// It is a nested module so containerd's dependency graph (gRPC, OpenTelemetry,
// the CNI and OCI libraries at containerd's versions) stays out of the
// product's go.mod, as tests/kube does for Kubernetes. `make containerd`
// builds it with CGO_ENABLED=0 and the tags no_btrfs, no_devmapper and
// no_zfs; the plugin list in main.go mirrors containerd's
// cmd/containerd/builtins less those three.
//
// Invariants:
//
//   - Each component initialises only its own plugins: containerd's daemon and
//     shim both start every plugin in the process-wide registry, so main drops
//     the other's registrations before dispatching.
//   - bin/containerd-shim-runc-v2 is a hard link, not a symlink. The shim's
//     "start" re-executes os.Executable() (/proc/self/exe, which resolves
//     symlinks) with no component name in its arguments, so only a hard link
//     brings it back to the shim. The daemon finds the shim on PATH or beside
//     its own executable.
//   - version.Version is set at link time (Makefile) so CRI reports
//     containerd://2.4.2, not the default 2.4.2+unknown.
package main
