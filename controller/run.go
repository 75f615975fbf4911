package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"

	"skipper.dev/skipper/controller/trust"
	"skipper.dev/skipper/internal/kubedial"
	"skipper.dev/skipper/internal/loglevel"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
)

// Run runs a controller replica until ctx ends, then shuts down gracefully.
// args are the command-line flags (without the program name), getenv looks
// up their environment fallbacks (package os's LookupEnv, from main); logs
// go to stderr. --help prints the usage to stderr and returns
// flag.ErrHelp (wrapped).
func Run(ctx context.Context, args []string, getenv func(string) (string, bool), stderr io.Writer) error {
	cfg, err := ParseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	level, _ := loglevel.Parse(cfg.LogLevel) // validated
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	// client-go logs through klog; send it to the same structured stream.
	klog.SetSlogLogger(log.With("component", "client-go"))

	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.QPS = float32(cfg.KubeAPIQPS)
	rc.Burst = cfg.KubeAPIBurst
	rc.UserAgent = "skipper-controller/" + cfg.PodName
	// One budget for every client below (each would build its own from
	// QPS and Burst).
	rc.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(rc.QPS, rc.Burst)
	// Built-in kinds travel as protobuf, as the kube controllers' do: it is
	// cheaper for the API server to encode (watch events, the claim patch's
	// response). Functions, a CRD, have only JSON: the dynamic client keeps it.
	pc := rest.CopyConfig(rc)
	pc.ContentType = runtime.ContentTypeProtobuf
	pc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	core, err := kubernetes.NewForConfig(pc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	// The informers get clients of their own whose connects wait out an API
	// server that refuses them (restarting behind the kubernetes Service), so
	// their watches resume within a second of its return rather than after
	// client-go's backoff. Calls on a request's path keep the plain dial: a
	// TokenReview during an outage fails at once and local verification
	// takes over.
	dial := kubedial.New(ctx, log.With("component", "kube-dial")).DialContext
	wpc, wrc := rest.CopyConfig(pc), rest.CopyConfig(rc)
	wpc.Dial, wrc.Dial = dial, dial
	watchCore, err := kubernetes.NewForConfig(wpc)
	if err != nil {
		return fmt.Errorf("kubernetes client for informers: %w", err)
	}
	watchDyn, err := dynamic.NewForConfig(wrc)
	if err != nil {
		return fmt.Errorf("kubernetes dynamic client for informers: %w", err)
	}
	grpcLis, err := net.Listen("tcp", cfg.GRPCListen)
	if err != nil {
		return fmt.Errorf("listen --grpc-listen: %w", err)
	}
	httpLis, err := net.Listen("tcp", cfg.HTTPListen)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("listen --http-listen: %w", err)
	}
	return serve(ctx, cfg, log, clients{core: core, dyn: dyn, watchCore: watchCore, watchDyn: watchDyn}, grpcLis, httpLis)
}

// clients are the Kubernetes API clients a replica uses; tests pass fakes.
type clients struct {
	core kubernetes.Interface // direct calls
	dyn  dynamic.Interface
	// watchCore and watchDyn feed the informers; nil means core and dyn.
	watchCore kubernetes.Interface
	watchDyn  dynamic.Interface
}

// watch returns the clients the informers use.
func (cl clients) watch() (kubernetes.Interface, dynamic.Interface) {
	core, dyn := cl.watchCore, cl.watchDyn
	if core == nil {
		core = cl.core
	}
	if dyn == nil {
		dyn = cl.dyn
	}
	return core, dyn
}

