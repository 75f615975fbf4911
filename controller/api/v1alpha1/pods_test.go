package v1alpha1

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestAssignPort(t *testing.T) {
	t.Parallel()
	agent := corev1.Container{Name: "skipper-agent", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9000}, {Name: AssignPortName, ContainerPort: 7070}}}
	app := corev1.Container{Name: "app", Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}
	for _, tc := range []struct {
		name    string
		spec    corev1.PodSpec
		want    int32
		sidecar bool
	}{
		{"the instance serves it itself", corev1.PodSpec{Containers: []corev1.Container{app}}, 8080, false},
		{"a native sidecar serves it", corev1.PodSpec{InitContainers: []corev1.Container{agent}, Containers: []corev1.Container{app}}, 7070, true},
		{"a plain sidecar serves it", corev1.PodSpec{Containers: []corev1.Container{app, agent}}, 7070, true},
		{"a plain sidecar listed first", corev1.PodSpec{Containers: []corev1.Container{agent, app}}, 7070, true},
	} {
		p := &corev1.Pod{Spec: tc.spec}
		if got := FirstPort(&p.Spec); got != 8080 {
			t.Errorf("%s: FirstPort %d, want the application's 8080", tc.name, got)
		}
		if got := AssignPort(p, 8080); got != tc.want || SidecarAssigns(p) != tc.sidecar {
			t.Errorf("%s: AssignPort %d, SidecarAssigns %v; want %d, %v", tc.name, got, SidecarAssigns(p), tc.want, tc.sidecar)
		}
	}
}
