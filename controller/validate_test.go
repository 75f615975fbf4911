package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

func TestValidateFunction(t *testing.T) {
	t.Parallel()
	d := func(v time.Duration) *metav1.Duration { return &metav1.Duration{Duration: v} }
	// edge is a Function with every field at a bound the CRD allows.
	edge := func(mod func(fn *v1alpha1.Function)) *v1alpha1.Function {
		fn := &v1alpha1.Function{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: strings.Repeat("a", 63)},
			Spec: v1alpha1.FunctionSpec{
				Pool: "echo-pool", Port: 65535,
				MinInstances: v1alpha1.MaxMinInstances, MaxInstances: v1alpha1.MaxMaxInstances,
				ConcurrencyLimit: v1alpha1.MaxConcurrencyLimit, MaxBodyBytes: v1alpha1.MaxMaxBodyBytes,
				Scaling: v1alpha1.Scaling{
					TargetInFlight: v1alpha1.MaxTargetInFlight, TargetCPUMilli: v1alpha1.MaxTargetCPUMilli,
					TargetMemoryMiB: v1alpha1.MaxTargetMemoryMiB,
				},
				IdleTimeout: d(v1alpha1.MaxIdleTimeout), Timeout: d(v1alpha1.MinTimeout),
				Config: map[string]string{strings.Repeat("k", 253): strings.Repeat("v", 4096), "é": strings.Repeat("é", 4096)},
			},
		}
		if mod != nil {
			mod(fn)
		}
		return fn
	}
	tests := []struct {
		name string
		fn   *v1alpha1.Function
		want []string // one line per field at fault (the DNS label rules' own words cut off); nil: valid
	}{
		{name: "every field at its bound", fn: edge(nil)},
		{name: "minimal", fn: edge(func(fn *v1alpha1.Function) {
			fn.Name = "a"
			fn.Spec = v1alpha1.FunctionSpec{Pool: "p", MaxInstances: 1}
		})},
		{name: "lower duration bounds", fn: edge(func(fn *v1alpha1.Function) {
			fn.Spec.IdleTimeout, fn.Spec.Timeout = d(time.Second), d(time.Hour)
		})},
		{name: "name too long", fn: edge(func(fn *v1alpha1.Function) { fn.Name = strings.Repeat("a", 64) }),
			want: []string{"metadata.name: " + `"` + strings.Repeat("a", 64) + `" is not a DNS label`}},
		{name: "name with a dot", fn: edge(func(fn *v1alpha1.Function) { fn.Name = "a.b" }),
			want: []string{`metadata.name: "a.b" is not a DNS label`}},
		{name: "pool empty", fn: edge(func(fn *v1alpha1.Function) { fn.Spec.Pool = "" }),
			want: []string{`spec.pool: "" is not a DNS label`}},
		{name: "port", fn: edge(func(fn *v1alpha1.Function) { fn.Spec.Port = -1 }),
			want: []string{"spec.port: -1 is outside 0..65535"}},
		{name: "maxBodyBytes negative", fn: edge(func(fn *v1alpha1.Function) { fn.Spec.MaxBodyBytes = -1 }),
			want: []string{"spec.maxBodyBytes: -1 is outside 0..1099511627776"}},
		{name: "maxBodyBytes over 1 TiB", fn: edge(func(fn *v1alpha1.Function) { fn.Spec.MaxBodyBytes = 1<<40 + 1 }),
			want: []string{"spec.maxBodyBytes: 1099511627777 is outside 0..1099511627776"}},
		{name: "minInstances huge", fn: edge(func(fn *v1alpha1.Function) { fn.Spec.MinInstances, fn.Spec.MaxInstances = 2147483647, 2147483647 }),
			want: []string{"spec.minInstances: 2147483647 is outside 0..1000", "spec.maxInstances: 2147483647 is outside 1..1000"}},
		{name: "min above max", fn: edge(func(fn *v1alpha1.Function) { fn.Spec.MinInstances, fn.Spec.MaxInstances = 3, 2 }),
			want: []string{"spec.minInstances: 3 exceeds spec.maxInstances 2"}},
		{name: "negative counts", fn: edge(func(fn *v1alpha1.Function) {
			fn.Spec.MinInstances, fn.Spec.MaxInstances, fn.Spec.ConcurrencyLimit = -1, 0, -1
			fn.Spec.Scaling = v1alpha1.Scaling{TargetInFlight: -1, TargetCPUMilli: -1, TargetMemoryMiB: -1}
		}), want: []string{
			"spec.minInstances: -1 is outside 0..1000",
			"spec.maxInstances: 0 is outside 1..1000",
			"spec.concurrencyLimit: -1 is outside 0..10000",
			"spec.scaling.targetInFlight: -1 is outside 1..10000",
			"spec.scaling.targetCPUMilli: -1 is outside 0..1000000",
			"spec.scaling.targetMemoryMiB: -1 is outside 0..1048576",
		}},
		{name: "counts above their bounds", fn: edge(func(fn *v1alpha1.Function) {
			fn.Spec.ConcurrencyLimit = v1alpha1.MaxConcurrencyLimit + 1
			fn.Spec.Scaling = v1alpha1.Scaling{
				TargetInFlight: v1alpha1.MaxTargetInFlight + 1, TargetCPUMilli: v1alpha1.MaxTargetCPUMilli + 1,
				TargetMemoryMiB: v1alpha1.MaxTargetMemoryMiB + 1,
			}
		}), want: []string{
			"spec.concurrencyLimit: 10001 is outside 0..10000",
			"spec.scaling.targetInFlight: 10001 is outside 1..10000",
			"spec.scaling.targetCPUMilli: 1000001 is outside 0..1000000",
			"spec.scaling.targetMemoryMiB: 1048577 is outside 0..1048576",
		}},
		{name: "targetInFlight unset takes the default", fn: edge(func(fn *v1alpha1.Function) { fn.Spec.Scaling.TargetInFlight = 0 })},
		{name: "durations out of range", fn: edge(func(fn *v1alpha1.Function) {
			fn.Spec.IdleTimeout, fn.Spec.Timeout = d(-5*time.Second), d(0)
		}), want: []string{"spec.idleTimeout: -5s is outside 1s..24h0m0s", "spec.timeout: 0s is outside 1ms..1h0m0s"}},
		{name: "durations too long", fn: edge(func(fn *v1alpha1.Function) {
			fn.Spec.IdleTimeout, fn.Spec.Timeout = d(25*time.Hour), d(time.Hour+time.Nanosecond)
		}), want: []string{"spec.idleTimeout: 25h0m0s is outside 1s..24h0m0s", "spec.timeout: 1h0m0.000000001s is outside 1ms..1h0m0s"}},
		{name: "config keys and values", fn: edge(func(fn *v1alpha1.Function) {
			fn.Spec.Config = map[string]string{"": "x", strings.Repeat("k", 254): "x", "big": strings.Repeat("v", 4097)}
		}), want: []string{
			`spec.config: key "" has 0 characters, want 1..253`,
			`spec.config: value of key "big" has 4097 characters, more than 4096`,
			`spec.config: key "` + strings.Repeat("k", 40) + `" has 254 characters, want 1..253`,
		}},
		{name: "config entries", fn: edge(func(fn *v1alpha1.Function) {
			fn.Spec.Config = map[string]string{}
			for i := range 65 {
				fn.Spec.Config[strings.Repeat("k", i+1)] = ""
			}
		}), want: []string{"spec.config: 65 entries, more than 64"}},
		{name: "callers", fn: edge(func(fn *v1alpha1.Function) {
			fn.Spec.Callers = v1alpha1.Callers{Namespaces: []string{"team-a", "Team_B"}, ServiceAccounts: []string{"team-a/web", "web", "a/B"}}
		}), want: []string{
			`spec.callers.namespaces: "Team_B" is not a namespace name`,
			`spec.callers.serviceAccounts: "web" is not <namespace>/<name> of a ServiceAccount`,
			`spec.callers.serviceAccounts: "a/B" is not <namespace>/<name> of a ServiceAccount`,
		}},
		{name: "callers entries", fn: edge(func(fn *v1alpha1.Function) {
			for i := range 65 {
				fn.Spec.Callers.Namespaces = append(fn.Spec.Callers.Namespaces, fmt.Sprintf("ns-%d", i))
				fn.Spec.Callers.ServiceAccounts = append(fn.Spec.Callers.ServiceAccounts, fmt.Sprintf("ns/sa-%d", i))
			}
		}), want: []string{"spec.callers.namespaces: 65 entries, more than 64", "spec.callers.serviceAccounts: 65 entries, more than 64"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			if err := validate(tt.fn); err != nil {
				for _, l := range strings.Split(err.Error(), "\n") {
					l, _, _ = strings.Cut(l, ": a lowercase RFC 1123") // apimachinery's wording
					l, _, _ = strings.Cut(l, ": must ")
					got = append(got, l)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("validate (-want +got):\n%s", diff)
			}
		})
	}
}

func TestInvalidMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want string
	}{
		{name: "lines joined", err: validate(&v1alpha1.Function{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: v1alpha1.FunctionSpec{Pool: "p", MinInstances: -1, MaxInstances: 1}}),
			want: "spec.minInstances: -1 is outside 0..1000"},
		{name: "long message cut on a rune boundary", err: errString("x" + strings.Repeat("é", 600)),
			want: "x" + strings.Repeat("é", 511) + "…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, invalidMessage(tt.err)); diff != "" {
				t.Errorf("invalidMessage (-want +got):\n%s", diff)
			}
		})
	}
}

type errString string

func (e errString) Error() string { return string(e) }
