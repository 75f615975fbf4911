package controller

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// invalidFunction is what the Function cache holds for a stored object the
// controller cannot act on: one that does not convert to a Function (a
// field of the wrong type, a duration that does not parse), or one that
// converts but fails validate (written past the CRD's validation: straight
// to etcd, or under an older CRD). No decision acts on it; its owner
// reports err on it (condition Degraded, a Warning Event) and GetInstance
// answers ErrInvalidSpec. Keeping it in the cache, rather than failing the
// informer's transform, is what keeps one bad object from stopping the
// informer's initial list, and with it every controller replica.
type invalidFunction struct {
	// fn holds the object's metadata and whatever of its status converts;
	// its spec is not to be used.
	fn  *v1alpha1.Function
	err error
}

// GetObjectMeta makes the cache's key and namespace index functions
// (meta.Accessor) see the object's metadata.
func (f *invalidFunction) GetObjectMeta() metav1.Object { return f.fn }

// convertFunction converts a stored Function and validates it. On error
// the Function returned still carries the object's metadata (namespace,
// name, UID, generation, deletion), and its status when that converts, and
// the error names the fields at fault.
func convertFunction(u *unstructured.Unstructured) (*v1alpha1.Function, error) {
	fn := &v1alpha1.Function{}
	err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, fn)
	if err != nil {
		fn = &v1alpha1.Function{}
		fn.APIVersion, fn.Kind = u.GetAPIVersion(), u.GetKind()
		if m, ok := u.Object["metadata"].(map[string]any); !ok ||
			runtime.DefaultUnstructuredConverter.FromUnstructured(m, &fn.ObjectMeta) != nil {
			// The getters tolerate what the converter refuses.
			fn.ObjectMeta = metav1.ObjectMeta{
				Namespace: u.GetNamespace(), Name: u.GetName(), UID: u.GetUID(),
				Generation: u.GetGeneration(), ResourceVersion: u.GetResourceVersion(),
				CreationTimestamp: u.GetCreationTimestamp(), DeletionTimestamp: u.GetDeletionTimestamp(),
			}
		}
		if m, ok := u.Object["status"].(map[string]any); ok {
			if runtime.DefaultUnstructuredConverter.FromUnstructured(m, &fn.Status) != nil {
				fn.Status = v1alpha1.FunctionStatus{}
			}
		}
		err = locateConversionError(u.Object, err)
	} else if err = int32Overflow(u.Object); err == nil {
		err = validate(fn)
	}
	fn.ManagedFields = nil
	return fn, err
}

// locateConversionError narrows err, the converter's error for the whole
// object, down to the fields that fail on their own ("spec.idleTimeout:
// time: unknown unit ..."): the converter's own message does not say
// which field it choked on.
func locateConversionError(obj map[string]any, err error) error {
	convert := func(part map[string]any) error {
		return runtime.DefaultUnstructuredConverter.FromUnstructured(part, &v1alpha1.Function{})
	}
	if errs := badFields("", obj, convert); len(errs) > 0 {
		return errors.Join(errs...)
	}
	return err
}

// maxErrorDepth bounds how deep badFields looks for the field at fault.
const maxErrorDepth = 4

// int32Paths are the spec's int32 fields.
var int32Paths = [][]string{
	{"port"}, {"minInstances"}, {"maxInstances"}, {"concurrencyLimit"},
	{"scaling", "targetInFlight"}, {"scaling", "targetCPUMilli"}, {"scaling", "targetMemoryMiB"},
}

// int32Overflow reports the spec's int32 fields that hold an integer out of
// int32's range: the converter wraps them silently (2^32+1 would read as 1).
func int32Overflow(obj map[string]any) error {
	var errs []error
	for _, p := range int32Paths {
		v, ok, _ := unstructured.NestedFieldNoCopy(obj, append([]string{"spec"}, p...)...)
		if n, isInt := v.(int64); ok && isInt && (n < math.MinInt32 || n > math.MaxInt32) {
			errs = append(errs, fmt.Errorf("spec.%s: %d does not fit in 32 bits", strings.Join(p, "."), n))
		}
	}
	return errors.Join(errs...)
}

// badFields returns an error per field of m (at path) that convert refuses
// on its own, descending into objects to name the innermost field at fault
// (at most maxErrorDepth levels: a Function is three deep, and a stored
// object can be nested much deeper). convert converts a map of the fields
// at path, wrapped back to the root.
func badFields(path string, m map[string]any, convert func(map[string]any) error) []error {
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(m)) {
		err := convert(map[string]any{k: m[k]})
		if err == nil {
			continue
		}
		p := k
		if path != "" {
			p = path + "." + k
		}
		if sub, ok := m[k].(map[string]any); ok && len(sub) > 0 && strings.Count(p, ".") < maxErrorDepth {
			if inner := badFields(p, sub, func(s map[string]any) error { return convert(map[string]any{k: s}) }); len(inner) > 0 {
				errs = append(errs, inner...)
				continue
			}
		}
		errs = append(errs, fmt.Errorf("%s: %w", p, err))
	}
	return errs
}

