package cluster

import (
	"errors"
	"path"
	"path/filepath"
	"time"

	"skipper.dev/skipper/tests/linuxhost"
)

// Cgroups is the cluster's cgroup, /<Name> relative to the root of the
// cgroup2 hierarchy and of each v1 hierarchy of the pod controllers (cpu,
// cpuacct, memory, pids where the machine binds them to v1): the same
// relative layout in every hierarchy. Node N's cgroup is /<Name>/node<N>;
// its node agent makes the pods' cgroups under it the way the kubelet's
// cgroupfs driver names them (kubepods/<qos>/pod<uid>/<container>).
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

// System is the cgroup2 leaf under node n's cgroup where its node agent and
// kube-proxy run (the kubelet's system.slice): the node's cgroup itself
// holds no process, so cgroup2 lets it hand controllers down to the pods'.
func (c Cgroups) System(n int) string { return filepath.Join(c.Node(n), "system") }

// Ensure creates node 1..nodes' cgroups in every hierarchy and their
// system leaves (existing ones kept).
func (c Cgroups) Ensure(nodes int) error {
	for n := 1; n <= nodes; n++ {
		if err := linuxhost.MakeDirs(append(linuxhost.Dirs(c.Hier, c.NodeRel(n)), c.System(n))); err != nil {
			return err
		}
	}
	return nil
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
