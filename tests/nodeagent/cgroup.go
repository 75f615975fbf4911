package nodeagent

import (
	"errors"
	"fmt"
	"log/slog"
	"path"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/tests/linuxhost"
)

// podCgroups makes the pods' cgroups under the node's cgroup, named as the
// kubelet's cgroupfs driver names them, at the same path relative to the
// root of the cgroup2 hierarchy and of every v1 hierarchy of
// linuxhost.PodControllers. The zero value makes none.
type podCgroups struct {
	node string // the node's cgroup relative to each hierarchy's root, e.g. /skipper/node1
	hier []linuxhost.Hierarchy
	log  *slog.Logger
}

// newPodCgroups locates the hierarchies for the node cgroup dir (a cgroup2
// directory); empty dir: no pod cgroups.
func newPodCgroups(dir string, log *slog.Logger) (podCgroups, error) {
	if dir == "" {
		return podCgroups{}, nil
	}
	hs, err := linuxhost.Hierarchies()
	if err != nil {
		return podCgroups{}, fmt.Errorf("--cgroup: %w", err)
	}
	rel, err := filepath.Rel(hs[0].Mount, dir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return podCgroups{}, fmt.Errorf("--cgroup %s: not below the cgroup2 mount %s", dir, hs[0].Mount)
	}
	return podCgroups{node: "/" + filepath.ToSlash(rel), hier: hs, log: log}, nil
}

// PodCgroupPath is a pod's cgroup relative to its node's cgroup, as the
// kubelet's cgroupfs driver names it: kubepods/pod<uid> for Guaranteed
// pods, kubepods/burstable/pod<uid> and kubepods/besteffort/pod<uid> for the
// others (a pod without a QoS class yet counts as BestEffort).
func PodCgroupPath(qos corev1.PodQOSClass, uid types.UID) string {
	switch qos {
	case corev1.PodQOSGuaranteed:
		return path.Join("kubepods", "pod"+string(uid))
	case corev1.PodQOSBurstable:
		return path.Join("kubepods", "burstable", "pod"+string(uid))
	}
	return path.Join("kubepods", "besteffort", "pod"+string(uid))
}

func (c podCgroups) enabled() bool { return c.node != "" }

func (c podCgroups) podDirs(pod *corev1.Pod) []string {
	return linuxhost.Dirs(c.hier, path.Join(c.node, PodCgroupPath(pod.Status.QOSClass, pod.UID)))
}

// EnsureContainer creates the container's cgroup in every hierarchy and
// returns their directories (none when disabled).
func (c podCgroups) EnsureContainer(pod *corev1.Pod, container string) ([]string, error) {
	if !c.enabled() {
		return nil, nil
	}
	var dirs []string
	for _, d := range c.podDirs(pod) {
		dirs = append(dirs, filepath.Join(d, container))
	}
	if err := linuxhost.MakeDirs(dirs); err != nil {
		return nil, err
	}
	// Where cgroup2 holds the controllers (a pure v2 machine), the pod's
	// cgroup gets cpu.stat, memory.current and pids.current of its own.
	rel := path.Join(c.node, PodCgroupPath(pod.Status.QOSClass, pod.UID), container)
	// Failing that (the node's cgroup holds processes), the pod still runs,
	// accounted only in its ancestors.
	if err := linuxhost.EnableControllers(c.hier[0].Mount, rel, linuxhost.PodControllers); err != nil {
		c.log.Warn("pod cgroup without controllers of its own", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
	return dirs, nil
}

// RemovePod removes the pod's cgroups in every hierarchy, killing what is
// left in them. Missing ones are fine.
func (c podCgroups) RemovePod(pod *corev1.Pod, timeout time.Duration) error {
	if !c.enabled() {
		return nil
	}
	var errs []error
	for _, d := range c.podDirs(pod) {
		errs = append(errs, linuxhost.RemoveTree(d, timeout))
	}
	return errors.Join(errs...)
}

// Flush removes the node's whole kubepods tree in every hierarchy (what a
// previous agent run left, or what is left once every pod stopped).
func (c podCgroups) Flush(timeout time.Duration) error {
	if !c.enabled() {
		return nil
	}
	var errs []error
	for _, d := range linuxhost.Dirs(c.hier, path.Join(c.node, "kubepods")) {
		errs = append(errs, linuxhost.RemoveTree(d, timeout))
	}
	return errors.Join(errs...)
}
