package deploy

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// objects parses rendered YAML into its objects, keyed kind/name.
func objects(t *testing.T, rendered []byte) map[string]*unstructured.Unstructured {
	t.Helper()
	out := map[string]*unstructured.Unstructured{}
	for doc := range strings.SplitSeq(string(rendered), "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatal(err)
		}
		if m == nil {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		out[u.GetKind()+"/"+u.GetName()] = u
	}
	return out
}

// TestKubePrometheusStackOverlay: a stock kube-prometheus-stack selects
// only the Prometheus Operator's objects labelled with its release. The
// overlay renders deploy/monitoring's objects, every monitoring.coreos.com
// one labelled release: kube-prometheus-stack, and changes nothing else.
func TestKubePrometheusStackOverlay(t *testing.T) {
	const release = "kube-prometheus-stack"
	base := objects(t, kustomize(t, "deploy/monitoring"))
	overlay := objects(t, kustomize(t, "deploy/overlays/kube-prometheus-stack"))
	if diff := cmp.Diff(slices.Sorted(maps.Keys(base)), slices.Sorted(maps.Keys(overlay))); diff != "" {
		t.Fatalf("objects (-deploy/monitoring +overlay):\n%s", diff)
	}
	var monitoring []string
	for key, u := range overlay {
		labels := u.GetLabels()
		if u.GroupVersionKind().Group == "monitoring.coreos.com" {
			monitoring = append(monitoring, key)
			if got := labels["release"]; got != release {
				t.Errorf("%s: label release=%q, want %q", key, got, release)
			}
			delete(labels, "release")
			u.SetLabels(labels)
		} else if _, ok := labels["release"]; ok {
			t.Errorf("%s: labelled release, which only the Prometheus Operator's objects need", key)
		}
		if diff := cmp.Diff(base[key].Object, u.Object); diff != "" {
			t.Errorf("%s: the overlay changes more than the release label (-deploy/monitoring +overlay):\n%s", key, diff)
		}
	}
	slices.Sort(monitoring)
	want := []string{"PodMonitor/skipper-controller", "PodMonitor/skipper-noderouter", "PrometheusRule/skipper"}
	if diff := cmp.Diff(want, monitoring); diff != "" {
		t.Errorf("monitoring.coreos.com objects (-want +got):\n%s", diff)
	}
}
