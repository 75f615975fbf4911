package controller

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// FuzzToFunction feeds arbitrary JSON objects, decoded as the dynamic
// client decodes them, to the Function informer's transform: it never
// panics and never fails (a failing transform aborts the informer's whole
// list), what it caches keeps the object's key, and a Function it deems
// valid passes validate. Seeds: testdata/fuzz/FuzzToFunction.
func FuzzToFunction(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		var obj map[string]any
		if err := utiljson.Unmarshal(data, &obj); err != nil || obj == nil {
			return // not a JSON object: the API server serves none
		}
		u := &unstructured.Unstructured{Object: obj}
		ns, name, uid := u.GetNamespace(), u.GetName(), u.GetUID()
		got, err := toFunction(u)
		if err != nil {
			t.Fatalf("toFunction failed: %v", err)
		}
		var fn *v1alpha1.Function
		switch o := got.(type) {
		case *v1alpha1.Function:
			if err := validate(o); err != nil {
				t.Fatalf("cached as valid, but validate: %v", err)
			}
			fn = o
		case *invalidFunction:
			if o.err == nil || o.fn == nil {
				t.Fatalf("invalid function without a reason or metadata: %+v", o)
			}
			if invalidMessage(o.err) == "" {
				t.Fatal("invalid function with an empty reason")
			}
			fn = o.fn
		default:
			t.Fatalf("cached as %T", got)
		}
		if fn.Namespace != ns || fn.Name != name || fn.UID != uid {
			t.Fatalf("cached as %s/%s uid %q, want %s/%s uid %q", fn.Namespace, fn.Name, fn.UID, ns, name, uid)
		}
		if fn.ManagedFields != nil {
			t.Fatal("managedFields kept")
		}
	})
}
