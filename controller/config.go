package controller

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"skipper.dev/skipper/controller/flagenv"
	"skipper.dev/skipper/internal/loglevel"
)

// Config is everything the controller binary can be told. Defaults live in
// DefaultConfig and nowhere else; Validate runs before anything starts.
type Config struct {
	// GRPCListen is where skipper.v1.Controller and gRPC health are served.
	GRPCListen string
	// HTTPListen serves /metrics, /healthz and /readyz.
	HTTPListen string
	// Namespaces the controller watches; empty means all namespaces.
	Namespaces []string
	// PodName is this replica's pod name, written as the owner in Function status.
	PodName string
	// PodNamespace is where the controller runs: the assign key Secret and the
	// controller Service's EndpointSlices live there.
	PodNamespace string
	// PodIP is used to derive AdvertiseAddress when that is not set.
	PodIP string
	// AdvertiseAddress is this replica's ip:port as it appears on the ring.
	// Empty: PodIP joined with the port GRPCListen is bound to.
	AdvertiseAddress string
	// ControllerService is the headless Service whose ready endpoints are the
	// ring members.
	ControllerService string
	// RouterService is the routers' Service in PodNamespace: each Function
	// gets an ExternalName Service of its own name naming it, so callers
	// reach a function as http://<name>.<namespace>.svc (service.go).
	// Empty: no Services.
	RouterService string
	// ClusterDomain is the cluster's DNS domain, the end of the name an
	// ExternalName Service gives (<RouterService>.<PodNamespace>.svc.<domain>).
	ClusterDomain string
	// AssignTimeout bounds one POST to an instance's assign endpoint.
	AssignTimeout time.Duration
	// AssignKeyInterval is how often Secret skipper-assign-key is read
	// again, so a rotated key is signed with and published without a
	// restart (a replica also reads it when it finds a key ConfigMap
	// another replica wrote differently).
	AssignKeyInterval time.Duration
	// ClaimTimeout bounds how long GetInstance waits for a pool pod to become
	// Ready when none is.
	ClaimTimeout time.Duration
	// ForwardTimeout bounds a GetInstance forwarded to the owning replica when
	// the caller set no deadline.
	ForwardTimeout time.Duration
	// ShutdownTimeout bounds graceful shutdown of the gRPC and HTTP servers.
	ShutdownTimeout time.Duration
	// ResyncPeriod is the informers' resync period (level-triggered repair).
	ResyncPeriod time.Duration
	// ReportInterval is the heartbeat interval announced to routers in Welcome.
	ReportInterval time.Duration
	// HeartbeatTimeout is how long a router may stay silent before its
	// report counts as zero; a new owner waits this long (one full heartbeat
	// window) before it scales a function down.
	HeartbeatTimeout time.Duration
	// ScaleInterval is the supervisors' tick: ownership check, scaling
	// decision, drain progress and status.
	ScaleInterval time.Duration
	// ScaleDownStabilization is the window over which scale-down takes the
	// highest recommendation (HPA's scale-down stabilization).
	ScaleDownStabilization time.Duration
	// MaxParallelClaims bounds the claims in flight at once across all
	// functions of this replica: scale-ups start no more claims than this
	// less those already in flight (and no more than the pool has
	// candidates), and at most this many patch and assign at once.
	MaxParallelClaims int
	// ClaimRatePerRouter and ClaimBurstPerRouter bound the claims one
	// router's GetInstance calls may start (token bucket per router): a
	// call that would start a claim beyond them gets ResourceExhausted.
	ClaimRatePerRouter  float64
	ClaimBurstPerRouter int
	// GRPCMaxConcurrentStreams bounds the concurrent RPCs on one client
	// connection to the gRPC server.
	GRPCMaxConcurrentStreams uint
	// GRPCMaxRecvMsgSize bounds one message the gRPC server accepts, in
	// bytes.
	GRPCMaxRecvMsgSize int
	// GRPCKeepaliveMinTime is the shortest interval between client
	// keepalive pings the gRPC server tolerates; a client pinging more often
	// is disconnected (GOAWAY too_many_pings).
	GRPCKeepaliveMinTime time.Duration
	// DrainTimeout bounds how long a withdrawn instance waits for routers'
	// acks and zero in-flight before it is deleted anyway.
	DrainTimeout time.Duration
	// StatusInterval is the shortest time between two status writes of one
	// Function.
	StatusInterval time.Duration
	// OneshotLease is how long a oneshot instance handed to a router may go
	// unreleased before the controller deletes it.
	OneshotLease time.Duration
	// Kubeconfig is a kubeconfig file; empty means in-cluster configuration.
	Kubeconfig string
	// KubeAPIQPS and KubeAPIBurst limit the client's request rate.
	KubeAPIQPS   float64
	KubeAPIBurst int
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// Auth is how gRPC callers are authenticated: "tokenreview" (a
	// projected ServiceAccount token, audience skipper, reviewed by the API
	// server) or "none" (every caller trusted).
	Auth string
	// RouterServiceAccount is the DaemonSet routers' ServiceAccount
	// (namespace/name); empty: <PodNamespace>/skipper-noderouter.
	RouterServiceAccount string
	// ControllerServiceAccount is the replicas' own ServiceAccount, the only
	// one that may forward requests and read GetState; empty:
	// <PodNamespace>/skipper-controller.
	ControllerServiceAccount string
	// DebugGroup, when set, may also call GetState.
	DebugGroup string
	// TokenFile is this replica's own projected token (audience skipper),
	// sent on requests it forwards to the owner; empty sends none.
	TokenFile string
	// TLSDir holds tls.crt, tls.key and ca.crt (a cert-manager Secret):
	// the gRPC port serves TLS with them and forwards verify the owner
	// against ca.crt. Empty: plaintext.
	TLSDir string
	// TLSServerName is the name replicas' certificates carry and forwards
	// verify; empty: <ControllerService>.<PodNamespace>.svc.
	TLSServerName string
}

