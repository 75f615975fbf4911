package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	appsinformers "k8s.io/client-go/informers/apps/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// Index names on the informer caches.
const (
	// indexFunction maps a claimed pod to "namespace/<skipper.dev/function>".
	indexFunction = "function"
	// indexPool maps an unclaimed pool pod, and a pool Deployment, to
	// "namespace/<skipper.dev/pool>".
	indexPool = "pool"
)

// informerSet is what one watched namespace (or all of them) contributes.
type informerSet struct {
	pods, deployments, functions, configMaps cache.SharedIndexInformer
	// services are every Service (slimmed: slimService), for the
	// Functions' own (service.go) and the names others took.
	services cache.SharedIndexInformer
}

// kubeCache holds the controller's informers and answers lookups from them.
// It is read-only once started; the informers keep it current.
type kubeCache struct {
	all  bool                    // watching all namespaces: sets has the single key ""
	sets map[string]*informerSet // by namespace
	// endpointSlices of the controller Service, in the controller's namespace.
	endpointSlices cache.SharedIndexInformer
}

func newKubeCache(core kubernetes.Interface, dyn dynamic.Interface, cfg Config) *kubeCache {
	c := &kubeCache{sets: map[string]*informerSet{}}
	nss := cfg.Namespaces
	if len(nss) == 0 {
		c.all = true
		nss = []string{metav1.NamespaceAll}
	}
	resync := cfg.ResyncPeriod
	byNS := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	// Pool pods and claimed pods both carry the pool label (claiming adds the
	// function label and keeps the template's labels), so one selector
	// covers both and the cache holds no unrelated pods.
	poolSel := func(o *metav1.ListOptions) { o.LabelSelector = v1alpha1.LabelPool }
	for _, ns := range nss {
		s := &informerSet{
			pods: coreinformers.NewFilteredPodInformer(core, ns, resync, cache.Indexers{
				cache.NamespaceIndex: cache.MetaNamespaceIndexFunc,
				indexFunction:        podFunctionIndex,
				indexPool:            podPoolIndex,
			}, poolSel),
			deployments: appsinformers.NewFilteredDeploymentInformer(core, ns, resync, cache.Indexers{
				cache.NamespaceIndex: cache.MetaNamespaceIndexFunc,
				indexPool:            deploymentPoolIndex,
			}, poolSel),
			functions: dynamicinformer.NewFilteredDynamicInformer(dyn, v1alpha1.Resource, ns, resync, byNS, nil).Informer(),
			configMaps: coreinformers.NewFilteredConfigMapInformer(core, ns, resync, byNS, func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", v1alpha1.AssignKeyConfigMap).String()
			}),
		}
		s.services = coreinformers.NewServiceInformer(core, ns, resync, byNS)
		_ = s.services.SetTransform(slimService)
		_ = s.pods.SetTransform(stripManagedFields)
		_ = s.deployments.SetTransform(stripManagedFields)
		_ = s.functions.SetTransform(toFunction)
		c.sets[ns] = s
	}
	c.endpointSlices = discoveryinformers.NewFilteredEndpointSliceInformer(core, cfg.PodNamespace, resync, byNS,
		func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + "=" + cfg.ControllerService
		})
	return c
}

func (c *kubeCache) informers() []cache.SharedIndexInformer {
	out := []cache.SharedIndexInformer{c.endpointSlices}
	for _, s := range c.sets {
		out = append(out, s.pods, s.deployments, s.functions, s.configMaps, s.services)
	}
	return out
}

