package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// waitReady waits for Ready nodes, applies the manifests, waits for the
// function to answer and returns the env file's contents.
func (c *cluster) waitReady(ctx context.Context) ([]EnvVar, error) {
	cfg := c.cfg
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.State.Kubeconfig())
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	if err := c.poll(ctx, "Ready nodes", cfg.ReadyTimeout, func(ctx context.Context) (bool, string, error) {
		return nodesReady(ctx, cs, cfg.Nodes)
	}); err != nil {
		return nil, err
	}
	c.log.Info("nodes ready", "nodes", cfg.Nodes)
	for i, p := range c.proxies {
		url := fmt.Sprintf("http://%s:%d/healthz", cfg.Topology.NodeIP(i+1), kubeProxyHealthzPort)
		if err := waitHTTP(ctx, &http.Client{Timeout: 3 * time.Second}, url, p, cfg.ReadyTimeout); err != nil {
			return nil, err
		}
	}
	if len(c.proxies) > 0 {
		c.log.Info("kube-proxy ready", "mode", cfg.ProxyMode, "nodes", len(c.proxies))
	}

	// The cluster's own DNS first, as every cluster has one before its
	// workloads.
	for _, dir := range append([]string{filepath.Join(cfg.RepoDir, clusterDNSDir)}, cfg.Apply...) {
		if err := c.apply(ctx, dir); err != nil {
			return nil, err
		}
		if err := c.waitAgentPolicy(ctx, cs); err != nil {
			return nil, err
		}
	}

	routerURL := fmt.Sprintf("http://%s:8380", cfg.Topology.NodeIP(1))
	if cfg.Function != "" {
		hc := &http.Client{Timeout: 5 * time.Second}
		err := c.poll(ctx, "function "+cfg.Function+" through the router", cfg.ReadyTimeout, func(ctx context.Context) (bool, string, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, routerURL+"/hello", nil)
			if err != nil {
				return false, "", err
			}
			req.Header.Set("x-skipper-function", cfg.Function)
			resp, err := hc.Do(req)
			if err != nil {
				return false, err.Error(), nil
			}
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, fmt.Sprintf("%s %s", resp.Status, bytes.TrimSpace(body)), nil
		})
		if err != nil {
			return nil, fmt.Errorf("%w\npods:\n%s", err, podSummary(ctx, cs))
		}
		c.log.Info("function answers through the router", "function", cfg.Function, "url", routerURL)
	}

	var metrics []string
	pods, err := cs.CoreV1().Pods("skipper-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=skipper-controller"})
	if err != nil {
		return nil, fmt.Errorf("list controller pods: %w", err)
	}
	for _, p := range pods.Items {
		if p.Status.PodIP != "" && p.DeletionTimestamp == nil {
			metrics = append(metrics, fmt.Sprintf("http://%s:9091/metrics", p.Status.PodIP))
		}
	}
	slices.Sort(metrics)
	return []EnvVar{
		{"KUBECONFIG", cfg.State.Kubeconfig()},
		{"PATH", cfg.BinDir + string(os.PathListSeparator) + os.Getenv("PATH")},
		{"ROUTER_URL", routerURL},
		{"ROUTER_METRICS_URL", fmt.Sprintf("http://%s:8381/metrics", cfg.Topology.NodeIP(1))},
		{"CONTROLLER_METRICS_URLS", strings.Join(metrics, " ")},
		// The registry the nodes pull from and the image make image built,
		// as the local overlay names it.
		{"SKIPPER_REGISTRY", cfg.Registry()},
		{"SKIPPER_CLUSTER_IMAGE", cfg.LocalImage("skipper-dev/skipper", "dev")},
		{"SKIPPER_CLUSTER_TESTPOD_IMAGE", cfg.LocalImage("skipper-dev/testpod", "dev")},
		// What the registry serves (it reads bin/image once, at start).
		{"SKIPPER_CLUSTER_LAYOUT_DIGEST", c.layoutDigest},
	}, nil
}

