package deploy

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// TestAdmissionPoliciesNameTheController: the ValidatingAdmissionPolicies
// match the controller by its ServiceAccount's user name, written into
// their CEL. A policy naming another account than the Deployment runs as
// would match no request, and the controller's writes would go unchecked:
// an overlay that moves the controller (another namespace or
// ServiceAccount) must change the policies too, and this fails until it
// does.
func TestAdmissionPoliciesNameTheController(t *testing.T) {
	for _, dir := range []string{"deploy", "deploy/overlays/local", "deploy/overlays/tls"} {
		rendered := kustomize(t, dir)
		var user string
		var policies []admissionv1.ValidatingAdmissionPolicy
		for doc := range strings.SplitSeq(string(rendered), "\n---\n") {
			var meta struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatal(err)
			}
			switch meta.Kind {
			case "Deployment":
				var d appsv1.Deployment
				if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
					t.Fatal(err)
				}
				if d.Name == "skipper-controller" {
					user = "system:serviceaccount:" + d.Namespace + ":" + d.Spec.Template.Spec.ServiceAccountName
				}
			case "ValidatingAdmissionPolicy":
				var p admissionv1.ValidatingAdmissionPolicy
				if err := yaml.Unmarshal([]byte(doc), &p); err != nil {
					t.Fatal(err)
				}
				policies = append(policies, p)
			}
		}
		if user == "" || len(policies) < 2 {
			t.Fatalf("%s: controller user %q, %d policies", dir, user, len(policies))
		}
		named := regexp.MustCompile(`request\.userInfo\.username == '([^']+)'`)
		for _, p := range policies {
			var got []string
			for _, mc := range p.Spec.MatchConditions {
				for _, m := range named.FindAllStringSubmatch(mc.Expression, -1) {
					got = append(got, m[1])
				}
			}
			if len(got) != 1 || got[0] != user {
				t.Errorf("%s: policy %s matches users %q, want the controller's %q", dir, p.Name, got, user)
			}
		}
	}
}

// TestBefore136OnlyDropsTheAgentPolicy: deploy/overlays/before-1.36
// renders what deploy/ does but the MutatingAdmissionPolicy and its
// binding (kinds a cluster older than 1.36 does not know).
func TestBefore136OnlyDropsTheAgentPolicy(t *testing.T) {
	kindsOf := func(dir string) []string {
		var kinds []string
		for line := range strings.SplitSeq(string(kustomize(t, dir)), "\n") {
			if k, ok := strings.CutPrefix(line, "kind: "); ok {
				kinds = append(kinds, k)
			}
		}
		return kinds
	}
	var want []string
	for _, k := range kindsOf("deploy") {
		if k != "MutatingAdmissionPolicy" && k != "MutatingAdmissionPolicyBinding" {
			want = append(want, k)
		}
	}
	got := kindsOf("deploy/overlays/before-1.36")
	if len(got) != len(kindsOf("deploy"))-2 || !slices.Equal(got, want) {
		t.Errorf("before-1.36 renders %v, want deploy/'s %v less the agent policy and its binding", got, want)
	}
}
