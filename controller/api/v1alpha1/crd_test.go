package v1alpha1

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// crdPath is the CRD controller-gen generates from this package's markers.
const crdPath = "../../../deploy/base/crd/skipper.dev_functions.yaml"

// openAPISchema is the part of an OpenAPI schema the bounds live in.
type openAPISchema struct {
	Properties    map[string]openAPISchema `json:"properties"`
	Maximum       *int64                   `json:"maximum"`
	Minimum       *int64                   `json:"minimum"`
	MaxLength     *int64                   `json:"maxLength"`
	MaxProperties *int64                   `json:"maxProperties"`
	MaxItems      *int64                   `json:"maxItems"`
	Validations   []struct {
		Rule    string `json:"rule"`
		Message string `json:"message"`
	} `json:"x-kubernetes-validations"`
}

func loadSchema(t *testing.T) openAPISchema {
	t.Helper()
	raw, err := os.ReadFile(crdPath)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.ToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Name   string `json:"name"`
				Schema struct {
					OpenAPIV3Schema openAPISchema `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(js, &crd); err != nil {
		t.Fatal(err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == Version {
			return v.Schema.OpenAPIV3Schema
		}
	}
	t.Fatalf("%s has no version %s", crdPath, Version)
	return openAPISchema{}
}

func rules(s openAPISchema) string {
	var out []string
	for _, v := range s.Validations {
		out = append(out, v.Rule)
	}
	return strings.Join(out, " ;; ")
}

// TestCRDBounds: the generated CRD enforces the bounds this package states
// as constants, which the controller's own validation uses (markers cannot
// name constants, so the two are kept equal here). Regenerate the CRD with
// controller-gen after changing a marker.
func TestCRDBounds(t *testing.T) {
	t.Parallel()
	root := loadSchema(t)
	spec := root.Properties["spec"]
	scaling := spec.Properties["scaling"]
	counts := []struct {
		field    string
		s        openAPISchema
		min, max int64
	}{
		{"minInstances", spec.Properties["minInstances"], 0, MaxMinInstances},
		{"maxInstances", spec.Properties["maxInstances"], 1, MaxMaxInstances},
		{"concurrencyLimit", spec.Properties["concurrencyLimit"], 0, MaxConcurrencyLimit},
		{"port", spec.Properties["port"], 0, 65535},
		{"maxBodyBytes", spec.Properties["maxBodyBytes"], 0, MaxMaxBodyBytes},
		{"scaling.targetInFlight", scaling.Properties["targetInFlight"], 1, MaxTargetInFlight},
		{"scaling.targetCPUMilli", scaling.Properties["targetCPUMilli"], 0, MaxTargetCPUMilli},
		{"scaling.targetMemoryMiB", scaling.Properties["targetMemoryMiB"], 0, MaxTargetMemoryMiB},
	}
	for _, c := range counts {
		if c.s.Minimum == nil || c.s.Maximum == nil || *c.s.Minimum != c.min || *c.s.Maximum != c.max {
			t.Errorf("spec.%s: CRD bounds %v..%v, want %d..%d", c.field, deref(c.s.Minimum), deref(c.s.Maximum), c.min, c.max)
		}
	}

	durations := []struct {
		field  string
		s      openAPISchema
		lo, hi time.Duration
	}{
		{"idleTimeout", spec.Properties["idleTimeout"], MinIdleTimeout, MaxIdleTimeout},
		{"timeout", spec.Properties["timeout"], MinTimeout, MaxTimeout},
	}
	lit := regexp.MustCompile(`duration\('([^']+)'\)`)
	for _, d := range durations {
		var got []time.Duration
		for _, m := range lit.FindAllStringSubmatch(rules(d.s), -1) {
			v, err := time.ParseDuration(m[1])
			if err != nil {
				t.Fatalf("spec.%s: rule literal %q: %v", d.field, m[1], err)
			}
			got = append(got, v)
		}
		if diff := cmp.Diff([]time.Duration{d.lo, d.hi}, got); diff != "" {
			t.Errorf("spec.%s: duration bounds in the CEL rule (-want +got):\n%s", d.field, diff)
		}
		if d.s.MaxLength == nil || *d.s.MaxLength != MaxDurationLength {
			t.Errorf("spec.%s: maxLength %v, want %d", d.field, deref(d.s.MaxLength), MaxDurationLength)
		}
	}

	cfg := spec.Properties["config"]
	if cfg.MaxProperties == nil || *cfg.MaxProperties != MaxConfigEntries {
		t.Errorf("spec.config: maxProperties %v, want %d", deref(cfg.MaxProperties), MaxConfigEntries)
	}
	for _, want := range []string{
		fmt.Sprintf("k.size() <= %d", MaxConfigKeyLength),
		fmt.Sprintf("self[k].size() <= %d", MaxConfigValueLength),
	} {
		if !strings.Contains(rules(cfg), want) {
			t.Errorf("spec.config: rules %q lack %q", rules(cfg), want)
		}
	}
	for _, list := range []string{"namespaces", "serviceAccounts"} {
		if s := spec.Properties["callers"].Properties[list]; s.MaxItems == nil || *s.MaxItems != MaxCallers {
			t.Errorf("spec.callers.%s: maxItems %v, want %d", list, deref(s.MaxItems), MaxCallers)
		}
	}
	if want := fmt.Sprintf("self.metadata.name.size() <= %d", MaxNameLength); !strings.Contains(rules(root), want) {
		t.Errorf("root rules %q lack %q", rules(root), want)
	}
	if want := "self.minInstances <= self.maxInstances"; !strings.Contains(rules(spec), want) {
		t.Errorf("spec rules %q lack %q", rules(spec), want)
	}
}

func deref(p *int64) any {
	if p == nil {
		return "unset"
	}
	return *p
}
