package cluster

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"skipper.dev/skipper/tests/linuxhost"
)

// Cgroups is the cluster's cgroup, /<Name> relative to the root of the
// cgroup2 hierarchy and of each v1 hierarchy of the pod controllers (cpu,
// cpuacct, memory, pids where the machine binds them to v1): the same
// relative layout in every hierarchy (a node's own cgroup exists in
// every v1 hierarchy too: Ensure, All). Node N's
// cgroup is /<Name>/node<N>;
// its kubelet (cgroupfs driver, cgroupRoot) makes the pods' cgroups under
// it (kubepods/<qos>/pod<uid>) and runc each container's
// (.../<container ID>).
//
// Every process of the cluster runs in it, in every hierarchy: the control
// plane (etcd and the kube-* daemons) in /<Name>/control-plane, each node's
// process (with its containerd and kubelet) and kube-proxy in the node's
// system leaf. Each simulated machine is
// thus one CPU group, standing in for machines of their own: left in the
// root cgroup, each control-plane thread would weigh as much as all the
// pods of the cluster together. The control plane weighs a quarter of a
// node (ControlPlaneCPUShares): on a real cluster the API server's bursts
// (a pool refill: a release, a create, a binding, status writes and their
// watch fan-out) run on the control plane's own CPUs and never delay a
// node's pods; here they share the machine's cores, and at equal weight
// they held a woken pod off the CPU for up to 50 ms. Idle nodes leave the
// control plane every cycle it wants: the weight only matters when both
// are runnable.
type Cgroups struct {
	Name string
	Hier []linuxhost.Hierarchy // cgroup2 first
	// All is every mounted hierarchy, cgroup2 first: a real kubelet and
	// runc make each pod's and container's cgroup in every v1 hierarchy
	// (devices, freezer, name=systemd, ...), so nodes are made and the
	// cluster removed in all of them.
	All []linuxhost.Hierarchy
}

// FindCgroups locates the hierarchies from the mount table (linuxhost).
func FindCgroups(name string) (Cgroups, error) {
	hs, err := linuxhost.Hierarchies()
	if err != nil {
		return Cgroups{}, err
	}
	all, err := linuxhost.AllHierarchies()
	if err != nil {
		return Cgroups{}, err
	}
	return Cgroups{Name: name, Hier: hs, All: all}, nil
}

// allDirs is the cgroup rel in every mounted hierarchy.
func (c Cgroups) allDirs(rel string) []string { return linuxhost.Dirs(c.All, rel) }

// NodeRel is node n's cgroup relative to each hierarchy's root, e.g. /skipper/node1.
func (c Cgroups) NodeRel(n int) string { return path.Join("/", c.Name, NodeName(n)) }

// Node is node n's cgroup2 directory: the kubelet makes its pods'
// cgroups under it, BPF programs attach there.
func (c Cgroups) Node(n int) string { return linuxhost.Dirs(c.Hier[:1], c.NodeRel(n))[0] }

// ControlPlaneCPUShares is the control plane's CPU weight in cgroup v1
// cpu.shares units, against 1024 (the default) for each node; cgroup2's
// cpu.weight gets the same ratio (25 against 100).
const ControlPlaneCPUShares = 256

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
// with their system leaves, in every hierarchy (existing ones kept). A
// node's cgroup exists in every mounted hierarchy, not only the pod
// controllers': the kubelet refuses a cgroupRoot missing from one it
// checks, and a v1 cpuset cgroup starts with no CPU and no memory node, so
// the cluster's and each node's are given their parent's.
func (c Cgroups) Ensure(nodes int) error {
	dirs := linuxhost.Dirs(c.Hier, c.ControlPlaneRel())
	for n := 1; n <= nodes; n++ {
		dirs = append(dirs, linuxhost.Dirs(c.Hier, c.SystemRel(n))...)
		dirs = append(dirs, c.allDirs(c.NodeRel(n))...)
	}
	if err := linuxhost.MakeDirs(dirs); err != nil {
		return err
	}
	for _, h := range c.All {
		if !slices.Contains(h.Controllers, "cpuset") {
			continue
		}
		for n := 1; n <= nodes; n++ {
			if err := linuxhost.InheritCpuset(h.Mount, c.NodeRel(n)); err != nil {
				return err
			}
		}
	}
	return c.weighControlPlane()
}

// weighControlPlane sets the control plane's CPU weight wherever the cpu
// controller is: a v1 hierarchy's cpu.shares, or cgroup2's cpu.weight when
// the machine offers cpu there.
func (c Cgroups) weighControlPlane() error {
	rel := c.ControlPlaneRel()
	for _, h := range c.Hier {
		dir := filepath.Join(h.Mount, rel)
		switch {
		case h.V2():
			if err := linuxhost.EnableControllers(h.Mount, rel, []string{"cpu"}); err != nil {
				return err
			}
			f := filepath.Join(dir, "cpu.weight")
			if _, err := os.Stat(f); err != nil {
				continue // cpu not offered in cgroup2 here
			}
			if err := os.WriteFile(f, []byte(strconv.Itoa(ControlPlaneCPUShares*100/1024)), 0o644); err != nil {
				return fmt.Errorf("control plane cpu.weight: %w", err)
			}
		case slices.Contains(h.Controllers, "cpu"):
			if err := os.WriteFile(filepath.Join(dir, "cpu.shares"), []byte(strconv.Itoa(ControlPlaneCPUShares)), 0o644); err != nil {
				return fmt.Errorf("control plane cpu.shares: %w", err)
			}
		}
	}
	return nil
}

// Remove kills every process in the cluster's cgroups and removes them in
// every hierarchy, deepest first. Missing ones are fine.
func (c Cgroups) Remove(timeout time.Duration) error {
	var errs []error
	hs := c.All
	if len(hs) == 0 {
		hs = c.Hier
	}
	for _, dir := range linuxhost.Dirs(hs, path.Join("/", c.Name)) {
		errs = append(errs, linuxhost.RemoveTree(dir, timeout))
	}
	return errors.Join(errs...)
}
