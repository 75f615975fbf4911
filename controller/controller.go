package controller

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/ring"
	"skipper.dev/skipper/internal/tick"
)

// controller is one replica's state: informer caches, the ring as this
// replica sees it, per-function generations and claims, and router streams.
// Its loops (informers, work queues) run on wg until the run context ends.
type controller struct {
	cfg  Config
	self string // advertise address: this replica's ring member
	log  *slog.Logger
	core kubernetes.Interface
	dyn  dynamic.Interface

	cache   *kubeCache
	key     atomic.Pointer[assignKey] // swapped when the Secret changes
	keyMu   sync.Mutex                // serialises reloadAssignKey
	metrics *metrics
	http    *http.Client // to instances' assign endpoints
	preconn *preconnects // the pool pods c.http holds a connection to
	fwd     *forwarder
	hub     *hub

	ring atomic.Pointer[ring.Ring] // nil while no member is ready

	// nsQueue holds namespaces whose key ConfigMap needs reconciling;
	// fnQueue holds function keys whose instance set needs recomputing;
	// ringQueue holds the single key "" when the ring or the set of
	// functions changed; poolQueue holds pool keys ("namespace/pool")
	// whose autoscaled replicas need deciding.
	nsQueue, fnQueue, ringQueue, poolQueue workqueue.TypedRateLimitingInterface[string]
	// svcQueue holds function keys whose own Service needs keeping
	// (service.go); svcStates what the last sync found, by function key,
	// under mu.
	svcQueue  workqueue.TypedRateLimitingInterface[string]
	svcStates map[string]serviceState

	pools poolStats // claims and pod starts per pool, for the pool autoscaler

	podsChanged broadcast // woken on every pool pod event; claim waiters re-check

	// claimSlots bounds the claims patching and assigning at once
	// (--max-parallel-claims).
	claimSlots chan struct{}

	events   record.EventBroadcaster
	recorder record.EventRecorder

	// claims is the claim bookkeeping: flights, reservations, assumed,
	// held, recording and retired pods, under its own lock.
	//
	// Lock order: mu, then claims.mu, then poolStats.mu (pools); a
	// supervisor's mu is taken alone (or under mu, for a supervisor not
	// yet shared); hub, broadcast and limiter locks are leaves. See claims.
	claims *claims

	mu       sync.Mutex
	fns      map[string]*fnState    // by function key, for functions this replica answered for or owns
	sups     map[string]*supervisor // running supervisors, by function key
	statusAt map[string]time.Time   // last status write, by function key
	owned    map[string]bool        // functions this replica owned at the last ring sync
	// ringSynced is set after the first ring sync.
	ringSynced bool

	// runCtx ends when the controller stops; work not tied to one caller
	// (claims shared by several callers) runs under it.
	runCtx context.Context
	wg     sync.WaitGroup
	// reassigning: instances being handed their function's callers again
	// (reassign.go); probing: pool pods routers report as instances, being
	// asked what they hold (probe.go).
	reassigning, probing podWork
}

// fnState is what this replica last told routers about a function.
type fnState struct {
	gen    uint64
	set    []instance
	config functionConfig
}

type functionConfig struct {
	ConcurrencyLimit uint32
	Oneshot          bool
	Timeout          time.Duration
	MaxBodyBytes     int64 // 0: the router's
	Callers          callerPolicy
}

func configOf(fn *v1alpha1.Function) functionConfig {
	return functionConfig{
		ConcurrencyLimit: uint32(max(fn.Spec.ConcurrencyLimit, 0)),
		Oneshot:          fn.Spec.Oneshot,
		Timeout:          fn.Spec.TimeoutOrZero(),
		MaxBodyBytes:     max(fn.Spec.MaxBodyBytes, 0),
		Callers:          callerPolicyOf(&fn.Spec.Callers),
	}
}

// broadcast wakes every waiter once per notify.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

func (b *broadcast) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}

