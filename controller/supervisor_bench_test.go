package controller

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// BenchmarkConvergeTick is one supervisor tick for every one of 10,000
// owned functions on one replica, each holding one ready instance at its
// desired count: the steady state, where a tick reads the caches and the
// report window, decides, and writes nothing.
func BenchmarkConvergeTick(b *testing.B) {
	const functions = 10000
	cfg := validConfig()
	cfg.StatusInterval = time.Hour
	core := fake.NewClientset()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.Resource: "FunctionList"})
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	c, err := newController(cfg, "127.0.0.1:9090", slog.New(slog.NewTextHandler(io.Discard, nil)), core, dyn, key, newMetrics())
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		c.nsQueue.ShutDown()
		c.fnQueue.ShutDown()
		c.ringQueue.ShutDown()
	}()
	set := c.cache.set("default")
	if err := set.deployments.GetIndexer().Add(poolDeploy("echo")); err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	sups := make([]*supervisor, 0, functions)
	for i := range functions {
		fn := testFunction(fmt.Sprintf("fn-%05d", i))
		fn.Spec.MaxInstances = 10
		if err := set.functions.GetIndexer().Add(fn); err != nil {
			b.Fatal(err)
		}
		pod := testPod(fmt.Sprintf("pod-%05d", i), claimedBy(fn))
		if err := set.pods.GetIndexer().Add(pod); err != nil {
			b.Fatal(err)
		}
		s := newSupervisor(c, fn.Key(), fn, now)
		s.window.Touch(now)
		c.sups[fn.Key()] = s
		sups = append(sups, s)
		u, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(fn)
		us := &unstructured.Unstructured{Object: u}
		us.SetAPIVersion(v1alpha1.SchemeGroupVersion.String())
		us.SetKind("Function")
		if _, err := dyn.Resource(v1alpha1.Resource).Namespace("default").Create(context.Background(), us, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	// One tick writes every status; the cache then shows what was written,
	// as the informer would, so later ticks find nothing to write.
	for _, s := range sups {
		s.tick(ctx, now)
	}
	for _, s := range sups {
		ns, name, _ := splitKey(s.key)
		u, err := dyn.Resource(v1alpha1.Resource).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		fn, err := toFunction(u)
		if err != nil {
			b.Fatal(err)
		}
		if err := set.functions.GetIndexer().Update(fn); err != nil {
			b.Fatal(err)
		}
	}
	writes := len(dyn.Actions())
	sups[0].tick(ctx, time.Now())
	if n := len(dyn.Actions()); n != writes {
		b.Fatalf("a steady-state tick called the API: %v", dyn.Actions()[writes:])
	}
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now()
		for _, s := range sups {
			if !s.tick(ctx, now) {
				b.Fatal("supervisor stopped in steady state")
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/functions, "ns/function")
	if d := sups[0].desired; d != 1 {
		b.Fatalf("desired = %d, want 1", d)
	}
}