// run starts every informer on wg and returns; they stop when ctx ends.
func (c *kubeCache) run(ctx context.Context, wg *sync.WaitGroup) {
	for _, inf := range c.informers() {
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
}

// synced reports whether every informer has completed its initial list.
func (c *kubeCache) synced() bool {
	for _, inf := range c.informers() {
		if !inf.HasSynced() {
			return false
		}
	}
	return true
}

// waitSynced blocks until synced or ctx ends.
func (c *kubeCache) waitSynced(ctx context.Context) bool {
	var fns []cache.InformerSynced
	for _, inf := range c.informers() {
		fns = append(fns, inf.HasSynced)
	}
	return cache.WaitForCacheSync(ctx.Done(), fns...)
}

// set returns the informers that cover ns, or nil when ns is not watched.
func (c *kubeCache) set(ns string) *informerSet {
	if c.all {
		return c.sets[metav1.NamespaceAll]
	}
	return c.sets[ns]
}

// needsKey reports whether ns holds a pool Deployment or a Function.
func (c *kubeCache) needsKey(ns string) bool {
	s := c.set(ns)
	if s == nil {
		return false
	}
	for _, inf := range []cache.SharedIndexInformer{s.deployments, s.functions} {
		objs, _ := inf.GetIndexer().ByIndex(cache.NamespaceIndex, ns)
		if len(objs) > 0 {
			return true
		}
	}
	return false
}

// function returns the Function ns/name to act on. A stored object the
// controller cannot act on answers ErrInvalidSpec with the reason: no
// decision (claim, scaling, GetInstance) ever sees it.
func (c *kubeCache) function(ns, name string) (*v1alpha1.Function, error) {
	fn, inv, err := c.lookup(ns, name)
	if err != nil {
		return nil, err
	}
	if inv != nil {
		return nil, withReason(ErrInvalidSpec, "function %s/%s has an invalid spec: %s", ns, name, invalidMessage(inv.err))
	}
	return fn, nil
}

// lookup returns what the cache holds for ns/name: a Function, or an
// object the controller cannot act on (for its owner to report).
func (c *kubeCache) lookup(ns, name string) (*v1alpha1.Function, *invalidFunction, error) {
	s := c.set(ns)
	if s == nil {
		return nil, nil, withReason(ErrNotWatched, "function %s/%s not found: namespace %q is not watched by this controller", ns, name, ns)
	}
	obj, ok, err := s.functions.GetIndexer().GetByKey(ns + "/" + name)
	if err != nil {
		return nil, nil, fmt.Errorf("function cache: %w", err)
	}
	if !ok {
		return nil, nil, withReason(ErrFunctionNotFound, "function %s/%s not found", ns, name)
	}
	switch o := obj.(type) {
	case *v1alpha1.Function:
		return o, nil, nil
	case *invalidFunction:
		return nil, o, nil
	}
	return nil, nil, fmt.Errorf("function cache holds %T", obj)
}

// functionKeys returns the key of every cached Function, invalid ones
// included: each has an owner, which reports on it.
func (c *kubeCache) functionKeys() []string {
	var out []string
	for _, s := range c.sets {
		out = append(out, s.functions.GetIndexer().ListKeys()...)
	}
	return out
}

func (c *kubeCache) poolDeployments(ns, pool string) []*appsv1.Deployment {
	s := c.set(ns)
	if s == nil {
		return nil
	}
	return byIndex[*appsv1.Deployment](s.deployments, indexPool, ns+"/"+pool)
}

func (c *kubeCache) functionPods(ns, name string) []*corev1.Pod {
	s := c.set(ns)
	if s == nil {
		return nil
	}
	return byIndex[*corev1.Pod](s.pods, indexFunction, ns+"/"+name)
}

func (c *kubeCache) poolPods(ns, pool string) []*corev1.Pod {
	s := c.set(ns)
	if s == nil {
		return nil
	}
	return byIndex[*corev1.Pod](s.pods, indexPool, ns+"/"+pool)
}

// unclaimedPoolPods returns every cached pool pod no function claimed, of
// every pool.
func (c *kubeCache) unclaimedPoolPods() []*corev1.Pod {
	var out []*corev1.Pod
	for _, s := range c.sets {
		idx := s.pods.GetIndexer()
		for _, key := range idx.ListIndexFuncValues(indexPool) {
			out = append(out, byIndex[*corev1.Pod](s.pods, indexPool, key)...)
		}
	}
	return out
}

// service returns the Service ns/name from the cache, nil when there is
// none (or ns is not watched).
func (c *kubeCache) service(ns, name string) *corev1.Service {
	s := c.set(ns)
	if s == nil {
		return nil
	}
	obj, ok, _ := s.services.GetIndexer().GetByKey(ns + "/" + name)
	if !ok {
		return nil
	}
	svc, _ := obj.(*corev1.Service)
	return svc
}

func (c *kubeCache) configMap(ns string) *corev1.ConfigMap {
	s := c.set(ns)
	if s == nil {
		return nil
	}
	obj, ok, _ := s.configMaps.GetIndexer().GetByKey(ns + "/" + v1alpha1.AssignKeyConfigMap)
	if !ok {
		return nil
	}
	cm, _ := obj.(*corev1.ConfigMap)
	return cm
}

// keyConfigMapNamespaces are the namespaces holding a cached ConfigMap
// skipper-assign-key.
func (c *kubeCache) keyConfigMapNamespaces() []string {
	var out []string
	for _, s := range c.sets {
		for _, o := range s.configMaps.GetIndexer().List() {
			if cm, ok := o.(*corev1.ConfigMap); ok {
				out = append(out, cm.Namespace)
			}
		}
	}
	return out
}

func (c *kubeCache) slices() []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, o := range c.endpointSlices.GetIndexer().List() {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			out = append(out, s)
		}
	}
	return out
}

