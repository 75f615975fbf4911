package deploy

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// peer is one side of a connection as a NetworkPolicy sees it.
type peer struct {
	ns       map[string]string // the namespace's labels (nil: not a pod)
	pod      map[string]string
	ip       netip.Addr
	podNs    string
	hostname string // for messages
}

func selects(t *testing.T, s *metav1.LabelSelector, l map[string]string) bool {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel.Matches(labels.Set(l))
}

// admits reports whether np lets from reach port of a pod it selects: the
// NetworkPolicy ingress rules as the API documents them (no rule: the
// pod is not isolated by np).
func admits(t *testing.T, np networkingv1.NetworkPolicy, from peer, port int32) bool {
	t.Helper()
	for _, r := range np.Spec.Ingress {
		portOK := len(r.Ports) == 0
		for _, p := range r.Ports {
			if p.Port != nil && p.Port.IntVal == port {
				portOK = true
			}
		}
		if !portOK {
			continue
		}
		if len(r.From) == 0 {
			return true
		}
		for _, f := range r.From {
			switch {
			case f.IPBlock != nil:
				if pfx, err := netip.ParsePrefix(f.IPBlock.CIDR); err == nil && pfx.Contains(from.ip) {
					return true
				}
			case from.pod == nil:
			case f.NamespaceSelector == nil: // pods of np's own namespace
				if from.podNs == np.Namespace && selects(t, f.PodSelector, from.pod) {
					return true
				}
			default:
				if selects(t, f.NamespaceSelector, from.ns) && (f.PodSelector == nil || selects(t, f.PodSelector, from.pod)) {
					return true
				}
			}
		}
	}
	return false
}

func policies(t *testing.T) map[string]networkingv1.NetworkPolicy {
	t.Helper()
	out := map[string]networkingv1.NetworkPolicy{}
	for doc := range strings.SplitSeq(string(kustomize(t, "deploy/networkpolicy")), "\n---\n") {
		var np networkingv1.NetworkPolicy
		if err := yaml.Unmarshal([]byte(doc), &np); err != nil {
			t.Fatal(err)
		}
		if np.Kind == "NetworkPolicy" {
			out[np.Name] = np
		}
	}
	return out
}

// templateLabels are the pod template labels of kind/name in dir.
func templateLabels(t *testing.T, dir, kind, name string) map[string]string {
	t.Helper()
	for doc := range strings.SplitSeq(string(kustomize(t, dir)), "\n---\n") {
		var w struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Template corev1.PodTemplateSpec `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &w); err != nil {
			t.Fatal(err)
		}
		if w.Kind == kind && w.Metadata.Name == name {
			return w.Spec.Template.Labels
		}
	}
	t.Fatalf("no %s %s in %s", kind, name, dir)
	return nil
}

// TestNetworkPolicies checks deploy/networkpolicy against the manifests
// it protects: no CNI of the local cluster enforces NetworkPolicy, so this
// is where its rules are shown (docs/security.md says so).
func TestNetworkPolicies(t *testing.T) {
	nps := policies(t)
	ctl, inst := nps["skipper-controller"], nps["skipper-instances"]
	if ctl.Name == "" || inst.Name == "" {
		t.Fatalf("rendered policies %v, want skipper-controller and skipper-instances", nps)
	}
	system := map[string]string{"kubernetes.io/metadata.name": "skipper-system"}
	tenantNs := map[string]string{"kubernetes.io/metadata.name": "shop"}
	controller := peer{ns: system, pod: templateLabels(t, "deploy", "Deployment", "skipper-controller"), podNs: "skipper-system", ip: netip.MustParseAddr("10.244.1.7"), hostname: "a controller"}
	sidecar := peer{ns: tenantNs, pod: templateLabels(t, "deploy/sidecar", "Deployment", "caller"), podNs: "shop", ip: netip.MustParseAddr("10.244.2.9"), hostname: "a sidecar caller"}
	tenant := peer{ns: tenantNs, pod: map[string]string{"app": "web"}, podNs: "shop", ip: netip.MustParseAddr("10.244.2.10"), hostname: "a workload pod"}
	node := peer{ip: netip.MustParseAddr("198.51.100.12"), hostname: "a node (its router)"}
	outside := peer{ip: netip.MustParseAddr("203.0.113.5"), hostname: "an address outside the cluster"}

	if !selects(t, &ctl.Spec.PodSelector, controller.pod) {
		t.Errorf("skipper-controller selects %v, not the controller pods %v", ctl.Spec.PodSelector, controller.pod)
	}
	pool := templateLabels(t, "deploy/examples", "Deployment", "echo")
	claimed := map[string]string{"skipper.dev/function": "echo"}
	for k, v := range pool {
		claimed[k] = v
	}
	for _, l := range []map[string]string{pool, claimed} {
		if !selects(t, &inst.Spec.PodSelector, l) {
			t.Errorf("skipper-instances does not select a pool pod %v", l)
		}
	}
	if selects(t, &inst.Spec.PodSelector, tenant.pod) {
		t.Error("skipper-instances selects a workload pod")
	}

	for _, c := range []struct {
		np   networkingv1.NetworkPolicy
		from peer
		port int32
		want bool
	}{
		{ctl, node, 9090, true},
		{ctl, controller, 9090, true},
		{ctl, sidecar, 9090, true},
		{ctl, tenant, 9090, false},
		{ctl, outside, 9090, false},
		{ctl, tenant, 9091, true}, // probes and Prometheus
		{inst, node, 8080, true},
		{inst, sidecar, 8080, true},
		{inst, controller, 8080, true}, // the assign
		{inst, tenant, 8080, false},
		{inst, outside, 8080, false},
	} {
		if got := admits(t, c.np, c.from, c.port); got != c.want {
			t.Errorf("%s: %s on port %d admitted %v, want %v", c.np.Name, c.from.hostname, c.port, got, c.want)
		}
	}
	// One node range in both, and a port that is the controller's gRPC port.
	cidrs := map[string]bool{}
	for _, np := range []networkingv1.NetworkPolicy{ctl, inst} {
		for _, r := range np.Spec.Ingress {
			for _, f := range r.From {
				if f.IPBlock != nil {
					cidrs[f.IPBlock.CIDR] = true
				}
			}
		}
	}
	if len(cidrs) != 1 {
		t.Errorf("node ranges %v: want the one NODE_CIDR in both policies", cidrs)
	}
	spec := podSpec(t, kustomize(t, "deploy"), "Deployment", "skipper-controller")
	for _, p := range spec.Containers[0].Ports {
		if p.Name == "grpc" && p.ContainerPort != 9090 || p.Name == "http" && p.ContainerPort != 9091 {
			t.Errorf("controller port %s is %d: the policy's ports are 9090 (grpc) and 9091 (http)", p.Name, p.ContainerPort)
		}
	}
}
