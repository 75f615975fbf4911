package deploy

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// imageLine is a container's image in rendered YAML.
var imageLine = regexp.MustCompile(`(?m)^\s+image: (\S+)$`)

// images lists the images a kustomize directory renders, in order.
func images(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, m := range imageLine.FindAllStringSubmatch(string(kustomize(t, dir)), -1) {
		out = append(out, m[1])
	}
	if len(out) == 0 {
		t.Fatalf("%s renders no image", dir)
	}
	return out
}

// upstream are the third-party images the examples name (their own
// registries) and the repository make image builds each as, under
// skipper-dev/ (tests/httpbin).
var upstream = map[string]string{"ghcr.io/mccutchen/go-httpbin": "httpbin"}

// TestLocalOverlaysChangeOnlyRegistryAndTag: the manifests name real
// images (ghcr.io/skipper-dev/..., or a third party's own); each local
// overlay renders the same images, in the same places, from the local
// cluster's registry with tag dev (what make image builds and the cluster
// serves), and nothing else about them.
func TestLocalOverlaysChangeOnlyRegistryAndTag(t *testing.T) {
	const ghcr, local = "ghcr.io/skipper-dev/", "198.51.100.1:5000/skipper-dev/"
	for _, tc := range []struct {
		bases   []string
		overlay string
	}{
		{[]string{"deploy"}, "deploy/overlays/local"},
		{[]string{"deploy/examples", "deploy/examples/protocols"}, "deploy/overlays/local-examples"},
		{[]string{"deploy/sidecar"}, "deploy/overlays/local-sidecar"},
	} {
		t.Run(strings.ReplaceAll(tc.overlay, "/", "_"), func(t *testing.T) {
			var want []string
			for _, base := range tc.bases {
				for _, img := range images(t, base) {
					name, _, _ := strings.Cut(img, ":")
					repo, ok := strings.CutPrefix(name, ghcr)
					if !ok {
						if repo, ok = upstream[name]; !ok {
							t.Fatalf("%s names %s, not an image of %s nor a known third party's", base, img, ghcr)
						}
					}
					want = append(want, local+repo+":dev")
				}
			}
			got := images(t, tc.overlay)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s's images (-want +got):\n%s", tc.overlay, diff)
			}
			if slices.ContainsFunc(got, func(s string) bool { return !strings.HasPrefix(s, local) }) {
				t.Errorf("%s pulls from outside the local registry: %v", tc.overlay, got)
			}
		})
	}
}

// TestAgentImageIsTheControllers: the agent the admission policy adds
// (its image the policy's variable agentImage, a CEL string literal) runs
// the controller's image, in the base and in the local overlay.
func TestAgentImageIsTheControllers(t *testing.T) {
	for _, dir := range []string{"deploy", "deploy/overlays/local"} {
		var agent, controller string
		for doc := range strings.SplitSeq(string(kustomize(t, dir)), "\n---\n") {
			var obj struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
				Spec struct {
					Variables []struct {
						Name       string `json:"name"`
						Expression string `json:"expression"`
					} `json:"variables"`
					Template struct {
						Spec struct {
							Containers []struct {
								Image string `json:"image"`
							} `json:"containers"`
						} `json:"spec"`
					} `json:"template"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatal(err)
			}
			switch {
			case obj.Kind == "MutatingAdmissionPolicy" && obj.Metadata.Name == "skipper-agent":
				for _, v := range obj.Spec.Variables {
					if v.Name == "agentImage" {
						agent = strings.TrimSuffix(strings.TrimPrefix(v.Expression, "'"), "'")
					}
				}
			case obj.Kind == "Deployment" && obj.Metadata.Name == "skipper-controller":
				controller = obj.Spec.Template.Spec.Containers[0].Image
			}
		}
		if agent == "" || agent != controller {
			t.Errorf("%s: the agent's image %q, the controller's %q: want the same", dir, agent, controller)
		}
	}
}