// DefaultConfig returns the defaults every flag starts from.
func DefaultConfig() Config {
	return Config{
		GRPCListen:             ":9090",
		HTTPListen:             ":9091",
		ControllerService:      "skipper-controller",
		RouterService:          "skipper",
		ClusterDomain:          "cluster.local",
		AssignTimeout:          5 * time.Second,
		AssignKeyInterval:      30 * time.Second,
		ClaimTimeout:           10 * time.Second,
		ForwardTimeout:         15 * time.Second,
		ShutdownTimeout:        10 * time.Second,
		ResyncPeriod:           10 * time.Minute,
		ReportInterval:         time.Second,
		HeartbeatTimeout:       3 * time.Second,
		ScaleInterval:          time.Second,
		MaxParallelClaims:      8,
		DrainTimeout:           30 * time.Second,
		StatusInterval:         time.Second,
		OneshotLease:           15 * time.Minute,
		ScaleDownStabilization: 300 * time.Second,
		KubeAPIQPS:             50,
		KubeAPIBurst:           100,
		LogLevel:               "info",
		Auth:                   authTokenReview,
		TokenFile:              "/var/run/secrets/skipper/token",

		// What one router may ask of a replica. 20 claims a second (40 at
		// once) is far above what a router's cold starts need (one claim
		// per cold function, shared by its callers) and what a pool refills.
		ClaimRatePerRouter:  20,
		ClaimBurstPerRouter: 40,
		// A router holds one Connect stream plus one GetInstance per cold
		// function it waits on; 1000 leaves room for a node's worth of cold
		// starts while bounding what one connection can hold open.
		GRPCMaxConcurrentStreams: 1000,
		// gRPC's own default, stated: a report of maxReportFunctions
		// functions with their instances fits well within it.
		GRPCMaxRecvMsgSize: 4 << 20,
		// Routers set no keepalive today; a client that pings more often
		// than this is told too_many_pings and disconnected.
		GRPCKeepaliveMinTime: 10 * time.Second,
	}
}