func newController(cfg Config, self string, log *slog.Logger, cl clients, key assignKey, m *metrics) (*controller, error) {
	wcore, wdyn := cl.watch()
	c := &controller{
		cfg: cfg, self: self, log: log, core: cl.core, dyn: cl.dyn,
		cache:   newKubeCache(wcore, wdyn, cfg),
		metrics: m,
		// Kept-alive connections to instances, one per pool pod at most:
		// the assign goes out on the one preconnect opened.
		// A dial has assignDialTimeout of the assign's time: a pod the
		// cache still lists but which is gone costs a claim that much
		// before it tries the next.
		http: &http.Client{Transport: &http.Transport{
			DialContext:  (&net.Dialer{Timeout: assignDialTimeout}).DialContext,
			MaxIdleConns: 1024, MaxIdleConnsPerHost: 1, IdleConnTimeout: assignIdleTimeout,
			DisableCompression: true,
		}},
		preconn: newPreconnects(),
		fwd:     newForwarder(cfg.TokenFile),
		hub:     newHub(),
		nsQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "namespaces"}),
		fnQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "functions"}),
		ringQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "ring"}),
		poolQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "pools"}),
		svcQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "services"}),
		svcStates:  map[string]serviceState{},
		claimSlots: make(chan struct{}, cfg.MaxParallelClaims),
		fns:        map[string]*fnState{},
		sups:       map[string]*supervisor{},
		statusAt:   map[string]time.Time{},
		owned:      map[string]bool{},
	}
	c.key.Store(&key)
	c.claims = newClaims(c.owns, m.unrecorded)
	c.addHandlers()
	return c, nil
}

func (c *controller) addHandlers() {
	for _, s := range c.cache.sets {
		_, _ = s.functions.AddEventHandler(eventHandler(func(obj any) {
			fn := functionMeta(obj) // invalid ones too: their owner reports them
			if fn == nil {
				return
			}
			c.nsQueue.Add(fn.Namespace)
			c.fnQueue.Add(fn.Key())
			c.ringQueue.Add("")
		}))
		_, _ = s.deployments.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.poolChanged(obj, false) },
			UpdateFunc: func(_, obj any) { c.poolChanged(obj, false) },
			DeleteFunc: func(obj any) { c.poolChanged(tombstone(obj), true) },
		})
		_, _ = s.configMaps.AddEventHandler(eventHandler(func(obj any) {
			if cm, ok := obj.(*corev1.ConfigMap); ok {
				c.nsQueue.Add(cm.Namespace)
			}
		}))
		_, _ = s.services.AddEventHandler(eventHandler(func(obj any) {
			if svc, ok := obj.(*corev1.Service); ok {
				c.svcQueue.Add(svc.Namespace + "/" + svc.Name)
			}
		}))
		_, _ = s.pods.AddEventHandler(eventHandler(func(obj any) {
			p, ok := obj.(*corev1.Pod)
			if !ok {
				return
			}
			if name, ok := p.Labels[v1alpha1.LabelFunction]; ok {
				c.fnQueue.Add(p.Namespace + "/" + name)
			}
			c.podsChanged.notify()
		}))
		_, _ = s.pods.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
			AddFunc:    func(obj any, initial bool) { c.poolPodEvent(obj, !initial, false) },
			UpdateFunc: func(_, obj any) { c.poolPodEvent(obj, true, false) },
			DeleteFunc: func(obj any) { c.poolPodEvent(tombstone(obj), false, true) },
		})
	}
	_, _ = c.cache.endpointSlices.AddEventHandler(eventHandler(func(any) { c.ringQueue.Add("") }))
}

// measureLag sets skipper_controller_informer_lag_seconds every
// --scale-interval until ctx ends: the age of the oldest claim the informer
// does not show yet, or, with none outstanding, how long it took to show
// the last one. A stalled watch thus shows as a growing lag (up to
// assumedTTL) rather than as the last good figure.
func (c *controller) measureLag(ctx context.Context) {
	tick.After(ctx, c.cfg.ScaleInterval, func(now time.Time) {
		c.metrics.informerLag.Set(c.claims.lag(now).Seconds())
	})
}