func byIndex[T any](inf cache.SharedIndexInformer, index, value string) []T {
	objs, _ := inf.GetIndexer().ByIndex(index, value)
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

func podFunctionIndex(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	if fn, ok := p.Labels[v1alpha1.LabelFunction]; ok {
		return []string{p.Namespace + "/" + fn}, nil
	}
	return nil, nil
}

func podPoolIndex(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	if _, claimed := p.Labels[v1alpha1.LabelFunction]; claimed {
		return nil, nil
	}
	if pool, ok := p.Labels[v1alpha1.LabelPool]; ok {
		return []string{p.Namespace + "/" + pool}, nil
	}
	return nil, nil
}

func deploymentPoolIndex(obj any) ([]string, error) {
	d, ok := obj.(*appsv1.Deployment)
	if !ok {
		return nil, nil
	}
	if pool, ok := d.Labels[v1alpha1.LabelPool]; ok {
		return []string{d.Namespace + "/" + pool}, nil
	}
	return nil, nil
}

// stripManagedFields drops managedFields before objects enter the cache; the
// controller never reads them and they are most of a pod's size.
// slimService keeps of a Service what decideService reads: its name,
// owners and resourceVersion, its type and external name.
func slimService(obj any) (any, error) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return obj, nil
	}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svc.Name, Namespace: svc.Namespace, UID: svc.UID,
			ResourceVersion: svc.ResourceVersion, OwnerReferences: svc.OwnerReferences, DeletionTimestamp: svc.DeletionTimestamp},
		Spec: corev1.ServiceSpec{Type: svc.Spec.Type, ExternalName: svc.Spec.ExternalName},
	}, nil
}

func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// toFunction converts the dynamic informer's unstructured objects to typed
// Functions as they enter the cache, so lookups never convert. It never
// fails: an object that does not convert, or converts to a Function that
// fails validate, enters the cache as an *invalidFunction. (client-go
// aborts an informer's whole list when its transform fails, so one bad
// object would keep every replica's Function informer from syncing.)
func toFunction(obj any) (any, error) {
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		fn, err := convertFunction(o)
		if err != nil {
			return &invalidFunction{fn: fn, err: err}, nil
		}
		return fn, nil
	case cache.DeletedFinalStateUnknown:
		o.Obj, _ = toFunction(o.Obj)
		return o, nil
	}
	return obj, nil
}

// functionMeta returns the metadata of what the Function cache holds (a
// Function or an invalid one), or nil.
func functionMeta(obj any) *v1alpha1.Function {
	switch o := obj.(type) {
	case *v1alpha1.Function:
		return o
	case *invalidFunction:
		return o.fn
	}
	return nil
}

// tombstone unwraps a deleted object's final state.
func tombstone(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// eventHandler adapts one func to add, update and delete events.
func eventHandler(f func(obj any)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { f(obj) },
		UpdateFunc: func(_, obj any) { f(obj) },
		DeleteFunc: func(obj any) { f(tombstone(obj)) },
	}
}

// assumedTTL bounds how long a claim is remembered without the informer
// showing it; past it the cache is trusted again.
const assumedTTL = time.Minute
