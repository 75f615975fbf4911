package nodeagent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
)

// Run is the command line of bin/skipper-nodeagent.
func Run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a, err := New(*cfg, log)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// Agent is one node's kubelet stand-in.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	cs      kubernetes.Interface
	init    []string // the container init's argv (Config.ContainerInit)
	machine machine
	started time.Time
	nodeUID types.UID
	events  record.EventRecorder // pod events (Started, Killing, BackOff, ...)

	net     podNet
	cgroups podCgroups

	mu      sync.Mutex
	ipam    *IPAM
	workers map[types.UID]*podWorker
	wg      sync.WaitGroup
}

// New builds an agent from a validated Config.
func New(cfg Config, log *slog.Logger) (*Agent, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	rc.UserAgent = "skipper-nodeagent/" + cfg.NodeName
	rc.QPS, rc.Burst = 50, 100
	rc.ContentType = runtime.ContentTypeProtobuf // as the kubelet: cheaper for the API server
	rc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	init, err := containerInit(cfg.ContainerInit)
	if err != nil {
		return nil, err
	}
	ipam, err := NewIPAM(cfg.PodCIDR)
	if err != nil {
		return nil, err
	}
	cgroups, err := newPodCgroups(cfg.Cgroup, log)
	if err != nil {
		return nil, err
	}
	return &Agent{cfg: cfg, log: log.With("node", cfg.NodeName), cs: cs, init: []string{init}, machine: readMachine(),
		started: time.Now(), ipam: ipam, workers: map[types.UID]*podWorker{},
		net: podNet{CIDR: cfg.PodCIDR, Prefix: cfg.PodNetnsPrefix}, cgroups: cgroups}, nil
}

// Run registers the node and runs pods until ctx ends; then it stops every
// pod's processes and removes their addresses.
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("starting", "node_ip", a.cfg.NodeIP, "pod_cidr", a.cfg.PodCIDR, "cgroup", a.cfg.Cgroup, "pod_netns_prefix", a.cfg.PodNetnsPrefix,
		"images", a.cfg.Images.describe(), "pod_log_dir", a.cfg.PodLogDir)
	if err := os.MkdirAll(a.cfg.PodLogDir, 0o755); err != nil {
		return fmt.Errorf("pod log dir: %w", err)
	}
	// Leftovers of a previous run first: its pods died with it.
	if err := a.flushPods(); err != nil {
		return err
	}
	if err := a.net.SetupNode(); err != nil {
		return fmt.Errorf("pod network: %w", err)
	}
	if err := a.registerNode(ctx); err != nil {
		return err
	}
	// Pods stop after ctx ends and still report it: the broadcaster outlives ctx.
	broadcaster := record.NewBroadcaster(record.WithContext(context.WithoutCancel(ctx)))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.cs.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	a.events = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "skipper-nodeagent", Host: a.cfg.NodeName})
	hbCtx, stopHB := context.WithCancel(ctx)
	a.wg.Go(func() { a.heartbeat(hbCtx) })

	factory := informers.NewSharedInformerFactoryWithOptions(a.cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", a.cfg.NodeName).String()
		}))
	podInformer := factory.Core().V1().Pods().Informer()
	_, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.podChanged(ctx, obj) },
		UpdateFunc: func(_, obj any) { a.podChanged(ctx, obj) },
		DeleteFunc: func(obj any) { a.podDeleted(obj) },
	})
	if err != nil {
		stopHB()
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.HasSynced) {
		a.log.Warn("pod informer did not sync before shutdown")
	}
	a.log.Info("running")
	<-ctx.Done()
	a.log.Info("shutting down: stopping pods")
	factory.Shutdown()
	stopHB()
	a.wg.Wait() // every pod worker stops its processes when ctx ends
	if err := a.flushPods(); err != nil {
		a.log.Warn("remove pod namespaces and cgroups", "err", err)
	}
	return nil
}

// flushPods removes every pod network namespace, veth and cgroup on this
// node (each pod worker removes its own; this catches what a crash left).
func (a *Agent) flushPods() error {
	return errors.Join(a.net.Flush(a.log), a.cgroups.Flush(cgroupRemoveTimeout))
}

func (a *Agent) podChanged(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	a.mu.Lock()
	w, ok := a.workers[pod.UID]
	if !ok {
		w = newPodWorker(a, pod)
		a.workers[pod.UID] = w
		a.wg.Go(func() {
			w.run(ctx)
			a.mu.Lock()
			delete(a.workers, pod.UID)
			a.mu.Unlock()
		})
	}
	a.mu.Unlock()
	w.update(pod)
}

func (a *Agent) podDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	a.mu.Lock()
	w := a.workers[pod.UID]
	a.mu.Unlock()
	if w != nil {
		w.gone()
	}
}

// allocateIP gives the pod an address; want (its IP from a previous agent
// run) is kept when still free.
func (a *Agent) allocateIP(uid types.UID, want string) (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ip, ok := a.ipam.Lookup(string(uid)); ok {
		return ip, nil
	}
	if ip, err := netip.ParseAddr(want); err == nil && a.ipam.Claim(string(uid), ip) == nil {
		return ip, nil
	}
	return a.ipam.Allocate(string(uid))
}

func (a *Agent) releaseIP(uid types.UID) (netip.Addr, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ipam.Release(string(uid))
}

// ConfigMap and Secret implement objectGetter with the node's identity (the
// Node authorizer lets a node read what its pods reference).
func (a *Agent) ConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	return a.cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
}

func (a *Agent) Secret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	return a.cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
}

var _ objectGetter = (*Agent)(nil)

// requestToken asks the TokenRequest API for a token bound to the pod.
func (a *Agent) requestToken(ctx context.Context, pod *corev1.Pod, audience string, exp int64) (string, time.Time, error) {
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &exp,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if audience != "" {
		tr.Spec.Audiences = []string{audience}
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	out, err := a.cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, tr, metav1.CreateOptions{})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("token for serviceaccount %s/%s: %w", pod.Namespace, sa, err)
	}
	return out.Status.Token, out.Status.ExpirationTimestamp.Time, nil
}

// containerInit is the container init binary: path, or by default
// skipper-container-init next to the agent's own executable. It must be
// there: without it no container starts.
func containerInit(path string) (string, error) {
	if path == "" {
		self, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("own executable: %w", err)
		}
		path = filepath.Join(filepath.Dir(self), "skipper-container-init")
	}
	// Absolute: containers start with / as their working directory.
	path, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("container init %s: %w", path, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("container init: %w (build it with make build, or name it with --container-init)", err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("container init %s: not an executable file", path)
	}
	return path, nil
}
