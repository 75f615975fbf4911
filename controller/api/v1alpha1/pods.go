package v1alpha1

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// PodReady reports whether a pod can serve: Running, Ready, not
// terminating, with an IP.
func PodReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// FirstPort is the first port the first container of spec declares (the
// instance port of a Function that sets none), 0 for none. A container
// serving the contract (a port named AssignPortName: the agent, when it
// runs as a plain container) is passed over: calls go to the
// application.
func FirstPort(spec *corev1.PodSpec) int32 {
	for _, c := range spec.Containers {
		if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == AssignPortName }) {
			continue
		}
		for _, p := range c.Ports {
			if p.ContainerPort > 0 {
				return p.ContainerPort
			}
		}
		break // only the first container's ports count
	}
	return 0
}

// WarmPoolPodPort returns the port p's instance listens on by default
// (FirstPort: a Function's own port, when it sets one, may differ) when p
// is a warm pool pod, one a claim may take: labelled with a pool and not
// with a function, and PodReady. What controllers and routers keep a
// connection open to ahead of a claim.
func WarmPoolPodPort(p *corev1.Pod) (int32, bool) {
	if p.Labels[LabelPool] == "" || !PodReady(p) {
		return 0, false
	}
	if _, claimed := p.Labels[LabelFunction]; claimed {
		return 0, false
	}
	port := FirstPort(&p.Spec)
	return port, port > 0
}

// AssignPortName names the container port of a sidecar serving the assign
// endpoint beside the application (skipper-agent, a native sidecar: an
// init container that keeps running).
const AssignPortName = "skipper-assign"

// SidecarAssigns reports whether a sidecar of p serves its assign endpoint
// (a port named AssignPortName, in a container or an init container): the
// application's own port then does not.
func SidecarAssigns(p *corev1.Pod) bool {
	_, ok := sidecarAssignPort(p)
	return ok
}

// AssignPort is the port of p's assign endpoint (the contract's POST and
// GET): its sidecar's port named AssignPortName, else the instance's own
// port instancePort.
func AssignPort(p *corev1.Pod, instancePort int32) int32 {
	if port, ok := sidecarAssignPort(p); ok {
		return port
	}
	return instancePort
}

func sidecarAssignPort(p *corev1.Pod) (int32, bool) {
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range cs {
			for _, cp := range c.Ports {
				if cp.Name == AssignPortName {
					return cp.ContainerPort, true
				}
			}
		}
	}
	return 0, false
}
