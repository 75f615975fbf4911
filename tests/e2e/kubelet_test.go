package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/tests/cluster"
)

// What only a real kubelet does: init containers, native sidecars, an
// emptyDir shared by containers, exec probes, restarts of a container
// killed behind the kubelet's back, and the cluster's DNS.

// testPodContainer is a container of the e2e tests' pod image running
// /testpod with args.
func testPodContainer(name string, args ...string) corev1.Container {
	return corev1.Container{Name: name, Image: env.testPodImage, Args: args}
}

// TestInitContainerSidecarEmptyDir: an init container and a native sidecar
// (an init container with restartPolicy Always, its start gated by an exec
// startup probe) each write a file to an emptyDir; the main container,
// started only after both, reads the two and writes what it read to the
// same volume. The test reads the main container's copy through its
// mount namespace.
func TestInitContainerSidecarEmptyDir(t *testing.T) {
	shared := corev1.VolumeMount{Name: "shared", MountPath: "/shared"}
	initC := testPodContainer("init", "write", "/shared/init", "from-init")
	sidecar := testPodContainer("sidecar", "sidecar", "/shared/sidecar", "from-sidecar")
	sidecar.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	sidecar.StartupProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/testpod", "exists", "/shared/sidecar"}}},
		PeriodSeconds: 1, FailureThreshold: 30,
	}
	main := testPodContainer("main", "gather", "/shared/main", "/shared/init", "/shared/sidecar")
	main.ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/testpod", "exists", "/shared/main"}}},
		PeriodSeconds: 1,
	}
	for _, c := range []*corev1.Container{&initC, &sidecar, &main} {
		c.VolumeMounts = []corev1.VolumeMount{shared}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-kubelet-sidecar", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                      "node2",
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			InitContainers:                []corev1.Container{initC, sidecar},
			Containers:                    []corev1.Container{main},
			Volumes:                       []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
	p := createPods(t, pod)[pod.Name]

	got, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/shared/main", containerPid(t, p, "main")))
	if err != nil {
		t.Fatalf("read the main container's /shared/main: %v", err)
	}
	if want := "from-init\nfrom-sidecar\n"; string(got) != want {
		t.Errorf("main container read %q from the emptyDir, want %q", got, want)
	}
	states := map[string]string{}
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		switch {
		case cs.State.Terminated != nil:
			states[cs.Name] = fmt.Sprintf("exited %d", cs.State.Terminated.ExitCode)
		case cs.State.Running != nil:
			states[cs.Name] = fmt.Sprintf("running, %d restarts", cs.RestartCount)
		default:
			states[cs.Name] = "waiting"
		}
	}
	want := map[string]string{"init": "exited 0", "sidecar": "running, 0 restarts", "main": "running, 0 restarts"}
	if fmt.Sprint(states) != fmt.Sprint(want) {
		t.Errorf("container states %v, want %v", states, want)
	}
}

// runcKill kills a pod's container with runc, behind the kubelet's back,
// as an OOM kill or a crash would end it.
func runcKill(t *testing.T, p *corev1.Pod, container string) {
	t.Helper()
	root := cluster.State{Dir: filepath.Join(env.root, ".skipper")}.RuncRoot(nodeNumber(t, p.Spec.NodeName))
	id := containerID(t, p, container)
	if out, err := exec.Command("runc", "--root", root, "kill", id, "KILL").CombinedOutput(); err != nil {
		t.Fatalf("runc --root %s kill %s KILL: %v\n%s", root, id, err, out)
	}
}

// TestRuncKilledContainerRestarted: a container killed with runc kill is
// restarted by the kubelet, in the same sandbox.
func TestRuncKilledContainerRestarted(t *testing.T) {
	pod := createPods(t, echoPod("e2e-kubelet-runc-kill", "node2", nil))["e2e-kubelet-runc-kill"]
	before := containerID(t, pod, "echo")
	runcKill(t, pod, "echo")
	poll.Until(t, 60*time.Second, pollInterval, "the container restarted and Ready", func(ctx context.Context) error {
		p, err := env.kube.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cs := p.Status.ContainerStatuses; len(cs) == 0 || cs[0].RestartCount < 1 || !podReady(*p) {
			return fmt.Errorf("not restarted and Ready yet: %+v", p.Status.ContainerStatuses)
		}
		if after := containerID(t, p, "echo"); after == before {
			return fmt.Errorf("container ID still %s", before)
		}
		if p.Status.PodIP != pod.Status.PodIP {
			t.Errorf("pod IP %s became %s across the restart", pod.Status.PodIP, p.Status.PodIP)
		}
		return nil
	})
}

