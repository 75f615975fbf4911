package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"skipper.dev/skipper/cmd/skipper-echo/echo"
	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/tests/cluster"
	"skipper.dev/skipper/tests/linuxhost"
)

// nodeNumber is N of a node named node<N>.
func nodeNumber(t *testing.T, name string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimPrefix(name, "node"))
	if err != nil || cluster.NodeName(n) != name {
		t.Fatalf("node %q is not one of the local cluster's", name)
	}
	return n
}

// containerPid is the host pid of a running container.
func containerPid(t *testing.T, p *corev1.Pod, container string) int {
	t.Helper()
	pid, err := cluster.ContainerPid(p, container)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// sameNetns reports whether pid runs in the network namespace at nsPath.
func sameNetns(t *testing.T, pid int, nsPath string) bool {
	t.Helper()
	a, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.Stat(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(a, b)
}

// inPodNetns runs a command in pid's network namespace (the pod's).
func inPodNetns(pid int, args ...string) (string, error) {
	out, err := exec.Command("nsenter", append([]string{"-t", strconv.Itoa(pid), "-n", "--"}, args...)...).CombinedOutput()
	return string(out), err
}

// TestPodIsolation: Skipper's own pods run isolated as on a kubelet: the
// controllers (Burstable) each in a network namespace of their own, the
// routers (hostNetwork) in their node's, and every container in its
// kubelet-named pod cgroup in each hierarchy. TestCallerPodOnNode2 checks
// the same of BestEffort pods.
func TestPodIsolation(t *testing.T) {
	pods, err := env.kube.CoreV1().Pods("skipper-system").List(context.Background(), metav1.ListOptions{FieldSelector: "status.phase=Running"})
	if err != nil {
		t.Fatal(err)
	}
	hostNet, own := 0, 0
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		if p.Spec.HostNetwork {
			hostNet++
		} else {
			own++
		}
		t.Run(p.Name, func(t *testing.T) { checkPodIsolation(t, p) })
	}
	if hostNet == 0 || own == 0 {
		t.Fatalf("checked %d hostNetwork pods and %d pods with their own netns in skipper-system: want routers and controllers", hostNet, own)
	}
}

// checkPodIsolation checks a running pod: a pod that does not ask for the
// host's network has a network namespace of its own holding its IP on eth0
// (the node's links do not hold it), a hostNetwork pod runs in its node's;
// its first container runs in <node cgroup>/kubepods/<qos>/pod<uid>/<name>
// in every cgroup hierarchy, as the kubelet's cgroupfs driver names pod
// cgroups.
func checkPodIsolation(t *testing.T, p *corev1.Pod) {
	t.Helper()
	hs, err := linuxhost.Hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	n := nodeNumber(t, p.Spec.NodeName)
	node := cluster.DefaultTopology().Netns(n)
	c := p.Spec.Containers[0].Name
	pid := containerPid(t, p, c)
	if p.Spec.HostNetwork {
		if !sameNetns(t, pid, linuxhost.NetnsPath(node)) {
			t.Errorf("hostNetwork pod %s runs outside its node's netns %s", p.Name, node)
		}
	} else {
		if sameNetns(t, pid, linuxhost.NetnsPath(node)) {
			t.Errorf("pod %s shares its node's netns %s", p.Name, node)
		}
		out, err := inPodNetns(pid, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		if err != nil || !strings.Contains(out, " "+p.Status.PodIP+"/") {
			t.Errorf("pod %s: eth0 in its netns does not hold %s (%v):\n%s", p.Name, p.Status.PodIP, err, out)
		}
		out2, err := exec.Command("ip", "-netns", node, "-4", "-o", "addr", "show").CombinedOutput()
		if err != nil || strings.Contains(string(out2), " "+p.Status.PodIP+"/") {
			t.Errorf("pod %s: its IP %s is on a link of %s (%v):\n%s", p.Name, p.Status.PodIP, node, err, out2)
		}
	}

	want := path.Join("/", cluster.DefaultCgroupName, cluster.NodeName(n), cluster.PodCgroup(p.Status.QOSClass, p.UID), containerID(t, p, c))
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		found := false
		for line := range strings.Lines(string(data)) {
			// hierarchy-ID:controllers:path; cgroup2's is 0::path
			f := strings.SplitN(strings.TrimSpace(line), ":", 3)
			if len(f) == 3 && f[2] == want && (h.V2() && f[0] == "0" || !h.V2() && slices.Equal(strings.Split(f[1], ","), h.Controllers)) {
				found = true
			}
		}
		if !found {
			t.Errorf("pod %s: container %s not in %s of hierarchy %s %v; /proc/%d/cgroup:\n%s", p.Name, c, want, h.Mount, h.Controllers, pid, data)
		}
	}
}

// containerID is a running container's ID without its runtime's prefix
// (containerd://): the name of its cgroup below the pod's.
func containerID(t *testing.T, p *corev1.Pod, container string) string {
	t.Helper()
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container {
			if _, id, ok := strings.Cut(cs.ContainerID, "://"); ok {
				return id
			}
		}
	}
	t.Fatalf("pod %s: container %s has no ID", p.Name, container)
	return ""
}

