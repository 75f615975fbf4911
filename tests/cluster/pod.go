package cluster

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/tests/linuxhost"
)

// ContainerPid is the host pid of a running container of p on the local
// cluster: its init (pid 1 in its own pid namespace; exec probes and the
// like join the same cgroup) in its cgroup, which the kubelet's cgroupfs
// driver and runc name <cluster cgroup>/<node>/kubepods[/<qos>]/pod<uid>/<container ID>
// (read in the cgroup2 hierarchy, where runc places it too).
func ContainerPid(p *corev1.Pod, container string) (int, error) {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != container || cs.State.Running == nil {
			continue
		}
		_, id, ok := strings.Cut(cs.ContainerID, "://")
		if !ok || id == "" {
			return 0, fmt.Errorf("pod %s container %s: container ID %q has no runtime prefix", p.Name, container, cs.ContainerID)
		}
		mount, err := linuxhost.Cgroup2Mount()
		if err != nil {
			return 0, err
		}
		dir := filepath.Join(mount, DefaultCgroupName, p.Spec.NodeName, PodCgroup(p.Status.QOSClass, p.UID), id)
		data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			return 0, fmt.Errorf("pod %s container %s: %w", p.Name, container, err)
		}
		if pid := containerInit(strings.Fields(string(data))); pid > 0 {
			return pid, nil
		}
		return 0, fmt.Errorf("pod %s container %s: no process in %s", p.Name, container, dir)
	}
	return 0, fmt.Errorf("pod %s: container %s is not running", p.Name, container)
}

// PodCgroup is a pod's cgroup relative to its node's, as the kubelet's
// cgroupfs driver names it: kubepods[/<qos>]/pod<uid>.
func PodCgroup(qos corev1.PodQOSClass, uid types.UID) string {
	switch qos {
	case corev1.PodQOSGuaranteed:
		return path.Join("kubepods", "pod"+string(uid))
	case corev1.PodQOSBurstable:
		return path.Join("kubepods", "burstable", "pod"+string(uid))
	}
	return path.Join("kubepods", "besteffort", "pod"+string(uid))
}

// containerInit is, of the pids in a container's cgroup, the container's
// init: the one that is pid 1 in its innermost pid namespace (NSpid in
// /proc/<pid>/status). Where none is (a pod sharing its pid namespace,
// whose init is the sandbox's), the first that lives.
func containerInit(pids []string) int {
	first := 0
	for _, f := range pids {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue // exited meanwhile
		}
		if first == 0 {
			first = pid
		}
		for _, line := range strings.Split(string(data), "\n") {
			if ns, ok := strings.CutPrefix(line, "NSpid:"); ok {
				if f := strings.Fields(ns); len(f) > 1 && f[len(f)-1] == "1" {
					return pid
				}
			}
		}
	}
	return first
}
