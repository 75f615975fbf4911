package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/tests/linuxhost"
)

// repoRoot is the repository root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// syncBuffer is a goroutine-safe bytes.Buffer for the ready line.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

const testManifests = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: web
          image: 198.51.100.1:5000/skipper-dev/testpod:dev
          args: ["serve", "$(POD_IP):8080"]
          env:
            - name: POD_IP
              valueFrom: {fieldRef: {fieldPath: status.podIP}}
            - name: GREETING
              valueFrom: {configMapKeyRef: {name: web-config, key: greeting}}
          ports:
            - {name: http, containerPort: 8080}
          readinessProbe:
            httpGet: {path: /healthz, port: http}
            periodSeconds: 1
          volumeMounts:
            - {name: cfg, mountPath: /var/run/web/cfg}
            - {name: scratch, mountPath: /run/scratch}
      volumes:
        - name: cfg
          configMap: {name: web-config}
        - name: scratch
          emptyDir: {}
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  selector: {app: web}
  ports:
    - {port: 80, targetPort: http}
---
apiVersion: v1
kind: Pod
metadata:
  name: absent
  namespace: default
spec:
  containers:
    - name: c
      image: 198.51.100.1:5000/skipper-dev/absent:dev
`

// TestClusterUpDown runs a whole local cluster on real nodes (a kubelet
// and containerd each, make image's images from the cluster's registry)
// with test manifests: Ready node with a Lease, pods Running and Ready on
// their own IPs in their own network namespaces and cgroups once their
// ConfigMap appears, in-cluster API access with the projected token, a
// Service ClusterIP through kube-proxy, an image the registry lacks
// reported, pod deletion, and a clean teardown (no container, shim,
// mount, netns or cgroup left).
func TestClusterUpDown(t *testing.T) {
	requireRoot(t)
	root := repoRoot(t)
	kube := filepath.Join(root, "bin", "kube")
	if _, err := os.Stat(kube); err != nil {
		t.Skipf("needs %s (make kube): %v", kube, err)
	}
	if live, _ := (State{Dir: filepath.Join(root, ".skipper")}).Live(); len(live) > 0 {
		t.Skipf("a local cluster runs (%s): this test needs the machine's cluster addresses", describeLive(live))
	}
	if MachineLockHeld() {
		t.Skip("another local cluster holds the machine lock")
	}
	if _, err := netlink.LinkByName(DefaultTopology().Bridge); err == nil {
		t.Skip("skipper-br0 exists: a local cluster (or its leftovers) is present; run make down")
	}

	// The node process is bin/skipper-cluster node; the images come from
	// bin/image.
	bin := filepath.Join(root, "bin")
	for _, f := range []string{"skipper-cluster", "containerd", "skipper-image", "image/index.json"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			t.Skipf("needs bin/%s (make build containerd image): %v", f, err)
		}
	}
	manifests := t.TempDir()
	if err := os.WriteFile(filepath.Join(manifests, "kustomization.yaml"), []byte("resources: [app.yaml]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(manifests, "app.yaml"), []byte(testManifests), 0o644); err != nil {
		t.Fatal(err)
	}

	state := t.TempDir()
	stdout := &syncBuffer{}
	cfg := &Config{RepoDir: root, State: State{Dir: state}, BinDir: bin, Apply: []string{manifests}, Stdout: stdout}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	cfg.Function = "" // no router here: ready once the manifests are applied
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &syncBuffer{}
	upErr := make(chan error, 1)
	begin := time.Now()
	go func() { upErr <- Up(ctx, cfg, slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), nil))) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-upErr:
			if err != nil {
				t.Errorf("up: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Errorf("up did not return after cancel")
		}
		if err := Down(cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			t.Errorf("down after up: %v", err)
		}
		checkClean(t, cfg)
	})

	poll.Until(t, 4*time.Minute, 250*time.Millisecond, "skipper: ready", func(context.Context) error {
		select {
		case err := <-upErr:
			upErr <- nil
			if errors.Is(err, ErrRunning) {
				t.Skipf("another local cluster started meanwhile: %v", err)
			}
			t.Fatalf("up returned early: %v", err)
		default:
		}
		if out := stdout.String(); !strings.HasPrefix(out, "skipper: ready") {
			return fmt.Errorf("stdout %q", out)
		}
		return nil
	})
	t.Logf("ready after %s: %s", time.Since(begin).Round(100*time.Millisecond), strings.TrimSpace(stdout.String()))
	if strings.Count(stdout.String(), "\n") != 1 {
		t.Errorf("stdout %q: want exactly one line", stdout.String())
	}
	env, err := os.ReadFile(cfg.State.EnvPath())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"KUBECONFIG", "PATH", "ROUTER_URL", "ROUTER_METRICS_URL", "CONTROLLER_METRICS_URLS"} {
		if !strings.Contains(string(env), "export "+k+"='") {
			t.Errorf("env file lacks %s:\n%s", k, env)
		}
	}

	checkProcessCgroups(t, cfg)
	for _, f := range inotifyFloors {
		b, err := os.ReadFile(filepath.Join("/proc/sys", f.key))
		if v, _ := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || v < f.floor {
			t.Errorf("%s = %q (%v) with the cluster up, want at least %d", f.key, b, err, f.floor)
		}
	}

	rc, err := clientcmd.BuildConfigFromFlags("", cfg.State.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(rc)

	// The kubelet's Lease: created once the node is registered, then
	// renewed every 10 s.
	poll.Until(t, 30*time.Second, 250*time.Millisecond, "node1's Lease renewed", func(context.Context) error {
		lease, err := cs.CoordinationV1().Leases("kube-node-lease").Get(ctx, "node1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if age := time.Since(lease.Spec.RenewTime.Time); age >= 30*time.Second {
			return fmt.Errorf("renewed %s ago", age)
		}
		return nil
	})

	// The pods wait for their ConfigMap, as under a kubelet.
	poll.Until(t, time.Minute, 250*time.Millisecond, "web pods waiting for web-config", func(context.Context) error {
		pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil || len(pods.Items) != 2 {
			return fmt.Errorf("%d pods (%v)", len(pods.Items), err)
		}
		for _, p := range pods.Items {
			if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Waiting == nil {
				return errors.New(p.Name + " not waiting")
			}
		}
		return nil
	})
	_, err = cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "web-config"}, Data: map[string]string{"greeting": "hello"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	poll.Until(t, time.Minute, 250*time.Millisecond, "web pods Running and Ready", func(context.Context) error {
		list, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		pods = list.Items
		ready := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning && podReady(&p) && p.Status.PodIP != "" {
				ready++
			}
		}
		if ready != 2 || len(pods) != 2 {
			return errors.New(podSummary(ctx, cs))
		}
		return nil
	})
	t.Logf("pods ready after %s:\n%s", time.Since(begin).Round(100*time.Millisecond), podSummary(ctx, cs))
	if pods[0].Status.PodIP == pods[1].Status.PodIP {
		t.Errorf("pods share IP %s", pods[0].Status.PodIP)
	}
	for _, p := range pods {
		n, err := strconv.Atoi(strings.TrimPrefix(p.Spec.NodeName, "node"))
		if err != nil {
			t.Fatalf("pod %s on unexpected node %q", p.Name, p.Spec.NodeName)
		}
		if cidr := DefaultTopology().PodCIDR(n); !cidr.Contains(mustAddr(t, p.Status.PodIP)) {
			t.Errorf("pod %s IP %s outside %s's pod CIDR %s", p.Name, p.Status.PodIP, p.Spec.NodeName, cidr)
		}
		cst := p.Status.ContainerStatuses[0]
		if cst.State.Running == nil || !strings.HasPrefix(cst.ContainerID, "containerd://") || !cst.Ready {
			t.Errorf("pod %s container status %+v", p.Name, cst)
		}
		checkPodIsolated(t, cfg, n, &p, true)
		// The kubelet points pods at the API server through the
		// kubernetes Service (kube-proxy's rules in the node), as on any
		// cluster.
		apiSvc, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		base := "http://" + p.Status.PodIP + ":8080"
		for path, want := range map[string]string{
			"/whoami":                              "system:serviceaccount:default:default",
			"/env?k=GREETING":                      "hello",
			"/env?k=KUBERNETES_SERVICE_HOST":       apiSvc.Spec.ClusterIP,
			"/file?path=/var/run/web/cfg/greeting": "hello",
			"/file?path=/var/run/secrets/kubernetes.io/serviceaccount/namespace": "default",
		} {
			if got := httpGet(t, base+path); got != want {
				t.Errorf("pod %s %s = %q, want %q", p.Name, path, got, want)
			}
		}
	}

	// kube-proxy: from inside the first pod's namespace the Service's
	// ClusterIP reaches both pods, the caller itself included.
	svc, err := cs.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	callerPid, err := ContainerPid(&pods[0], "web")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	poll.Until(t, 30*time.Second, 250*time.Millisecond, "both web pods through ClusterIP "+svc.Spec.ClusterIP+" from pod "+pods[0].Name, func(context.Context) error {
		out, err := exec.Command("nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", callerPid), "curl", "-sS", "--max-time", "2",
			"http://"+svc.Spec.ClusterIP+"/env?k=POD_IP").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		seen[strings.TrimSpace(string(out))] = true
		if !seen[pods[0].Status.PodIP] || !seen[pods[1].Status.PodIP] {
			return fmt.Errorf("answered by %v", seen)
		}
		return nil
	})

	poll.Until(t, 30*time.Second, 250*time.Millisecond, "the pod of an image the registry lacks failing its pull", func(context.Context) error {
		absent, err := cs.CoreV1().Pods("default").Get(ctx, "absent", metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := absent.Status.ContainerStatuses
		if len(s) != 1 || s[0].State.Waiting == nil || s[0].State.Waiting.Reason != "ErrImagePull" && s[0].State.Waiting.Reason != "ImagePullBackOff" {
			return fmt.Errorf("%+v", absent.Status)
		}
		return nil
	})

	// Deleting a pod stops it and removes it for good; the ReplicaSet replaces it.
	victim := pods[0]
	victimNetns, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", callerPid))
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Pods("default").Delete(ctx, victim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, 250*time.Millisecond, "deleted pod gone", func(context.Context) error {
		if _, err := cs.CoreV1().Pods("default").Get(ctx, victim.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("get: %v", err)
		}
		return nil
	})
	if _, err := (&http.Client{Timeout: time.Second}).Get("http://" + victim.Status.PodIP + ":8080/healthz"); err == nil {
		t.Errorf("deleted pod %s still answers on %s", victim.Name, victim.Status.PodIP)
	}
	n, _ := strconv.Atoi(strings.TrimPrefix(victim.Spec.NodeName, "node"))
	checkPodIsolated(t, cfg, n, &victim, false)
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", callerPid)); err == nil {
		if now, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", callerPid)); err == nil && os.SameFile(now, victimNetns) {
			t.Errorf("deleted pod %s: its container (pid %d) still runs", victim.Name, callerPid)
		}
	}
}

// checkPodIsolated checks that a running pod (want) has its own network
// namespace, holding its IP on eth0 (a veth whose peer is a port of the
// node's bridge cbr0) while the node's links do not, and its container in
// the cgroups the kubelet's cgroupfs driver names in every hierarchy; or
// that a deleted pod (!want) left no pod cgroup.
func checkPodIsolated(t *testing.T, cfg *Config, n int, p *corev1.Pod, want bool) {
	t.Helper()
	hs, err := linuxhost.Hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	podRel := path.Join("/", cfg.CgroupName, NodeName(n), PodCgroup(p.Status.QOSClass, p.UID))
	if !want {
		poll.Until(t, 30*time.Second, 250*time.Millisecond, "deleted pod "+p.Name+"'s cgroups removed", func(context.Context) error {
			for _, d := range linuxhost.Dirs(hs, podRel) {
				if _, err := os.Stat(d); err == nil {
					return errors.New(d + " left")
				}
			}
			return nil
		})
		return
	}
	pid, err := ContainerPid(p, p.Spec.Containers[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	podNet := fmt.Sprintf("--net=/proc/%d/ns/net", pid)
	out, err := exec.Command("nsenter", podNet, "ip", "-4", "-o", "addr", "show", "dev", "eth0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), " "+p.Status.PodIP+"/24 ") {
		t.Errorf("pod %s: eth0 in its netns does not hold %s: %v\n%s", p.Name, p.Status.PodIP, err, out)
	}
	// eth0's peer (its link-netns index) is a port of cbr0 in the node.
	out, err = exec.Command("nsenter", podNet, "ip", "-o", "link", "show", "dev", "eth0").CombinedOutput()
	_, after, _ := strings.Cut(string(out), "eth0@if")
	peer, _, _ := strings.Cut(after, ":")
	ports, perr := exec.Command("ip", "-netns", cfg.Topology.Netns(n), "-o", "link", "show", "master", "cbr0").CombinedOutput()
	if err != nil || perr != nil || peer == "" || !slices.ContainsFunc(strings.Split(string(ports), "\n"), func(l string) bool { return strings.HasPrefix(l, peer+": ") }) {
		t.Errorf("pod %s: eth0's peer (ifindex %s) is not a port of cbr0 in node %d (%v, %v):\n%s\n%s", p.Name, peer, n, err, perr, out, ports)
	}
	out, err = exec.Command("ip", "-netns", cfg.Topology.Netns(n), "-4", "-o", "addr", "show").CombinedOutput()
	if err != nil || strings.Contains(string(out), " "+p.Status.PodIP+"/") {
		t.Errorf("pod %s: its IP %s is on a link of node %d (%v):\n%s", p.Name, p.Status.PodIP, n, err, out)
	}
	_, id, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
	for _, d := range linuxhost.Dirs(hs, path.Join(podRel, id)) {
		procs, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil || !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(pid)) {
			t.Errorf("pod %s: container pid %d not in cgroup %s (%v): %q", p.Name, pid, d, err, procs)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

// checkProcessCgroups checks that every process of the cluster runs in its
// machine's cgroup in the cgroup2 hierarchy and in each v1 hierarchy of the
// pod controllers: the control plane in <cluster>/control-plane, node N's
// node process, its daemons (containerd, the kubelet) and kube-proxy in
// <cluster>/nodeN/system. None is left in a root cgroup, where its threads
// would outweigh all the pods.
func checkProcessCgroups(t *testing.T, cfg *Config) {
	t.Helper()
	live, err := cfg.State.Live()
	if err != nil {
		t.Fatal(err)
	}
	for name, pid := range maps.Clone(live) {
		if !strings.HasPrefix(name, nodeProcPrefix) {
			continue
		}
		kids, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
		for _, k := range kids {
			data, _ := os.ReadFile(k)
			for _, f := range strings.Fields(string(data)) {
				if kid, err := strconv.Atoi(f); err == nil {
					live[name+"/"+f] = kid
				}
			}
		}
	}
	want := func(name string) string {
		name, _, _ = strings.Cut(name, "/") // a node process's child
		for n := 1; n <= cfg.Nodes; n++ {
			if strings.HasSuffix(name, "-"+NodeName(n)) {
				return path.Join("/", cfg.CgroupName, NodeName(n), "system")
			}
		}
		return path.Join("/", cfg.CgroupName, "control-plane")
	}
	seen := 0
	for name, pid := range live {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			// hierarchy-id:controllers:path; cgroup2 has no controllers.
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 {
				continue
			}
			ctrls := strings.Split(parts[1], ",")
			if parts[1] != "" && !slices.ContainsFunc(ctrls, func(c string) bool { return slices.Contains(linuxhost.PodControllers, c) }) {
				continue
			}
			seen++
			if parts[2] != want(name) {
				t.Errorf("%s (pid %d) in cgroup %q of hierarchy %q, want %s", name, pid, parts[2], parts[1], want(name))
			}
		}
	}
	if seen == 0 {
		t.Error("no cluster process found in any cgroup hierarchy")
	}
	hs, err := linuxhost.Hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if slices.Contains(h.Controllers, "cpu") {
			f := filepath.Join(h.Mount, cfg.CgroupName, "control-plane", "cpu.shares")
			if b, err := os.ReadFile(f); err != nil || strings.TrimSpace(string(b)) != fmt.Sprint(ControlPlaneCPUShares) {
				t.Errorf("%s = %q (%v), want %d", f, b, err, ControlPlaneCPUShares)
			}
		}
	}
}

// checkClean fails if anything the cluster makes is left on the machine.
func checkClean(t *testing.T, cfg *Config) {
	t.Helper()
	top := cfg.Topology
	if names, _ := top.NetnsNames(); len(names) > 0 {
		t.Errorf("netns left: %v", names)
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if n := l.Attrs().Name; n == top.Bridge || strings.HasPrefix(n, top.VethPrefix) {
			t.Errorf("link left: %s", n)
		}
	}
	routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
	for _, r := range routes {
		if r.Dst != nil {
			if p, ok := linuxhost.NetipPrefix(r.Dst); ok && p.Bits() > 0 && (top.PodSupernet.Overlaps(p) || top.ServiceCIDR.Overlaps(p) || top.Gateway.Masked().Overlaps(p)) {
				t.Errorf("route left: %s", r.Dst)
			}
		}
	}
	mounts, _ := os.ReadFile("/proc/mounts")
	if strings.Contains(string(mounts), "skipper") {
		t.Errorf("mounts left:\n%s", mounts)
	}
	// A node's mounts live in its mount namespace: one left would be
	// seen by a process still in it.
	infos, _ := filepath.Glob("/proc/[0-9]*/mountinfo")
	for _, mi := range infos {
		if data, err := os.ReadFile(mi); err == nil && strings.Contains(string(data), cfg.State.Dir) {
			t.Errorf("%s still mounts under the state directory %s", filepath.Dir(mi), cfg.State.Dir)
		}
	}
	// Nodes make their cgroups in every hierarchy, not only the pod
	// controllers'.
	if hs, err := linuxhost.AllHierarchies(); err == nil {
		for _, dir := range linuxhost.Dirs(hs, cfg.CgroupName) {
			if _, err := os.Stat(dir); err == nil {
				t.Errorf("cgroup %s left", dir)
			}
		}
	}
	// The node daemons and the runc shims they started (daemonised,
	// reparented to the node process): none may outlive the cluster.
	exes, _ := filepath.Glob("/proc/[0-9]*/exe")
	for _, e := range exes {
		target, err := os.Readlink(e)
		target = strings.TrimSuffix(target, " (deleted)") // a binary rebuilt since it started
		if err == nil && strings.HasPrefix(target, cfg.BinDir+"/") &&
			slices.Contains([]string{"containerd", "containerd-shim-runc-v2", "kube"}, filepath.Base(target)) {
			t.Errorf("process left: %s is %s", filepath.Dir(e), target)
		}
	}
	if names, _ := cfg.State.pidFiles(); len(names) > 0 {
		t.Errorf("pid files left: %v", names)
	}
	if _, err := os.Stat(cfg.State.EnvPath()); err == nil {
		t.Errorf("env file left")
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatalf("address %q: %v", s, err)
	}
	return a
}