// echoPod is a plain skipper-echo pod bound to node.
func echoPod(name, node string, labels map[string]string) *corev1.Pod {
	field := func(p string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: p}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels,
			Annotations: map[string]string{v1alpha1.AnnotationContract: v1alpha1.ContractSelf}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers: []corev1.Container{{
				Name:    "echo",
				Image:   env.image,
				Command: []string{"/skipper-echo"},
				Args:    []string{"--listen=$(POD_IP):8080"},
				Env: []corev1.EnvVar{
					{Name: "POD_IP", ValueFrom: field("status.podIP")},
					{Name: "POD_UID", ValueFrom: field("metadata.uid")},
					{Name: "POD_NAME", ValueFrom: field("metadata.name")},
				},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}},
			}},
		},
	}
}

// createPods creates pods, deletes them at cleanup, and returns them once
// all are Ready.
func createPods(t *testing.T, pods ...*corev1.Pod) map[string]*corev1.Pod {
	t.Helper()
	ctx := context.Background()
	api := env.kube.CoreV1().Pods("default")
	for _, p := range pods {
		if err := api.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err == nil {
			poll.Until(t, 30*time.Second, pollInterval, "leftover pod "+p.Name+" gone", func(ctx context.Context) error {
				if _, err := api.Get(ctx, p.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("still there (%v)", err)
				}
				return nil
			})
		}
		if _, err := api.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s: %v", p.Name, err)
		}
		t.Cleanup(func() {
			_ = api.Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		})
	}
	ready := map[string]*corev1.Pod{}
	poll.Until(t, 60*time.Second, pollInterval, "test pods Ready", func(ctx context.Context) error {
		for _, p := range pods {
			got, err := api.Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !podReady(*got) {
				return fmt.Errorf("pod %s not Ready: %s", p.Name, got.Status.Phase)
			}
			ready[p.Name] = got
		}
		return nil
	})
	return ready
}

// curlFrom calls url from inside pid's network namespace and returns the
// status code and body.
func curlFrom(pid int, url string, headers ...string) (int, string, error) {
	args := []string{"curl", "-sS", "--max-time", "10", "-w", "\n%{http_code}"}
	for _, h := range headers {
		args = append(args, "-H", h)
	}
	out, err := inPodNetns(pid, append(args, url)...)
	if err != nil {
		return 0, "", fmt.Errorf("curl %s: %v: %s", url, err, out)
	}
	i := strings.LastIndexByte(out, '\n')
	code, err := strconv.Atoi(strings.TrimSpace(out[i+1:]))
	if err != nil {
		return 0, "", fmt.Errorf("curl %s: no status in %q", url, out)
	}
	return code, out[:i], nil
}

