package attach

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"skipper.dev/skipper/tests/cluster"
)

// PodNetns is the path of p's network namespace on the local cluster: that
// of its first running container's process. Valid while it runs.
func PodNetns(p *corev1.Pod) (string, error) {
	var errs []string
	for _, c := range p.Spec.Containers {
		pid, err := cluster.ContainerPid(p, c.Name)
		if err == nil {
			return fmt.Sprintf("/proc/%d/ns/net", pid), nil
		}
		errs = append(errs, err.Error())
	}
	return "", fmt.Errorf("pod %s: no running container: %s", p.Name, strings.Join(errs, "; "))
}