// validate checks what the CRD's schema and CEL rules check (see the
// bounds in package v1alpha1), on an object that converted: the controller
// acts only on a Function that passes, wherever it came from. The error
// joins one error per field at fault, each naming the field.
func validate(fn *v1alpha1.Function) error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...)))
	}
	dnsLabel := func(field, v string) {
		if msgs := validation.IsDNS1123Label(v); len(msgs) > 0 {
			bad(field, "%q is not a DNS label: %s", v, strings.Join(msgs, "; "))
		}
	}
	between := func(field string, v, lo, hi int64) {
		if v < lo || v > hi {
			bad(field, "%d is outside %d..%d", v, lo, hi)
		}
	}
	dnsLabel("metadata.name", fn.Name)
	s := &fn.Spec
	dnsLabel("spec.pool", s.Pool)
	between("spec.port", int64(s.Port), 0, 65535)
	between("spec.minInstances", int64(s.MinInstances), 0, v1alpha1.MaxMinInstances)
	between("spec.maxInstances", int64(s.MaxInstances), 1, v1alpha1.MaxMaxInstances)
	if s.MinInstances > s.MaxInstances {
		bad("spec.minInstances", "%d exceeds spec.maxInstances %d", s.MinInstances, s.MaxInstances)
	}
	between("spec.concurrencyLimit", int64(s.ConcurrencyLimit), 0, v1alpha1.MaxConcurrencyLimit)
	between("spec.maxBodyBytes", s.MaxBodyBytes, 0, v1alpha1.MaxMaxBodyBytes)
	if s.Scaling.TargetInFlight != 0 { // 0: unset, the default applies
		between("spec.scaling.targetInFlight", int64(s.Scaling.TargetInFlight), 1, v1alpha1.MaxTargetInFlight)
	}
	between("spec.scaling.targetCPUMilli", int64(s.Scaling.TargetCPUMilli), 0, v1alpha1.MaxTargetCPUMilli)
	between("spec.scaling.targetMemoryMiB", int64(s.Scaling.TargetMemoryMiB), 0, v1alpha1.MaxTargetMemoryMiB)
	duration := func(field string, d *metav1.Duration, lo, hi time.Duration) {
		if d != nil && (d.Duration < lo || d.Duration > hi) {
			bad(field, "%s is outside %s..%s", d.Duration, lo, hi)
		}
	}
	duration("spec.idleTimeout", s.IdleTimeout, v1alpha1.MinIdleTimeout, v1alpha1.MaxIdleTimeout)
	duration("spec.timeout", s.Timeout, v1alpha1.MinTimeout, v1alpha1.MaxTimeout)
	if n := len(s.Config); n > v1alpha1.MaxConfigEntries {
		bad("spec.config", "%d entries, more than %d", n, v1alpha1.MaxConfigEntries)
	}
	for _, k := range slices.Sorted(maps.Keys(s.Config)) {
		// Lengths in characters, as the CRD's CEL size() counts them.
		if n := utf8.RuneCountInString(k); n < 1 || n > v1alpha1.MaxConfigKeyLength {
			bad("spec.config", "key %.40q has %d characters, want 1..%d", k, n, v1alpha1.MaxConfigKeyLength)
		}
		if n := utf8.RuneCountInString(s.Config[k]); n > v1alpha1.MaxConfigValueLength {
			bad("spec.config", "value of key %.40q has %d characters, more than %d", k, n, v1alpha1.MaxConfigValueLength)
		}
	}
	validateCallers(&s.Callers, bad)
	return errors.Join(errs...)
}

// validateCallers checks spec.callers as the CRD schema does.
func validateCallers(c *v1alpha1.Callers, bad func(field, format string, a ...any)) {
	if n := len(c.Namespaces); n > v1alpha1.MaxCallers {
		bad("spec.callers.namespaces", "%d entries, more than %d", n, v1alpha1.MaxCallers)
	}
	for _, ns := range c.Namespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			bad("spec.callers.namespaces", "%.70q is not a namespace name: %s", ns, strings.Join(msgs, "; "))
		}
	}
	if n := len(c.ServiceAccounts); n > v1alpha1.MaxCallers {
		bad("spec.callers.serviceAccounts", "%d entries, more than %d", n, v1alpha1.MaxCallers)
	}
	for _, sa := range c.ServiceAccounts {
		ns, name, ok := strings.Cut(sa, "/")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			bad("spec.callers.serviceAccounts", "%.70q is not <namespace>/<name> of a ServiceAccount", sa)
		}
	}
}

// invalidMessage is err as one line fit for a condition or an Event,
// shortened past maxInvalidMessage bytes (a stored value can be large).
func invalidMessage(err error) string {
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	if len(msg) <= maxInvalidMessage {
		return msg
	}
	cut := maxInvalidMessage
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}

const maxInvalidMessage = 1024