// downwardEnv are the env variables the Deployment sets through the downward
// API; they are read after the SKIPPER_* variable of the same flag.
var downwardEnv = flagenv.Vars{
	"pod-name":      {"POD_NAME"},
	"pod-namespace": {"POD_NAMESPACE"},
	"pod-ip":        {"POD_IP"},
}

// ParseConfig parses args over DefaultConfig. A flag's value comes from, in
// order: the command line, SKIPPER_<FLAG>, the downward API variable named in
// its help (pod-name, pod-namespace, pod-ip), the default, by flagenv's
// rules. getenv is package os's LookupEnv in production. On --help it
// writes the usage to out and returns flag.ErrHelp.
func ParseConfig(args []string, getenv func(string) (string, bool), out io.Writer) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("skipper-controller", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var namespaces string
	fs.StringVar(&c.GRPCListen, "grpc-listen", c.GRPCListen, "`address` serving gRPC skipper.v1.Controller and grpc.health.v1")
	fs.StringVar(&c.HTTPListen, "http-listen", c.HTTPListen, "`address` serving /metrics, /healthz and /readyz")
	fs.StringVar(&namespaces, "namespaces", "", "comma-separated `list` of namespaces to watch for Functions and pools; empty watches all namespaces")
	fs.StringVar(&c.PodName, "pod-name", "", "this replica's pod `name`, written as status.owner of the Functions it owns")
	fs.StringVar(&c.PodNamespace, "pod-namespace", "", "`namespace` the controller runs in, holding Secret skipper-assign-key and the controller Service")
	fs.StringVar(&c.PodIP, "pod-ip", "", "this replica's pod `IP`, used to derive --advertise-address")
	fs.StringVar(&c.AdvertiseAddress, "advertise-address", "", "this replica's `ip:port` on the ring, as listed in the controller Service's EndpointSlices; empty: --pod-ip with the --grpc-listen port")
	fs.StringVar(&c.ControllerService, "controller-service", c.ControllerService, "headless Service `name` in --pod-namespace whose ready endpoints are the ring members")
	fs.StringVar(&c.RouterService, "router-service", c.RouterService, "the routers' Service `name` in --pod-namespace: every Function gets an ExternalName Service of its own name naming it, so callers reach it as http://<name>.<namespace>.svc; empty: no Services")
	fs.StringVar(&c.ClusterDomain, "cluster-domain", c.ClusterDomain, "the cluster's DNS `domain`: the Functions' ExternalName Services name <router-service>.<pod-namespace>.svc.<domain>")
	fs.DurationVar(&c.AssignTimeout, "assign-timeout", c.AssignTimeout, "`duration` bounding one POST to an instance's /__skipper/assign")
	fs.DurationVar(&c.AssignKeyInterval, "assign-key-interval", c.AssignKeyInterval, "`duration` between two reads of Secret skipper-assign-key, so a rotated assign key is signed with and published without a restart")
	fs.DurationVar(&c.ClaimTimeout, "claim-timeout", c.ClaimTimeout, "longest `duration` GetInstance waits for a pool pod to become Ready before answering ResourceExhausted")
	fs.DurationVar(&c.ForwardTimeout, "forward-timeout", c.ForwardTimeout, "`duration` bounding a GetInstance forwarded to the owning replica when the caller set no deadline")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "`duration` graceful shutdown may take before connections are closed")
	fs.DurationVar(&c.ResyncPeriod, "resync-period", c.ResyncPeriod, "informer resync `duration`; every object is re-examined this often")
	fs.DurationVar(&c.ReportInterval, "report-interval", c.ReportInterval, "heartbeat `duration` announced to routers in Welcome")
	fs.DurationVar(&c.HeartbeatTimeout, "heartbeat-timeout", c.HeartbeatTimeout, "`duration` after which a silent router's load counts as zero; a new owner scales down only after one such window")
	fs.DurationVar(&c.ScaleInterval, "scale-interval", c.ScaleInterval, "`duration` between two ticks of a function's supervisor (ownership, scaling decision, drain, status)")
	fs.DurationVar(&c.ScaleDownStabilization, "scale-down-stabilization", c.ScaleDownStabilization, "scale-down stabilization window `duration`: scale-down goes only to the highest recommendation within it")
	fs.IntVar(&c.MaxParallelClaims, "max-parallel-claims", c.MaxParallelClaims, "most `claims` in flight at once across all functions; a scale-up starts at most this many less those in flight, and no more than the pool has ready pods")
	fs.Float64Var(&c.ClaimRatePerRouter, "claim-rate-per-router", c.ClaimRatePerRouter, "sustained `rate` (per second) of claims one router's GetInstance calls may start; beyond it GetInstance answers ResourceExhausted")
	fs.IntVar(&c.ClaimBurstPerRouter, "claim-burst-per-router", c.ClaimBurstPerRouter, "burst `count` of claims one router's GetInstance calls may start above --claim-rate-per-router")
	fs.UintVar(&c.GRPCMaxConcurrentStreams, "grpc-max-concurrent-streams", c.GRPCMaxConcurrentStreams, "most concurrent `streams` (RPCs) one client connection may hold open on the gRPC server")
	fs.IntVar(&c.GRPCMaxRecvMsgSize, "grpc-max-recv-msg-size", c.GRPCMaxRecvMsgSize, "largest message in `bytes` the gRPC server accepts; larger ones fail with ResourceExhausted")
	fs.DurationVar(&c.GRPCKeepaliveMinTime, "grpc-keepalive-min-time", c.GRPCKeepaliveMinTime, "shortest `duration` between keepalive pings the gRPC server tolerates from a client before closing its connection")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", c.DrainTimeout, "longest `duration` a withdrawn instance waits for every router's ack and zero in-flight before it is deleted")
	fs.DurationVar(&c.StatusInterval, "status-interval", c.StatusInterval, "shortest `duration` between two status writes of one Function")
	fs.DurationVar(&c.OneshotLease, "oneshot-lease", c.OneshotLease, "`duration` after which a oneshot instance never released by its router is deleted")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig `file`; empty uses the in-cluster service account")
	fs.Float64Var(&c.KubeAPIQPS, "kube-api-qps", c.KubeAPIQPS, "sustained `rate` of requests to the Kubernetes API")
	fs.IntVar(&c.KubeAPIBurst, "kube-api-burst", c.KubeAPIBurst, "burst `count` of requests to the Kubernetes API")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "`level` of logs written to stderr: debug, info, warn or error")
	fs.StringVar(&c.Auth, "auth", c.Auth, "how gRPC callers are authenticated: `mode` tokenreview (a projected ServiceAccount token, audience skipper, in metadata authorization: Bearer, reviewed by the API server; docs/security.md) or none (every caller trusted; only where the port is private)")
	fs.StringVar(&c.RouterServiceAccount, "router-service-account", "", "`namespace/name` of the DaemonSet routers' ServiceAccount; empty: <pod-namespace>/skipper-noderouter")
	fs.StringVar(&c.ControllerServiceAccount, "controller-service-account", "", "`namespace/name` of the replicas' own ServiceAccount, the only one that may forward requests and call GetState; empty: <pod-namespace>/skipper-controller")
	fs.StringVar(&c.DebugGroup, "debug-group", "", "`group` whose members may also call GetState; empty: none")
	fs.StringVar(&c.TokenFile, "token-file", c.TokenFile, "`file` of this replica's projected ServiceAccount token (audience skipper), sent when it forwards a request to the owner; empty: none")
	fs.StringVar(&c.TLSDir, "tls-dir", "", "`directory` holding tls.crt, tls.key and ca.crt (a cert-manager Secret, mounted): the gRPC port serves TLS with them, and forwards to other replicas verify them against ca.crt and --tls-server-name; re-read within a second of a change, the last good files kept when new ones do not parse; a bad directory fails the start; empty: plaintext")
	fs.StringVar(&c.TLSServerName, "tls-server-name", "", "DNS `name` every replica's certificate carries, verified on forwards whatever pod IP is dialled (routers verify the same name); empty: <controller-service>.<pod-namespace>.svc")

	vars := flagenv.Names(fs, downwardEnv)
	if err := flagenv.Parse(fs, vars, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			writeUsage(out, fs, vars)
		}
		return c, err
	}
	c.Namespaces = splitList(namespaces)
	return c, nil
}