// start runs the informers and work queues on c.wg; they stop when ctx ends.
func (c *controller) start(ctx context.Context) {
	c.events = record.NewBroadcaster(record.WithContext(ctx))
	c.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.core.CoreV1().Events("")})
	scheme := runtime.NewScheme()
	_ = v1alpha1.AddToScheme(scheme)
	_ = appsv1.AddToScheme(scheme) // Events on pool Deployments
	c.recorder = c.events.NewRecorder(scheme, corev1.EventSource{Component: "skipper-controller", Host: c.cfg.PodName})
	c.mu.Lock()
	c.runCtx = ctx
	c.mu.Unlock()
	c.cache.run(ctx, &c.wg)
	c.wg.Go(func() { c.measureLag(ctx) })
	c.wg.Go(func() { c.watchAssignKey(ctx) })
	c.wg.Go(func() { c.renewPreconnects(ctx) })
	for _, q := range []struct {
		name string
		q    workqueue.TypedRateLimitingInterface[string]
		f    func(context.Context, string) error
	}{
		{"namespaces", c.nsQueue, c.syncNamespace},
		{"functions", c.fnQueue, c.syncFunction},
		{"ring", c.ringQueue, func(ctx context.Context, _ string) error { c.syncRing(); c.enqueuePools(); return nil }},
		{"pools", c.poolQueue, c.syncPool},
		{"services", c.svcQueue, c.syncService},
	} {
		c.wg.Go(func() { c.runQueue(ctx, q.name, q.q, q.f) })
	}
	c.wg.Go(func() {
		<-ctx.Done()
		c.shutDownQueues()
		c.podsChanged.notify()
	})
}

// shutDownQueues shuts every work queue down (their workers return).
func (c *controller) shutDownQueues() {
	for _, q := range []workqueue.TypedRateLimitingInterface[string]{c.nsQueue, c.fnQueue, c.ringQueue, c.poolQueue, c.svcQueue} {
		q.ShutDown()
	}
}

// stop waits for every goroutine start and the claims began; ctx must
// have ended.
func (c *controller) stop() {
	c.wg.Wait()
	c.http.CloseIdleConnections() // every request to an instance has ended
	c.fwd.close()
	c.events.Shutdown()
}

// event records an Event about fn; the broadcaster aggregates repeats.
func (c *controller) event(fn *v1alpha1.Function, typ, reason, format string, a ...any) {
	if c.recorder != nil {
		c.recorder.Eventf(fn, typ, reason, format, a...)
	}
}

func (c *controller) runQueue(ctx context.Context, name string, q workqueue.TypedRateLimitingInterface[string], f func(context.Context, string) error) {
	for {
		k, shutdown := q.Get()
		if shutdown {
			return
		}
		func() {
			defer q.Done(k)
			// Work waits for the caches: acting on a partial view would
			// recreate what exists or drop what is merely unseen.
			if !c.cache.waitSynced(ctx) {
				return
			}
			if err := f(ctx, k); err != nil {
				c.log.Warn("sync failed, will retry", "queue", name, "key", k, "err", err)
				q.AddRateLimited(k)
				return
			}
			q.Forget(k)
		}()
	}
}

// syncNamespace keeps ConfigMap skipper-assign-key in ns while ns holds a
// pool or a Function, and removes the one the controller made once it
// holds neither.
func (c *controller) syncNamespace(ctx context.Context, ns string) error {
	if !c.cache.needsKey(ns) {
		deleted, err := deleteKeyConfigMap(ctx, c.core, c.cache.configMap(ns))
		if deleted {
			c.log.Info("deleted the assign key ConfigMap: the namespace has no pool and no Function", "namespace", ns)
		}
		return err
	}
	return publishKeyConfigMap(ctx, c.core, ns, c.cache.configMap(ns), c.key.Load(), c.reloadAssignKey)
}

// syncFunction recomputes one function's instance set, bumps its generation
// when the set changed, pushes the change to subscribed routers, and keeps
// its metrics and status.
func (c *controller) syncFunction(ctx context.Context, key string) error {
	ns, name, _ := splitKey(key)
	fn, inv, err := c.cache.lookup(ns, name)
	if err == nil && inv != nil && inv.fn.DeletionTimestamp != nil {
		fn = inv.fn // being deleted: nothing in its spec matters
	}
	if err != nil || fn != nil && fn.DeletionTimestamp != nil {
		c.forget(key, true, err != nil)
		if c.owns(key) {
			return c.deleteOrphans(ctx, key, c.cache.functionPods(ns, name))
		}
		return nil
	}
	c.metrics.functionAdded(key)
	if !c.owns(key) {
		c.forget(key, false, false)
		return nil
	}
	if inv != nil {
		return c.reportInvalid(ctx, inv, time.Now())
	}
	c.svcQueue.Add(key) // its own Service, on a queue of its own
	pods := c.cache.functionPods(ns, name)
	if err := c.deleteOrphans(ctx, key, pods); err != nil {
		return err
	}
	claimed := 0
	for _, p := range pods {
		if ownedBy(p, fn) && p.DeletionTimestamp == nil {
			claimed++
		}
	}
	// A function that keeps instances, or has some, needs its supervisor;
	// one without is started by its first reference.
	sup, _ := c.supervisorFor(key, fn.Spec.MinInstances > 0 || claimed > 0, nil)

	port, perr := c.port(fn)
	var set []instance
	if perr == nil {
		st, changed := c.observe(fn, c.currentSet(fn, port, nil), time.Now())
		if changed {
			c.hub.publish(key, st.update(fn))
		}
		set = st.set
	}
	if sup != nil {
		return nil // the supervisor writes metrics and status every tick
	}
	c.metrics.setInstances(key, nil)
	// No supervisor: nothing desired, nothing held.
	return c.writeStatus(ctx, fn, statusView{desired: 0, ready: int32(len(set)), poolErr: perr}, time.Now())
}

