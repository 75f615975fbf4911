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

// Node is node n's cgroup2 directory (the agent runs there; BPF attaches there).
func (c Cgroups) Node(n int) string { return linuxhost.Dirs(c.Hier[:1], c.NodeRel(n))[0] }

// Ensure creates node 1..nodes' cgroups in every hierarchy (existing ones kept).
func (c Cgroups) Ensure(nodes int) error {
	for n := 1; n <= nodes; n++ {
		if err := linuxhost.MakeDirs(linuxhost.Dirs(c.Hier, c.NodeRel(n))); err != nil {
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