// poll calls check every 500ms until it reports done, fails, a child dies,
// ctx ends or timeout passes.
func (c *cluster) poll(ctx context.Context, what string, timeout time.Duration, check func(context.Context) (bool, string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := "no answer yet"
	for {
		ok, status, err := check(ctx)
		if err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if status != "" {
			last = status
		}
		if p := c.dead(); p != nil {
			return fmt.Errorf("%s exited (%v) while waiting for %s; last lines of %s:\n%s", p.Name, p.Err(), what, p.LogPath, tailFile(p.LogPath, 25))
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%s not there after %s (last: %s)", what, timeout, last)
			}
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (c *cluster) dead() *Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		select {
		case <-p.Done():
			return p
		default:
		}
	}
	return nil
}

func nodesReady(ctx context.Context, cs kubernetes.Interface, nodes int) (bool, string, error) {
	list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err.Error(), nil
	}
	ready := map[string]bool{}
	for _, n := range list.Items {
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				ready[n.Name] = true
			}
		}
		// The lifecycle controller lifts the not-ready taint a few seconds
		// after Ready; until then nothing schedules.
		for _, t := range n.Spec.Taints {
			if t.Key == corev1.TaintNodeNotReady {
				ready[n.Name] = false
			}
		}
	}
	for n := 1; n <= nodes; n++ {
		if !ready[NodeName(n)] {
			return false, fmt.Sprintf("%s not Ready (%d nodes registered)", NodeName(n), len(list.Items)), nil
		}
	}
	return true, "", nil
}

// agentPolicy is the MutatingAdmissionPolicy deploy/base ships.
const agentPolicy = "skipper-agent"

// waitAgentPolicy waits, when the agent's admission policy is installed,
// until the API server applies it: a pool pod created in a server-side dry
// run gets the agent. The API server evaluates a new policy only once its
// own watch has it, and a pool pod created before that gets none (the
// httpbin pool's, in a CI run that applied the examples a moment after
// the policy).
func (c *cluster) waitAgentPolicy(ctx context.Context, cs kubernetes.Interface) error {
	if _, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Get(ctx, agentPolicy, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return nil
	}
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "agent-policy-probe-", Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{"skipper.dev/pool": "agent-policy-probe"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "agent-policy-probe.invalid/none"}}},
	}
	err := c.poll(ctx, "admission policy "+agentPolicy+" in effect", c.cfg.ReadyTimeout, func(ctx context.Context) (bool, string, error) {
		got, err := cs.CoreV1().Pods(probe.Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, ic := range got.Spec.InitContainers {
			if ic.Name == agentPolicy {
				return true, "", nil
			}
		}
		return false, "a pool pod created now gets no agent", nil
	})
	if err != nil {
		return err
	}
	c.log.Info("admission policy in effect", "policy", agentPolicy)
	return nil
}

// apply runs kubectl apply --server-side -k dir until it succeeds: a first
// attempt can race CRD establishment or the default ServiceAccount.
func (c *cluster) apply(ctx context.Context, dir string) error {
	cfg := c.cfg
	logPath := cfg.State.LogPath("kubectl")
	var out []byte
	err := c.poll(ctx, "kubectl apply -k "+dir, cfg.ReadyTimeout, func(ctx context.Context) (bool, string, error) {
		cmd := exec.CommandContext(ctx, cfg.kube("kubectl"), "apply", "--server-side", "--field-manager=skipper-cluster", "-k", dir)
		cmd.Env = append(childEnv(), "KUBECONFIG="+cfg.State.Kubeconfig())
		var err error
		out, err = cmd.CombinedOutput()
		if f, ferr := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); ferr == nil {
			fmt.Fprintf(f, "==== %s kubectl apply --server-side -k %s: %v\n%s", time.Now().UTC().Format(time.RFC3339), dir, err, out)
			f.Close()
		}
		if err != nil {
			return false, strings.TrimSpace(lastLines(string(out), 3)), nil
		}
		return true, "", nil
	})
	if err != nil {
		return fmt.Errorf("%w\nkubectl output:\n%s", err, out)
	}
	c.log.Info("applied", "dir", dir)
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func podSummary(ctx context.Context, cs kubernetes.Interface) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return "  (list pods: " + err.Error() + ")"
	}
	var b strings.Builder
	for _, p := range pods.Items {
		ready := "not ready"
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				ready = "ready"
			}
		}
		msg := ""
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Waiting != nil {
				msg += fmt.Sprintf(" %s waiting %s: %s", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message)
			}
			if s.State.Terminated != nil {
				msg += fmt.Sprintf(" %s terminated %s (exit %d)", s.Name, s.State.Terminated.Reason, s.State.Terminated.ExitCode)
			}
		}
		fmt.Fprintf(&b, "  %s/%s %s %s node=%s ip=%s%s\n", p.Namespace, p.Name, p.Status.Phase, ready, p.Spec.NodeName, p.Status.PodIP, msg)
	}
	return b.String()
}