func writeUsage(w io.Writer, fs *flag.FlagSet, vars flagenv.Vars) {
	fmt.Fprintf(w, "Usage: skipper-controller [flags]\n\n")
	fmt.Fprintf(w, "Runs a Skipper controller replica: owns the Functions the ring assigns it,\n")
	fmt.Fprintf(w, "claims warm pool pods for them and serves gRPC skipper.v1.Controller.\n")
	fmt.Fprintf(w, "Every flag falls back to the env variable shown; the command line wins.\n\nFlags:\n")
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	sort.Strings(names)
	for _, n := range names {
		f := fs.Lookup(n)
		arg, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  --%s %s\n", f.Name, arg)
		fmt.Fprintf(w, "\t%s\n", usage)
		env := strings.Join(vars[f.Name], ", then $")
		if f.DefValue != "" {
			fmt.Fprintf(w, "\tdefault %s; env $%s\n", f.DefValue, env)
		} else {
			fmt.Fprintf(w, "\tenv $%s\n", env)
		}
	}
}

func splitList(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if _, _, err := net.SplitHostPort(c.GRPCListen); err != nil {
		add("--grpc-listen %q: %v", c.GRPCListen, err)
	}
	if _, _, err := net.SplitHostPort(c.HTTPListen); err != nil {
		add("--http-listen %q: %v", c.HTTPListen, err)
	}
	for _, ns := range c.Namespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			add("--namespaces: %q: %s", ns, strings.Join(msgs, "; "))
		}
	}
	if c.PodName == "" {
		add("--pod-name: required (set POD_NAME from the downward API)")
	}
	if c.PodNamespace == "" {
		add("--pod-namespace: required (set POD_NAMESPACE from the downward API)")
	} else if msgs := validation.IsDNS1123Label(c.PodNamespace); len(msgs) > 0 {
		add("--pod-namespace %q: %s", c.PodNamespace, strings.Join(msgs, "; "))
	}
	if c.PodIP != "" && net.ParseIP(c.PodIP) == nil {
		add("--pod-ip %q: not an IP address", c.PodIP)
	}
	if c.AdvertiseAddress != "" {
		host, port, err := net.SplitHostPort(c.AdvertiseAddress)
		switch {
		case err != nil:
			add("--advertise-address %q: %v", c.AdvertiseAddress, err)
		case net.ParseIP(host) == nil:
			add("--advertise-address %q: host must be an IP address (ring members are EndpointSlice addresses)", c.AdvertiseAddress)
		case port == "" || port == "0":
			add("--advertise-address %q: needs a port", c.AdvertiseAddress)
		}
	} else if c.PodIP == "" {
		add("--advertise-address: required when --pod-ip (POD_IP) is not set")
	}
	if c.RouterService != "" {
		if msgs := validation.IsDNS1035Label(c.RouterService); len(msgs) > 0 {
			add("--router-service %q: %s", c.RouterService, strings.Join(msgs, "; "))
		}
	}
	if msgs := validation.IsDNS1123Subdomain(c.ClusterDomain); len(msgs) > 0 {
		add("--cluster-domain %q: %s", c.ClusterDomain, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Label(c.ControllerService); len(msgs) > 0 {
		add("--controller-service %q: %s", c.ControllerService, strings.Join(msgs, "; "))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"--assign-timeout", c.AssignTimeout},
		{"--assign-key-interval", c.AssignKeyInterval},
		{"--claim-timeout", c.ClaimTimeout},
		{"--forward-timeout", c.ForwardTimeout},
		{"--shutdown-timeout", c.ShutdownTimeout},
		{"--report-interval", c.ReportInterval},
		{"--heartbeat-timeout", c.HeartbeatTimeout},
		{"--scale-interval", c.ScaleInterval},
		{"--drain-timeout", c.DrainTimeout},
		{"--status-interval", c.StatusInterval},
		{"--oneshot-lease", c.OneshotLease},
	} {
		if d.v <= 0 {
			add("%s: must be positive, got %s", d.name, d.v)
		}
	}
	if c.ScaleDownStabilization < 0 {
		add("--scale-down-stabilization: must not be negative, got %s", c.ScaleDownStabilization)
	}
	if c.HeartbeatTimeout > 0 && c.ReportInterval > 0 && c.HeartbeatTimeout <= c.ReportInterval {
		add("--heartbeat-timeout %s: must exceed --report-interval %s, or every router would count as silent between two reports", c.HeartbeatTimeout, c.ReportInterval)
	}
	if c.MaxParallelClaims <= 0 {
		add("--max-parallel-claims: must be positive, got %d", c.MaxParallelClaims)
	}
	if c.ClaimRatePerRouter <= 0 {
		add("--claim-rate-per-router: must be positive, got %v", c.ClaimRatePerRouter)
	}
	if c.ClaimBurstPerRouter <= 0 {
		add("--claim-burst-per-router: must be positive, got %d", c.ClaimBurstPerRouter)
	}
	if c.GRPCMaxConcurrentStreams == 0 {
		add("--grpc-max-concurrent-streams: must be positive, got 0")
	}
	if c.GRPCMaxRecvMsgSize < minRecvMsgSize {
		add("--grpc-max-recv-msg-size: must be at least %d bytes, got %d", minRecvMsgSize, c.GRPCMaxRecvMsgSize)
	}
	if c.GRPCKeepaliveMinTime <= 0 {
		add("--grpc-keepalive-min-time: must be positive, got %s", c.GRPCKeepaliveMinTime)
	}
	if c.ResyncPeriod < 0 {
		add("--resync-period: must not be negative, got %s", c.ResyncPeriod)
	}
	if c.KubeAPIQPS <= 0 {
		add("--kube-api-qps: must be positive, got %v", c.KubeAPIQPS)
	}
	if c.KubeAPIBurst <= 0 {
		add("--kube-api-burst: must be positive, got %d", c.KubeAPIBurst)
	}
	if _, err := loglevel.Parse(c.LogLevel); err != nil {
		add("--log-level: %v", err)
	}
	if c.Auth != authTokenReview && c.Auth != authNone {
		add("--auth %q: want %s or %s", c.Auth, authTokenReview, authNone)
	}
	for _, sa := range []struct{ flag, v string }{
		{"--router-service-account", c.RouterServiceAccount}, {"--controller-service-account", c.ControllerServiceAccount},
	} {
		if _, err := c.serviceAccount(sa.v, ""); sa.v != "" && err != nil {
			add("%s %v", sa.flag, err)
		}
	}
	if c.TLSServerName != "" {
		if msgs := validation.IsDNS1123Subdomain(c.TLSServerName); len(msgs) > 0 {
			add("--tls-server-name %q: %s", c.TLSServerName, strings.Join(msgs, "; "))
		}
	}
	return errors.Join(errs...)
}

// serviceAccount parses v ("namespace/name"), or gives
// <PodNamespace>/<def> when v is empty.
func (c Config) serviceAccount(v, def string) (saRef, error) {
	if v == "" {
		return saRef{c.PodNamespace, def}, nil
	}
	return parseSARef(v)
}

// minRecvMsgSize is the smallest --grpc-max-recv-msg-size accepted: below
// it, a router's ordinary report would not fit.
const minRecvMsgSize = 64 << 10

// advertise returns the ring address of this replica given the address the
// gRPC listener is bound to.
func (c Config) advertise(bound net.Addr) string {
	if c.AdvertiseAddress != "" {
		return c.AdvertiseAddress
	}
	_, port, err := net.SplitHostPort(bound.String())
	if err != nil {
		return ""
	}
	return net.JoinHostPort(c.PodIP, port)
}