// TestCallerPodOnNode2: a pod on node 2, in its own network namespace,
// reaches the function through the skipper Service's ClusterIP (kube-proxy
// sends it to node 2's own router: trafficDistribution PreferSameNode) and
// through the node-local address, and reaches pods on both nodes through
// another Service's ClusterIP, the one on its own bridge included.
func TestCallerPodOnNode2(t *testing.T) {
	ctx := context.Background()
	backend := map[string]string{"app": "e2e-nodes-backend"}
	pods := createPods(t,
		echoPod("e2e-nodes-caller", "node2", nil),
		echoPod("e2e-nodes-backend-1", "node1", backend),
		echoPod("e2e-nodes-backend-2", "node2", backend),
	)
	caller := containerPid(t, pods["e2e-nodes-caller"], "echo")
	for _, p := range pods {
		checkPodIsolation(t, p)
	}

	t.Run("function through the skipper Service", func(t *testing.T) {
		svc, err := env.kube.CoreV1().Services("skipper-system").Get(ctx, "skipper", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node2Metrics := fmt.Sprintf("http://%s:8381/metrics", cluster.DefaultTopology().NodeIP(2))
		served := func() float64 {
			return counterSum(t, node2Metrics, "skipper_noderouter_requests_total", map[string]string{"function": "default/echo"})
		}
		before := served()
		code, body, err := curlFrom(caller, "http://"+svc.Spec.ClusterIP+"/from-node2", "x-skipper-function: default/echo")
		if err != nil {
			t.Fatal(err)
		}
		var got echo.Response
		if code != 200 || json.Unmarshal([]byte(body), &got) != nil || got.Function != "default/echo" || got.Path != "/from-node2" {
			t.Fatalf("call through %s: %d %s", svc.Spec.ClusterIP, code, body)
		}
		// The router counts a request once it has answered it.
		poll.Until(t, 5*time.Second, pollInterval, "node 2's router counts the call", func(context.Context) error {
			if after := served(); after <= before {
				return fmt.Errorf("node 2's router counted %v requests for default/echo before and %v after: the call did not stay on node 2", before, after)
			}
			return nil
		})
	})

	t.Run("function through the node-local address", func(t *testing.T) {
		// 169.254.20.20 lives on node 2's lo: the pod's default route via
		// its bridge delivers it to node 2's router.
		code, body, err := curlFrom(caller, "http://169.254.20.20/node-local", "x-skipper-function: default/echo")
		if err != nil {
			t.Fatal(err)
		}
		var got echo.Response
		if code != 200 || json.Unmarshal([]byte(body), &got) != nil || got.Function != "default/echo" {
			t.Fatalf("call through 169.254.20.20: %d %s", code, body)
		}
	})

	t.Run("pods through a Service ClusterIP", func(t *testing.T) {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-nodes-backend", Namespace: "default"},
			Spec: corev1.ServiceSpec{Selector: backend, Ports: []corev1.ServicePort{
				{Port: 80, TargetPort: intstr.FromString("http")}}},
		}
		api := env.kube.CoreV1().Services("default")
		_ = api.Delete(ctx, svc.Name, metav1.DeleteOptions{})
		svc, err := api.Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = api.Delete(context.Background(), svc.Name, metav1.DeleteOptions{}) })
		seen := map[string]bool{}
		poll.Until(t, 30*time.Second, pollInterval, "both backends answer through "+svc.Spec.ClusterIP, func(ctx context.Context) error {
			code, body, err := curlFrom(caller, "http://"+svc.Spec.ClusterIP+"/pod-to-pod")
			if err != nil {
				return err
			}
			var got echo.Response
			if code != 200 || json.NewDecoder(bytes.NewBufferString(body)).Decode(&got) != nil {
				return fmt.Errorf("%d %s", code, body)
			}
			seen[got.Pod.Name] = true
			if !seen["e2e-nodes-backend-1"] || !seen["e2e-nodes-backend-2"] {
				return fmt.Errorf("answered by %v so far", seen)
			}
			return nil
		})
	})
}

// TestContainerRestartKeepsPodSandbox: a container killed by SIGKILL is
// restarted (restartPolicy Always) in the same pod network namespace, with
// the same IP and in the same cgroup, as the kubelet restarts containers
// inside their pod sandbox.
func TestContainerRestartKeepsPodSandbox(t *testing.T) {
	pod := createPods(t, echoPod("e2e-nodes-restart", "node1", nil))["e2e-nodes-restart"]
	pid := containerPid(t, pod, "echo")
	netns, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var restarted *corev1.Pod
	poll.Until(t, 45*time.Second, pollInterval, "container restarted and Ready", func(ctx context.Context) error {
		p, err := env.kube.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cs := p.Status.ContainerStatuses; len(cs) == 0 || cs[0].RestartCount < 1 || !podReady(*p) {
			return fmt.Errorf("not restarted and Ready yet: %+v", p.Status.ContainerStatuses)
		}
		restarted = p
		return nil
	})
	newPid := containerPid(t, restarted, "echo")
	if newPid == pid {
		t.Fatalf("container pid %d unchanged after SIGKILL", pid)
	}
	if restarted.Status.PodIP != pod.Status.PodIP {
		t.Errorf("pod IP %s became %s across the restart", pod.Status.PodIP, restarted.Status.PodIP)
	}
	now, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", newPid))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(netns, now) {
		t.Errorf("restarted container runs in another network namespace than before")
	}
	checkPodIsolation(t, restarted)
}
