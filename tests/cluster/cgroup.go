package cluster

import (
	"errors"
	"path"
	"time"

	"skipper.dev/skipper/tests/linuxhost"
)

// Cgroups is the cluster's cgroup, /<Name> relative to the root of the
// cgroup2 hierarchy and of each v1 hierarchy of the pod controllers (cpu,
// cpuacct, memory, pids where the machine binds them to v1): the same
// relative layout in every hierarchy. Node N's cgroup is /<Name>/node<N>;
// its node agent makes the pods' cgroups under it the way the kubelet's
// cgroupfs driver names them (kubepods/<qos>/pod<uid>/<container>).
//
// Every process of the cluster runs in it, in every hierarchy: the control
// plane (etcd and the kube-* daemons) in /<Name>/control-plane, each node's
// agent and kube-proxy in the node's system leaf. Each simulated machine is
// thus one group of equal CPU weight, as if it had its own CPUs. Left in
// the root cgroup, each control-plane thread would weigh as much as all the
// pods of the cluster together, and a burst of API work (a pool refill)
// would starve the pods on the request path.
type Cgroups struct {
	Name string
	Hier []linuxhost.Hierarchy // cgroup2 first
}

// FindCgroups locates the hierarchies from /proc/mounts.
func FindCgroups(name string) (Cgroups, error) {
	hs, err := linuxhost.Hierarchies()
	if err != nil {
		return Cgroups{}, err
	}
	return Cgroups{Name: name, Hier: hs}, nil
}

// NodeRel is node n's cgroup relative to each hierarchy's root, e.g. /skipper/node1.
func (c Cgroups) NodeRel(n int) string { return path.Join("/", c.Name, NodeName(n)) }

// Node is node n's cgroup2 directory: the node agent makes its pods'
// cgroups under it, BPF programs attach there.
func (c Cgroups) Node(n int) string { return linuxhost.Dirs(c.Hier[:1], c.NodeRel(n))[0] }

// ControlPlaneRel is the control plane's cgroup relative to each
// hierarchy's root, e.g. /skipper/control-plane.
func (c Cgroups) ControlPlaneRel() string { return path.Join("/", c.Name, "control-plane") }

// SystemRel is node n's system leaf relative to each hierarchy's root.
func (c Cgroups) SystemRel(n int) string { return path.Join(c.NodeRel(n), "system") }

// Place makes spec start in the cgroup rel (relative to each hierarchy's
// root) of every hierarchy; a machine without cgroups leaves spec as is.
func (c Cgroups) Place(spec ProcSpec, rel string) ProcSpec {
	if len(c.Hier) == 0 {
		return spec
	}
	dirs := linuxhost.Dirs(c.Hier, rel)
	spec.Cgroup, spec.V1Cgroups = dirs[0], dirs[1:]
	return spec
}

// Ensure creates the control plane's cgroup and node 1..nodes' cgroups
// with their system leaves, in every hierarchy (existing ones kept).
func (c Cgroups) Ensure(nodes int) error {
	dirs := linuxhost.Dirs(c.Hier, c.ControlPlaneRel())
	for n := 1; n <= nodes; n++ {
		dirs = append(dirs, linuxhost.Dirs(c.Hier, c.SystemRel(n))...)
	}
	return linuxhost.MakeDirs(dirs)
}

// Remove kills every process in the cluster's cgroups and removes them in
// every hierarchy, deepest first. Missing ones are fine.
func (c Cgroups) Remove(timeout time.Duration) error {
	var errs []error
	for _, dir := range linuxhost.Dirs(c.Hier, path.Join("/", c.Name)) {
		errs = append(errs, linuxhost.RemoveTree(dir, timeout))
	}
	return errors.Join(errs...)
}
