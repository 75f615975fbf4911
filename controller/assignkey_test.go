package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

func TestEnsureKeyConfigMap(t *testing.T) {
	const pem = "PEM-NEW"
	cm := func(data string) *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: v1alpha1.AssignKeyConfigMap},
			Data:       map[string]string{v1alpha1.AssignKeyConfigMapKey: data, "other": "kept"},
		}
	}
	tests := []struct {
		name       string
		live       *corev1.ConfigMap // in the API
		cached     *corev1.ConfigMap // in the informer
		wantWrites []string          // verbs
	}{
		{name: "missing: create", wantWrites: []string{"create"}},
		{name: "current: no write", live: cm(pem), cached: cm(pem)},
		{name: "stale: patch", live: cm("OLD"), cached: cm("OLD"), wantWrites: []string{"patch"}},
		{name: "cache lags behind a create: create, then patch", live: cm("OLD"), wantWrites: []string{"create", "patch"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core := fake.NewClientset()
			if tt.live != nil {
				if err := core.Tracker().Add(tt.live); err != nil {
					t.Fatal(err)
				}
			}
			core.ClearActions()
			if err := ensureKeyConfigMap(context.Background(), core, "default", tt.cached, []byte(pem)); err != nil {
				t.Fatal(err)
			}
			var writes []string
			for _, a := range core.Actions() {
				if a.GetVerb() != "get" && a.GetVerb() != "list" {
					writes = append(writes, a.GetVerb())
				}
			}
			if len(writes) != len(tt.wantWrites) {
				t.Fatalf("writes = %v, want %v", writes, tt.wantWrites)
			}
			for i := range writes {
				if writes[i] != tt.wantWrites[i] {
					t.Fatalf("writes = %v, want %v", writes, tt.wantWrites)
				}
			}
			got, err := core.CoreV1().ConfigMaps("default").Get(context.Background(), v1alpha1.AssignKeyConfigMap, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Data[v1alpha1.AssignKeyConfigMapKey] != pem {
				t.Errorf("data = %v, want the key %q", got.Data, pem)
			}
			if tt.live != nil && got.Data["other"] != "kept" {
				t.Errorf("patch dropped other keys: %v", got.Data)
			}
		})
	}
}