// serve runs a replica on the given listeners (it closes them) until ctx
// ends. Everything it starts has stopped when it returns.
func serve(ctx context.Context, cfg Config, log *slog.Logger, cl clients, grpcLis, httpLis net.Listener) error {
	defer grpcLis.Close()
	defer httpLis.Close()
	self := cfg.advertise(grpcLis.Addr())
	log = log.With("controller", cfg.PodName)
	log.Info("starting", "grpc", grpcLis.Addr().String(), "http", httpLis.Addr().String(), "advertise", self,
		"namespaces", cfg.Namespaces)

	m := newMetrics()
	var ready atomic.Bool
	httpSrv := &http.Server{Handler: httpHandler(m, &ready), ReadHeaderTimeout: 5 * time.Second}
	var httpWG sync.WaitGroup
	httpWG.Go(func() {
		if err := httpSrv.Serve(httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	})
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
		defer cancel()
		_ = httpSrv.Shutdown(sctx)
		httpWG.Wait()
	}()

	tlsCreds, err := loadTLS(cfg, log, m.reg)
	if err != nil {
		return err
	}
	key, err := waitAssignKey(ctx, cl.core, cfg.PodNamespace, log)
	if err != nil && ctx.Err() != nil {
		log.Info("stopped before the assign key was read")
		return nil // a stop, as one before the caches synced
	}
	if err != nil {
		return fmt.Errorf("assign key: %w", err)
	}
	c, err := newController(cfg, self, log, cl, key, m)
	if err != nil {
		return err
	}
	c.fwd.transport = tlsCreds.client
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	c.start(runCtx)
	defer func() {
		stopRun()
		c.stop()
	}()

	closing := make(chan struct{})
	opts := grpcServerOptions(cfg)
	if tlsCreds.server != nil {
		opts = append(opts, grpc.Creds(tlsCreds.server))
	}
	az := newAuthz(cfg, cl.core)
	if az != nil {
		defer az.auth.Close() // after the gRPC server stopped: no call starts a refresh then
		kctx, stopKeys := context.WithCancel(ctx)
		var keysWG sync.WaitGroup
		keysWG.Go(func() { az.runKeys(kctx, cl.core.Discovery().RESTClient(), log) })
		defer func() { stopKeys(); keysWG.Wait() }()
		skip := func(m string) bool { return strings.HasPrefix(m, healthMethod) } // probes carry no token
		cu, cs := countRefusals(m)
		du, ds := denyUnruled(skip)
		opts = append(opts, grpc.ChainUnaryInterceptor(cu, az.auth.UnaryInterceptor(skip), du),
			grpc.ChainStreamInterceptor(cs, az.auth.StreamInterceptor(skip), ds))
		log.Info("gRPC callers authenticated by TokenReview", "audience", trust.Audience, "routers", az.routerSA.String(),
			"controllers", az.controller.String(), "debug_group", cfg.DebugGroup)
	} else {
		log.Warn("--auth none: every gRPC caller is trusted; any pod that reaches the gRPC port can act as any router")
	}
	grpcSrv := grpc.NewServer(opts...)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus(skipperv1.Controller_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(grpcSrv, hs)
	skipperv1.RegisterControllerServer(grpcSrv, &server{c: c, closing: closing, authz: az,
		limits: newClaimLimiter(cfg.ClaimRatePerRouter, cfg.ClaimBurstPerRouter)})
	var grpcWG sync.WaitGroup
	grpcErr := make(chan error, 1)
	grpcWG.Go(func() { grpcErr <- grpcSrv.Serve(grpcLis) })

	// Readiness is the caches having synced; it never depends on the ring,
	// which is built from ready replicas.
	if !c.cache.waitSynced(ctx) {
		log.Info("stopped before caches synced")
	} else {
		ready.Store(true)
		hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		hs.SetServingStatus(skipperv1.Controller_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
		log.Info("caches synced, ready")
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-grpcErr:
		serveErr = fmt.Errorf("grpc server: %w", serveErr)
	}
	log.Info("shutting down")
	ready.Store(false)
	hs.Shutdown()
	close(closing)
	stopped := make(chan struct{})
	go func() { grpcSrv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(cfg.ShutdownTimeout):
		log.Warn("graceful stop timed out, closing connections", "timeout", cfg.ShutdownTimeout)
		grpcSrv.Stop()
		<-stopped
	}
	grpcWG.Wait()
	return serveErr
}

// grpcServerOptions bounds what one client can hold or push on the gRPC
// server: concurrent streams per connection, the size of one message, and
// how often it may ping.
func grpcServerOptions(cfg Config) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(uint32(min(cfg.GRPCMaxConcurrentStreams, math.MaxUint32))),
		grpc.MaxRecvMsgSize(cfg.GRPCMaxRecvMsgSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime: cfg.GRPCKeepaliveMinTime,
			// A router's connection may sit between GetInstance calls with
			// no stream open; its pings are still bounded by MinTime.
			PermitWithoutStream: true,
		}),
	}
}

// httpHandler serves /metrics, /healthz (the process is up) and /readyz
// (caches synced and not shutting down).
func httpHandler(m *metrics, ready *atomic.Bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "caches not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux
}
