package noderouter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"

	"skipper.dev/skipper/bpf"
	"skipper.dev/skipper/internal/loglevel"
	"skipper.dev/skipper/noderouter/callers"
	"skipper.dev/skipper/noderouter/cgroup"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/localaddr"
	"skipper.dev/skipper/noderouter/route"
	pb "skipper.dev/skipper/proto/skipperv1"
)

// Run parses args (their environment fallbacks looked up by getenv,
// package os's LookupEnv from main), serves until ctx is cancelled, then
// drains. --help writes usage to stderr and returns flag.ErrHelp.
func Run(ctx context.Context, args []string, getenv func(string) (string, bool), stderr io.Writer) error {
	if len(args) > 0 && args[0] == "bpf-cleanup" {
		return runCleanup(args[1:], getenv, stderr)
	}
	cfg, err := ParseConfig(args, getenv, stderr)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	level, _ := loglevel.Parse(cfg.LogLevel) // validated
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})).With("node", cfg.NodeName)

	var cs kubernetes.Interface
	if len(cfg.ControllerAddresses) == 0 {
		if cs, err = kubeClient(ctx, cfg.Kubeconfig, log); err != nil {
			return err
		}
	}
	rt := newRouter(cfg, log)
	if err := rt.loadControllerTLS(); err != nil {
		return err
	}
	if cfg.CgroupRoot != "" {
		r, err := cgroup.Open("", cfg.CgroupRoot)
		if err != nil {
			log.Warn("instance CPU and memory not reported", "err", err)
		} else {
			m := r.Mounts()
			log.Info("instance cgroups", "root", cfg.CgroupRoot, "cpu", m.CPU.Mount, "cpu_v2", m.CPU.V2, "memory", m.Memory.Mount, "memory_v2", m.Memory.V2)
			rt.cp.usage.reader = r
		}
	}
	var lns []net.Listener
	closeAll := func() {
		for _, ln := range lns {
			ln.Close()
		}
	}
	if cfg.LocalAddress != "" {
		rt.localAddr = &localaddr.Manager{Addr: netip.MustParseAddr(cfg.LocalAddress)} // validated
		where, _, err := rt.localAddr.Ensure()
		if err != nil {
			return fmt.Errorf("--local-address (needs CAP_NET_ADMIN; --local-address= turns it off): %w", err)
		}
		log.Info("local address", "addr", cfg.LocalAddress, "on", string(where))
		addr := net.JoinHostPort(cfg.LocalAddress, strconv.Itoa(cfg.LocalPort))
		if rt.local, err = net.Listen("tcp4", addr); err != nil {
			return fmt.Errorf("listen on --local-address %s: %w", addr, err)
		}
		lns = append(lns, rt.local)
	}
	data, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		closeAll()
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	lns = append(lns, data)
	admin, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		closeAll()
		return fmt.Errorf("admin listen %s: %w", cfg.AdminListen, err)
	}
	lns = append(lns, admin)
	if err := rt.startBPF(); err != nil {
		closeAll()
		return err
	}
	return rt.run(ctx, data, admin, cs)
}

// router wires the parts together for one process lifetime.
type router struct {
	cfg   Config
	log   *slog.Logger
	m     *metrics
	cache *route.Cache
	cp    *controlPlane
	proxy *dataplane.Proxy
	ready atomic.Bool
	// callerIndex tells pods apart by address (nil: no index, see
	// identifier); callersSynced is set once its first list is in, and
	// readiness waits for it.
	callerIndex   *callers.Index
	callersSynced atomic.Bool
	// pre keeps connections to warm pool pods (nil: none, see newRouter).
	pre *dataplane.Preconnector

	// Set before run, all optional.
	// local is a second data-plane listener, on the node-local address.
	local net.Listener
	// localAddr keeps the node-local address; run reconciles it.
	localAddr *localaddr.Manager
	// steer is the loaded BPF steering (startBPF); run heartbeats it,
	// withdraws it on shutdown and closes it.
	steer *bpf.Steering
}

