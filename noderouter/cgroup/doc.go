// Package cgroup reads the CPU usage and memory working set of the pods on
// the router's node from their cgroups, for the per-instance cpu_millicores
// and memory_bytes of the router's reports.
//
// Hierarchies (MountsOf): from the mount table (/proc/self/mountinfo,
// parsed by github.com/moby/sys/mountinfo), each resource is read from
// the cgroup2 hierarchy when its root's cgroup.controllers lists the
// controller (cpu, memory), else from the v1 hierarchy mounted with
// cpuacct, respectively memory (hybrid hosts bind them to v1). A resource
// with neither is not read.
//
// Pod directories: the kubelet names a pod's cgroup .../pod<uid> (cgroupfs
// driver: kubepods/pod<uid>, kubepods/burstable/pod<uid>,
// kubepods/besteffort/pod<uid>) or .../kubepods-<qos>-pod<uid with _ for
// ->.slice (systemd driver). Reader finds them by a bounded breadth-first
// walk (MaxDepth levels, MaxDirs directories) below root, a path relative
// to each hierarchy's mount (--cgroup-root: "/" on a real node; the local
// cluster's "/skipper"), and caches uid → directory; a uid it does not know
// triggers at most one new walk per MinRescan.
//
// Values: CPU usage is cumulative (cgroup2 cpu.stat usage_usec, v1
// cpuacct.usage in ns); Millicores turns two samples into millicores. The
// memory working set is what the kubelet reports: usage (memory.current,
// v1 memory.usage_in_bytes) minus inactive file pages (memory.stat
// inactive_file, v1 total_inactive_file), never below zero.
//
// Parsing is pure and tested with testdata trees; Reader takes a path
// prefix so tests point it at such a tree, "" on a node.
package cgroup