// TestClaimedInstanceRetiredOnRestart: the container of a claimed
// instance, killed with runc kill, is restarted by the kubelet; the new
// process holds no assignment, so the controller retires the instance
// (an InstanceRetired Event, the pod deleted) and the function's next
// call is served by another.
func TestClaimedInstanceRetiredOnRestart(t *testing.T) {
	const fn = "retire-on-restart"
	createFunction(t, fn, map[string]any{"idleTimeout": "5m"})
	ref := "default/" + fn
	uid := firstCall(t, ref)
	// The record (the function label) follows the assign off the call's
	// path: the answering pod may not be labelled yet.
	var inst *corev1.Pod
	poll.Until(t, 30*time.Second, pollInterval, "the pod that answered labelled for "+fn, func(ctx context.Context) error {
		pods, err := env.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=" + fn})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			if string(pods.Items[i].UID) == uid {
				inst = &pods.Items[i]
				return nil
			}
		}
		return fmt.Errorf("the pod %s that answered is not (yet) an instance of %s", uid, fn)
	})
	container := inst.Spec.Containers[0].Name
	runcKill(t, inst, container)

	poll.Until(t, 60*time.Second, pollInterval, "an InstanceRetired Event for "+inst.Name, func(ctx context.Context) error {
		evs, err := env.kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
			"involvedObject.name": fn, "reason": "InstanceRetired",
		}.String()})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, inst.Name) && strings.Contains(e.Message, "restarted") {
				return nil
			}
		}
		return fmt.Errorf("%d InstanceRetired events, none for %s", len(evs.Items), inst.Name)
	})
	poll.Until(t, 60*time.Second, pollInterval, inst.Name+" deleted", func(ctx context.Context) error {
		p, err := env.kube.CoreV1().Pods("default").Get(ctx, inst.Name, metav1.GetOptions{})
		if err == nil && p.UID == inst.UID && p.DeletionTimestamp == nil {
			return fmt.Errorf("still there, restarts %d", restarts(p))
		}
		return nil
	})
	if next := firstCall(t, ref); next == uid {
		t.Errorf("the retired instance %s answered again", uid)
	}
}

// TestPodResolvesService: a pod resolves a Service's name through the
// cluster DNS (CoreDNS, kube-dns), as on any cluster: the name is the
// Service's ClusterIP.
// runTestPod runs a pod of container on node in default until it succeeds
// (restarted on failure, for 90 s at most) and returns its termination
// message.
func runTestPod(t *testing.T, name, node string, container corev1.Container) string {
	t.Helper()
	api := env.kube.CoreV1().Pods("default")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyOnFailure,
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers:                    []corev1.Container{container},
		},
	}
	_ = api.Delete(t.Context(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	poll.Until(t, 30*time.Second, pollInterval, "no leftover "+pod.Name, func(ctx context.Context) error {
		_, err := api.Create(ctx, pod, metav1.CreateOptions{})
		return err
	})
	t.Cleanup(func() {
		_ = api.Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	})
	var msg string
	poll.Until(t, 90*time.Second, pollInterval, pod.Name+" succeeded", func(ctx context.Context) error {
		p, err := api.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodSucceeded {
			last := ""
			if cs := p.Status.ContainerStatuses; len(cs) > 0 && cs[0].LastTerminationState.Terminated != nil {
				last = cs[0].LastTerminationState.Terminated.Message
			}
			return fmt.Errorf("phase %s, last try: %q", p.Status.Phase, last)
		}
		msg = p.Status.ContainerStatuses[0].State.Terminated.Message
		return nil
	})
	return msg
}

func TestPodResolvesService(t *testing.T) {
	const name = "skipper.skipper-system.svc.cluster.local"
	svc, err := env.kube.CoreV1().Services("skipper-system").Get(t.Context(), "skipper", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := runTestPod(t, "e2e-kubelet-dns", "node1", testPodContainer("resolve", "resolve", name))
	if got != svc.Spec.ClusterIP {
		t.Errorf("%s resolved to %q in a pod, want the ClusterIP %s", name, got, svc.Spec.ClusterIP)
	}
}