func newRouter(cfg Config, log *slog.Logger) *router {
	id := &pb.RouterIdentity{
		Node:            cfg.NodeName,
		Pod:             cfg.PodName,
		Incarnation:     incarnation(),
		ProtocolVersion: pb.ProtocolVersion_PROTOCOL_VERSION_1,
		Mode:            cfg.Mode,
	}
	if cfg.PodNamespace != "" {
		id.Pod = cfg.PodNamespace + "/" + cfg.PodName
	}
	m := newMetrics(cfg.NodeName)
	cache := &route.Cache{}
	negative := route.NewNegative(cfg.NegativeCacheTTL, cfg.NegativeCacheSize)
	cp := newControlPlane(cfg, log, m, cache, negative, id)
	cp.usage = &usageSampler{node: cfg.NodeName, cache: cache, log: log}
	rt := &router{cfg: cfg, log: log, m: m, cache: cache, cp: cp, proxy: dataplane.New(cfg.Options, log, m.dp, cache, negative, cp)}
	rt.callersSynced.Store(true)
	switch {
	case cfg.Mode == ModeSidecar && cfg.PodNamespace != "" && cfg.PodServiceAccount != "":
		rt.proxy.SetIdentify(dataplane.OwnPod(callers.NewIdentity(cfg.PodNamespace, cfg.PodServiceAccount, cfg.PodName)))
	case cfg.Mode == ModeSidecar:
		log.Warn("--pod-namespace or --pod-service-account unset: calls to functions that list callers will be refused (caller_unknown)")
	case cfg.CallerIndex && len(cfg.ControllerAddresses) > 0:
		log.Warn("--controller-addresses: no Kubernetes client, so no caller index; calls to functions that list callers will be refused (caller_unknown)")
	case cfg.CallerIndex:
		rt.callerIndex = &callers.Index{}
		rt.callersSynced.Store(false)
		rt.proxy.SetIdentify(rt.callerIndex.Lookup)
	}
	switch ok, why := preconnects(cfg); {
	case ok:
		rt.pre = dataplane.NewPreconnector(rt.proxy, cfg.PreconnectPoolPods, log)
	case why != "":
		log.Warn("no pre-connections to warm pool pods", "reason", why)
	}
	return rt
}

// preconnects reports whether a router with cfg keeps pre-connections and,
// when not, why (empty: it does not want them). They ride on the pod watch
// (a DaemonSet's, with a Kubernetes client); the data plane says whether
// its Options allow them.
func preconnects(cfg Config) (bool, string) {
	if cfg.PreconnectPoolPods == 0 || cfg.Mode == ModeSidecar || len(cfg.ControllerAddresses) > 0 {
		return false, ""
	}
	return dataplane.CanPreconnect(cfg.Options)
}

func incarnation() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand.Read documents it)
	return hex.EncodeToString(b[:])
}