// reportInvalid is the owner's whole sync of a Function it cannot act on:
// no claim, scaling or orphan cleanup (a supervisor still running stops on
// its next tick, which finds no Function to act on), routers keep the set
// they hold, and the Function's status says why (condition Degraded, reason
// InvalidSpec) with a Warning Event when that is news. Fixing the object
// brings the next sync back to the usual path, which sets Degraded False.
func (c *controller) reportInvalid(ctx context.Context, inv *invalidFunction, now time.Time) error {
	fn, msg := inv.fn, invalidMessage(inv.err)
	if !degradedSays(fn, msg) {
		c.log.Warn("function has an invalid spec: not acted on until it is fixed", "function", fn.Key(), "err", msg)
		c.event(fn, corev1.EventTypeWarning, reasonInvalidSpec, "%s", msg)
	}
	return c.writeStatus(ctx, fn, statusView{invalid: msg}, now)
}

// forget drops this replica's state of key. withdraw means the Function is
// being deleted or is gone: subscribed routers are told to drop it. Without
// it ownership moved: routers keep routing with the set they hold, this
// replica stops pushing, and the new owner picks the routers up from their
// reports. deleted also drops the function's series.
func (c *controller) forget(key string, withdraw, deleted bool) {
	c.mu.Lock()
	st, had := c.fns[key]
	delete(c.fns, key)
	delete(c.svcStates, key)
	c.claims.forget(key)
	sup := c.sups[key]
	c.mu.Unlock()
	if deleted {
		c.metrics.functionRemoved(key)
	} else {
		c.metrics.instances.DeletePartialMatch(map[string]string{"function": key})
	}
	if sup != nil {
		// A supervisor still running (ownership may come back before it
		// notices) writes its series again rather than trust its cache.
		sup.rewrite.Store(true)
	}
	switch {
	case had && withdraw:
		ns, name, _ := splitKey(key)
		c.hub.publish(key, removedUpdate(ns, name, nextGeneration(st.gen, time.Now())))
	case !withdraw:
		c.hub.unsubscribeAll(key)
	}
}

// observe records set as the function's current instance set and returns
// its state, bumping the generation when the set or config changed (or
// this is the first observation).
func (c *controller) observe(fn *v1alpha1.Function, set []instance, now time.Time) (fnState, bool) {
	cfg := configOf(fn)
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.fns[fn.Key()]
	if ok && sameInstances(st.set, set) && st.config == cfg {
		return *st, false
	}
	if !ok {
		st = &fnState{}
		c.fns[fn.Key()] = st
	}
	st.gen = nextGeneration(st.gen, now)
	st.set = set
	st.config = cfg
	return *st, true
}

// resolve finds the function's pool Deployment and instance port.
func (c *controller) resolve(fn *v1alpha1.Function) (*appsv1.Deployment, int32, error) {
	pool := poolDeployment(c.cache.poolDeployments(fn.Namespace, fn.Spec.Pool))
	if pool == nil {
		return nil, 0, withReason(ErrPoolNotFound, "pool %s/%s of function %s not found: no Deployment in %s labelled %s=%s",
			fn.Namespace, fn.Spec.Pool, fn.Key(), fn.Namespace, v1alpha1.LabelPool, fn.Spec.Pool)
	}
	port, err := instancePort(fn, pool)
	if err != nil {
		return nil, 0, err
	}
	return pool, port, nil
}

func (c *controller) port(fn *v1alpha1.Function) (int32, error) {
	_, port, err := c.resolve(fn)
	return port, err
}
