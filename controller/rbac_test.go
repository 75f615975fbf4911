package controller

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// apiCall is one kind of request the controller makes to the API server.
type apiCall struct {
	group, resource, verb string
	name                  string // the one object it names, when RBAC can scope it so; "" any
	where                 string // what makes it
}

// controllerCalls are every request the controller makes (issue 16: least
// privilege): its informers (list, watch), the writes in the code, and the
// reviews. TestRBACGrantsExactlyTheCalls checks deploy/base's RBAC grants
// these and nothing else; TestControllerCallsListed that the code makes no
// call missing here.
var controllerCalls = []apiCall{
	{"skipper.dev", "functions", "list", "", "informer"},
	{"skipper.dev", "functions", "watch", "", "informer"},
	{"skipper.dev", "functions/status", "patch", "", "status.go"},
	{"skipper.dev", "functions/finalizers", "update", "", "blockOwnerDeletion on a claimed pod's ownerReference (admission)"},
	{"", "pods", "list", "", "informer; a oneshot release's live list (server.go)"},
	{"", "pods", "watch", "", "informer"},
	{"", "pods", "get", "", "a record's re-read (record.go)"},
	{"", "pods", "patch", "", "a claim's record (record.go)"},
	{"", "pods", "delete", "", "retiring, releasing and orphaned instances (claim.go, drain.go)"},
	{"apps", "deployments", "list", "", "informer"},
	{"apps", "deployments", "watch", "", "informer"},
	{"apps", "deployments", "patch", "", "the pool autoscaler (poolscale.go), replicas only (skipper-controller-pools)"},
	{"", "configmaps", "create", "", "the assign key ConfigMap (assignkey.go)"},
	{"", "configmaps", "list", "skipper-assign-key", "informer (metadata.name field selector)"},
	{"", "configmaps", "watch", "skipper-assign-key", "informer (metadata.name field selector)"},
	{"", "configmaps", "patch", "skipper-assign-key", "assignkey.go"},
	{"", "configmaps", "delete", "skipper-assign-key", "assignkey.go"},
	{"", "events", "create", "", "the event recorder"},
	{"", "events", "patch", "", "the event recorder (a repeated event)"},
	{"authentication.k8s.io", "tokenreviews", "create", "", "callers' tokens (trust)"},
	{"authorization.k8s.io", "subjectaccessreviews", "create", "", "sidecar routers' access (trust)"},
	{"", "secrets", "get", "skipper-assign-key", "assignkey.go"},
	{"", "secrets", "create", "", "assignkey.go"},
	{"", "services", "list", "", "informer (the Functions' own Services, and names others took)"},
	{"", "services", "watch", "", "informer"},
	{"", "services", "create", "", "a Function's own Service (service.go; skipper-controller-services)"},
	{"", "services", "patch", "", "a Function's own Service pointed at the routers again (service.go; skipper-controller-services)"},
	{"discovery.k8s.io", "endpointslices", "list", "", "informer (the ring)"},
	{"discovery.k8s.io", "endpointslices", "watch", "", "informer (the ring)"},
}

// rbacRules reads every ClusterRole and Role in file.
func rbacRules(t *testing.T, file string) []rbacv1.PolicyRule {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rules []rbacv1.PolicyRule
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if head.Kind != "ClusterRole" && head.Kind != "Role" {
			continue
		}
		var r rbacv1.ClusterRole // a Role's rules read the same
		if err := yaml.Unmarshal(doc, &r); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		rules = append(rules, r.Rules...)
	}
	return rules
}

func TestRBACGrantsExactlyTheCalls(t *testing.T) {
	t.Parallel()
	rules := rbacRules(t, filepath.Join("..", "deploy", "base", "controller-rbac.yaml"))
	grants := func(c apiCall, r rbacv1.PolicyRule) bool {
		return slices.Contains(r.APIGroups, c.group) && slices.Contains(r.Resources, c.resource) && slices.Contains(r.Verbs, c.verb) &&
			(len(r.ResourceNames) == 0 || c.name != "" && slices.Contains(r.ResourceNames, c.name))
	}
	for _, c := range controllerCalls {
		if !slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool { return grants(c, r) }) {
			t.Errorf("%s %s.%s (%s) is not granted", c.verb, c.resource, c.group, c.where)
		}
	}
	for _, r := range rules {
		if slices.Contains(r.Verbs, "*") || slices.Contains(r.Resources, "*") || slices.Contains(r.APIGroups, "*") {
			t.Errorf("a wildcard rule %+v", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					used := slices.ContainsFunc(controllerCalls, func(c apiCall) bool {
						return c.group == g && c.resource == res && c.verb == v && (len(r.ResourceNames) > 0) == (c.name != "")
					})
					if !used {
						t.Errorf("%s %s.%s (names %v) is granted but never called: drop it", v, res, g, r.ResourceNames)
					}
				}
			}
		}
	}
}

// callRE finds a typed client call in the code: the resource accessor and
// the verb, as in c.core.CoreV1().Pods(ns).Patch(.
var callRE = regexp.MustCompile(`\b(?:CoreV1|AppsV1|AuthenticationV1|AuthorizationV1|DiscoveryV1)\(\)\.(\w+)\([^)]*\)\.(\w+)\(`)

// TestControllerCallsListed scans the controller's code (not its tests)
// for typed client calls and checks each is in controllerCalls; the calls
// through a client held in a variable (assignkey.go's secrets and cms)
// and the dynamic client's status patch are listed by hand above.
func TestControllerCallsListed(t *testing.T) {
	t.Parallel()
	resources := map[string]string{ // accessor → resource
		"Pods": "pods", "ConfigMaps": "configmaps", "Secrets": "secrets", "Deployments": "deployments",
		"TokenReviews": "tokenreviews", "SubjectAccessReviews": "subjectaccessreviews", "EndpointSlices": "endpointslices",
		"Events": "events", "Services": "services",
	}
	verbs := map[string]string{"Get": "get", "List": "list", "Watch": "watch", "Create": "create", "Update": "update",
		"Patch": "patch", "Delete": "delete", "UpdateStatus": "update", "DeleteCollection": "deletecollection"}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	trustFiles, _ := filepath.Glob(filepath.Join("trust", "*.go"))
	found := 0
	for _, f := range append(files, trustFiles...) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range callRE.FindAllStringSubmatch(string(src), -1) {
			res, verb := resources[m[1]], verbs[m[2]]
			if res == "" || verb == "" {
				t.Errorf("%s: unknown client call %s", f, m[0])
				continue
			}
			found++
			// A subresource call (deployments/scale) matches its resource's prefix.
			if !slices.ContainsFunc(controllerCalls, func(c apiCall) bool { return strings.HasPrefix(c.resource, res) && c.verb == verb }) {
				t.Errorf("%s: %s is not in controllerCalls (add it there and to deploy/base/controller-rbac.yaml)", f, m[0])
			}
		}
	}
	if found < 8 {
		t.Errorf("found %d client calls: the scan no longer matches the code", found)
	}
}