// run serves data and admin until ctx ends or a server fails, then stops
// taking requests, lets in-flight ones finish within the shutdown timeout,
// and stops the streams and the informer. cs is nil with static members.
func (rt *router) run(ctx context.Context, data, admin net.Listener, cs kubernetes.Interface) error {
	// The control plane and the informer outlive ctx until the data server
	// has drained: in-flight cold requests still need GetInstance.
	dataSrv, err := rt.proxy.NewServer(rt.log)
	if err != nil {
		rt.abandon(data, admin)
		return err
	}
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	errc := make(chan error, 8) // one per sender at most: none blocks after the first stops run
	var wg sync.WaitGroup

	if cs == nil {
		rt.cp.setMembers(rt.cfg.ControllerAddresses)
		rt.ready.Store(true)
	} else {
		wg.Go(func() {
			err := watchMembers(bg, cs, rt.cfg.ControllerNamespace, rt.cfg.ControllerService, rt.cfg.ControllerPortName,
				rt.log, rt.cp.setMembers, func() { rt.ready.Store(true) })
			if err != nil {
				errc <- fmt.Errorf("watch controllers: %w", err)
			}
		})
	}

	if rt.pre != nil {
		wg.Go(func() { rt.pre.Run(bg) })
	}
	if (rt.callerIndex != nil || rt.pre != nil) && cs != nil {
		wg.Go(func() {
			var pre podFeed // a nil interface, not a nil *Preconnector
			if rt.pre != nil {
				pre = rt.pre
			}
			if err := watchPods(bg, cs, rt.callerIndex, pre, rt.log, func() { rt.callersSynced.Store(true) }); err != nil {
				errc <- fmt.Errorf("watch pods (--caller-index, --preconnect-pool-pods): %w", err)
			}
		})
	} else {
		rt.callersSynced.Store(true)
	}

	adminSrv := &http.Server{Handler: rt.adminHandler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(rt.log.Handler(), slog.LevelWarn)}
	serve := func(serve func(net.Listener) error, ln net.Listener, what string) {
		if err := serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("serve %s on %s: %w", what, ln.Addr(), err)
		}
	}
	wg.Go(func() {
		if err := dataSrv.ServeHandoff(); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("serve data plane (h2c handed over): %w", err)
		}
	})
	wg.Go(func() { serve(dataSrv.Serve, data, "data plane") })
	localAddr := ""
	if rt.local != nil {
		localAddr = rt.local.Addr().String()
		wg.Go(func() { serve(dataSrv.Serve, rt.local, "data plane (local address)") })
	}
	wg.Go(func() { serve(adminSrv.Serve, admin, "admin") })
	if rt.localAddr != nil {
		wg.Go(func() { rt.localAddr.Run(bg, rt.cfg.LocalAddressInterval, rt.log) })
	}
	// Checked every report interval, like the reports that walk the cache.
	wg.Go(func() { rt.cp.sweepLoop(bg, rt.cfg.ReportInterval) })
	wg.Go(func() { rt.proxy.Run(bg) })
	if rt.cp.usage.reader != nil {
		wg.Go(func() { rt.cp.usage.run(bg, rt.cfg.ReportInterval) })
	}
	hbCtx, stopHB := context.WithCancel(bg)
	defer stopHB()
	var hb sync.WaitGroup
	if rt.steer != nil {
		defer rt.closeBPF()
		hb.Go(func() { rt.heartbeat(hbCtx) })
		if len(rt.cfg.BPFVIPs) == 0 && cs != nil {
			wg.Go(func() {
				if err := rt.followVIPs(bg, cs); err != nil {
					errc <- fmt.Errorf("watch --bpf-service: %w", err)
				}
			})
		}
	}
	rt.log.Info("serving", "listen", data.Addr().String(), "local", localAddr, "admin", admin.Addr().String(), "mode", rt.cfg.Mode)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
		rt.log.Error("stopping", "err", runErr)
	}

	rt.ready.Store(false)
	// New calls fail open to the Service at once; the ones already steered
	// here drain below.
	stopHB()
	hb.Wait()
	if rt.steer != nil {
		rt.withdrawBPF()
	}
	if runErr == nil && rt.cfg.DrainDelay > 0 {
		rt.log.Info("not ready; still serving", "for", rt.cfg.DrainDelay.String())
		time.Sleep(rt.cfg.DrainDelay)
	}
	rt.log.Info("draining", "timeout", rt.cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rt.cfg.ShutdownTimeout)
	defer cancel()
	var errs []error
	if err := dataSrv.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("drain data plane: %w", err))
	}
	stopBG()
	rt.cp.close()
	if err := adminSrv.Shutdown(sctx); err != nil {
		_ = adminSrv.Close()
	}
	wg.Wait()
	rt.proxy.Close()
	rt.log.Info("stopped")
	return errors.Join(append([]error{runErr}, errs...)...)
}

// abandon undoes what Run set up when run cannot start serving: the
// listeners, BPF steering (withdrawn first, so calls fail open at once)
// and the control plane.
func (rt *router) abandon(data, admin net.Listener) {
	for _, ln := range []net.Listener{data, admin, rt.local} {
		if ln != nil {
			_ = ln.Close()
		}
	}
	if rt.steer != nil {
		rt.withdrawBPF()
		rt.closeBPF()
	}
	rt.cp.close()
}

func (rt *router) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(rt.m.reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(rt.log.Handler(), slog.LevelWarn)}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !rt.ready.Load() || !rt.callersSynced.Load() {
			http.Error(w, "not ready: controller endpoints or the caller index not synced, or draining", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux
}
