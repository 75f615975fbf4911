package noderouter

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"time"

	"skipper.dev/skipper/bpf"
	"skipper.dev/skipper/internal/loglevel"
	"skipper.dev/skipper/noderouter/dataplane"
	"skipper.dev/skipper/noderouter/route"
)

// Modes the router runs in.
const (
	ModeDaemonSet = "daemonset"
	ModeSidecar   = "sidecar"
)

// Config is the router's whole configuration. DefaultConfig holds every
// default; Validate checks it before anything starts.
type Config struct {
	// Options are the data plane's: limits, timeouts, retries and which
	// forwarder serves HTTP/1.1.
	dataplane.Options

	// Listen is the data-plane address (the node IP's :8380 in a DaemonSet).
	Listen string
	// AdminListen serves /metrics, /healthz and /readyz.
	AdminListen string
	// Mode is ModeDaemonSet (one router per node, on the node's network)
	// or ModeSidecar (a container in a caller's pod, serving that pod only
	// on loopback: the same code path without the node-level parts).
	Mode string

	// NodeName, PodName and PodNamespace identify the router to controllers
	// and label its metrics.
	NodeName     string
	PodName      string
	PodNamespace string
	// PodServiceAccount is the router pod's ServiceAccount: a sidecar
	// router's calls come from its own pod, and this is who they are from
	// (spec.callers).
	PodServiceAccount string
	// CallerIndex has a DaemonSet router watch every pod of the cluster to
	// tell, from a call's source address, which pod it came from
	// (spec.callers). Off: calls to functions that list callers get 403
	// caller_unknown.
	CallerIndex bool

	// ControllerService and ControllerNamespace name the headless Service
	// whose ready EndpointSlice endpoints are the ring members.
	ControllerService   string
	ControllerNamespace string
	// ControllerPortName is the EndpointSlice port to use; when no port has
	// this name the first port is used.
	ControllerPortName string
	// ControllerAddresses, when set, is a static member list (ip:port) that
	// replaces the EndpointSlice informer.
	ControllerAddresses []string
	// TokenFile is the projected ServiceAccount token (audience skipper)
	// sent to controllers as authorization: Bearer; re-read as the kubelet
	// renews it. A path that does not exist at start sends no token
	// (controllers with --auth tokenreview refuse such calls); empty: none.
	TokenFile string
	// ControllerTLSDir holds ca.crt (the controllers' Secret, or a copy
	// of its CA): controllers are dialled over TLS and verified against
	// it. Empty: plaintext.
	ControllerTLSDir string
	// ControllerTLSServerName is the name controllers' certificates carry;
	// empty: <ControllerService>.<ControllerNamespace>.svc.
	ControllerTLSServerName string
	// Kubeconfig is a kubeconfig path; empty means in-cluster config.
	Kubeconfig string

	// NegativeCacheTTL is how long a function the controller reported
	// NotFound is answered 404 without asking again; 0 disables the
	// negative cache. At most 1s: a new Function is callable within 2s.
	NegativeCacheTTL time.Duration
	// NegativeCacheSize bounds the unknown names remembered (the oldest
	// goes first); 0 disables the negative cache.
	NegativeCacheSize int
	// ReportInterval is how often a report goes to each connected controller.
	ReportInterval time.Duration
	// ReconnectMin and ReconnectMax bound the jittered exponential backoff
	// between Connect attempts.
	ReconnectMin time.Duration
	ReconnectMax time.Duration
	// DrainDelay is how long the router keeps serving after SIGTERM with
	// /readyz failing, so that endpoints drop it before it stops listening.
	DrainDelay time.Duration
	// ShutdownTimeout bounds how long SIGTERM then waits for in-flight
	// requests.
	ShutdownTimeout time.Duration

	// PreconnectPoolPods bounds the ready pool pods a DaemonSet router
	// keeps a connection open to ahead of their claim (preconnect.go);
	// 0: none. It needs the pod watch (a Kubernetes client).
	PreconnectPoolPods int

	// CacheIdleTimeout is how long a function's cache entry is kept with
	// no request and no instance assigned; then it is dropped with its
	// metric series (the next request is a cache miss).
	CacheIdleTimeout time.Duration

	// CgroupRoot is where the pods' cgroups are looked for, relative to the
	// mount of each cgroup hierarchy found in /proc/self/mountinfo; the CPU and
	// memory of the instances on this node are read there for the reports.
	// Empty: not read.
	CgroupRoot string

	// LogLevel is debug, info, warn or error.
	LogLevel string

	// LocalAddress is the node-local IPv4 address the router keeps on the
	// node (dummy link skipper0, or lo:skipper where dummy links are
	// unsupported) and also serves the data plane on, at LocalPort; BPF
	// steering rewrites calls to it. Empty disables it (and BPF).
	LocalAddress string
	// LocalPort is the data-plane port on LocalAddress.
	LocalPort int
	// LocalAddressInterval is how often the address is reconciled.
	LocalAddressInterval time.Duration

	// BPF is BPFOff, BPFAuto (steer when the kernel and capabilities allow,
	// otherwise run without) or BPFRequired (fail start-up without).
	BPF string
	// BPFCgroup is the cgroup2 directory the steering programs attach to:
	// empty, the cgroup2 mount found in /proc/self/mountinfo; absolute, that
	// directory, or its "unified" subdirectory when it holds the cgroup2
	// hierarchy of a hybrid host (a hostPath of the host's /sys/fs/cgroup);
	// relative, that path under the cgroup2 mount (the local cluster passes
	// each node's own cgroup, skipper/<node>).
	BPFCgroup string
	// BPFPinDir is a bpffs directory where links and maps are pinned so
	// steering survives a router restart; empty: nothing pinned.
	BPFPinDir string
	// BPFVIPs are the steered destinations (ip:port); empty: the ClusterIPs
	// and ports of BPFService, followed as it changes.
	BPFVIPs []string
	// BPFService names the router's own Service (in ControllerNamespace)
	// whose ClusterIP:port pairs are steered when BPFVIPs is empty.
	BPFService string
	// BPFSkMsg turns on the sk_msg fast path between steered callers and
	// this router (payload skips the TCP/IP stack).
	BPFSkMsg bool
	// BPFMaxAge is how long steering stays on after the router's last
	// liveness heartbeat (sent every BPFMaxAge/4); then calls fail open.
	BPFMaxAge time.Duration
}

// BPF modes (--bpf).
const (
	BPFOff      = "off"
	BPFAuto     = "auto"
	BPFRequired = "required"
)

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Options:             dataplane.DefaultOptions(),
		Listen:              ":8380",
		AdminListen:         ":8381",
		Mode:                ModeDaemonSet,
		ControllerService:   "skipper-controller",
		ControllerNamespace: "skipper-system",
		ControllerPortName:  "grpc",
		TokenFile:           "/var/run/secrets/skipper/token",
		CallerIndex:         true,
		NegativeCacheTTL:    time.Second,
		NegativeCacheSize:   10000,
		ReportInterval:      time.Second,
		ReconnectMin:        100 * time.Millisecond,
		ReconnectMax:        10 * time.Second,
		DrainDelay:          2 * time.Second,
		ShutdownTimeout:     20 * time.Second,
		PreconnectPoolPods:  64,
		CacheIdleTimeout:    10 * time.Minute,
		LogLevel:            "info",
		CgroupRoot:          "/",

		LocalAddress:         "169.254.20.20",
		LocalPort:            80,
		LocalAddressInterval: 10 * time.Second,
		BPF:                  BPFOff,
		BPFPinDir:            "/sys/fs/bpf/skipper",
		BPFService:           "skipper",
		BPFMaxAge:            bpf.DefaultMaxAge,
	}
}

// Validate returns every problem with c, joined.
func (c Config) Validate() error {
	var errs []error
	req := func(v, flag string) {
		if v == "" {
			errs = append(errs, fmt.Errorf("--%s is required", flag))
		}
	}
	req(c.Listen, "listen")
	req(c.AdminListen, "admin-listen")
	req(c.NodeName, "node-name")
	req(c.PodName, "pod-name") // controllers key a router's stream by its pod
	switch c.Mode {
	case ModeDaemonSet:
	case ModeSidecar:
		errs = append(errs, c.validateSidecar()...)
	default:
		errs = append(errs, fmt.Errorf("--mode %q: want %s or %s", c.Mode, ModeDaemonSet, ModeSidecar))
	}
	if len(c.ControllerAddresses) == 0 {
		req(c.ControllerService, "controller-service")
		req(c.ControllerNamespace, "controller-namespace")
	}
	for _, a := range c.ControllerAddresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("--controller-addresses: %q: %w", a, err))
		}
	}
	if c.ControllerTLSServerName != "" && !route.IsDNSName(c.ControllerTLSServerName) {
		errs = append(errs, fmt.Errorf("--controller-tls-server-name %q is not a DNS name", c.ControllerTLSServerName))
	}
	pos := func(d time.Duration, flag string) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("--%s %s must be positive", flag, d))
		}
	}
	pos(c.ReportInterval, "report-interval")
	pos(c.ReconnectMin, "reconnect-min")
	pos(c.ShutdownTimeout, "shutdown-timeout")
	pos(c.CacheIdleTimeout, "cache-idle-timeout")
	if c.ReconnectMax < c.ReconnectMin {
		errs = append(errs, fmt.Errorf("--reconnect-max %s is below --reconnect-min %s", c.ReconnectMax, c.ReconnectMin))
	}
	if c.DrainDelay < 0 {
		errs = append(errs, fmt.Errorf("--drain-delay %s must not be negative", c.DrainDelay))
	}
	if c.NegativeCacheTTL < 0 || c.NegativeCacheTTL > maxNegativeCacheTTL {
		errs = append(errs, fmt.Errorf("--negative-cache-ttl %s: want 0 (off) to %s, so that a new Function is callable within 2s", c.NegativeCacheTTL, maxNegativeCacheTTL))
	}
	if c.NegativeCacheSize < 0 {
		errs = append(errs, fmt.Errorf("--negative-cache-size %d must not be negative", c.NegativeCacheSize))
	}
	if c.PreconnectPoolPods < 0 {
		errs = append(errs, fmt.Errorf("--preconnect-pool-pods %d must not be negative", c.PreconnectPoolPods))
	}
	if _, err := loglevel.Parse(c.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %w", err))
	}
	errs = append(errs, c.Options.Validate()...)
	errs = append(errs, c.validateSteering()...)
	return errors.Join(errs...)
}

// Sidecar defaults (applyModeDefaults) for the flags that differ from a
// DaemonSet's.
const (
	SidecarListen      = "127.0.0.1:8380"
	SidecarAdminListen = "127.0.0.1:8381"
)

// validateSidecar checks what a sidecar may not do: serve other pods, or
// touch the node (its address, BPF steering).
func (c Config) validateSidecar() []error {
	var errs []error
	if host, _, err := net.SplitHostPort(c.Listen); err == nil && !isLoopback(host) {
		errs = append(errs, fmt.Errorf("--listen %s: a sidecar serves its own pod only: want a loopback address such as %s", c.Listen, SidecarListen))
	}
	if c.LocalAddress != "" {
		errs = append(errs, fmt.Errorf("--local-address %s: the node-local address belongs to the DaemonSet router; a sidecar runs with --local-address=", c.LocalAddress))
	}
	if c.BPF != BPFOff {
		errs = append(errs, fmt.Errorf("--bpf=%s: BPF steering belongs to the DaemonSet router; a sidecar runs with --bpf=off", c.BPF))
	}
	return errs
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// applyModeDefaults gives a sidecar its own defaults for the flags that
// were not set (by flag or environment): loopback listeners, no node-local
// address, no BPF steering, no cgroup reading (its pod cannot see the
// node's cgroups).
func (c *Config) applyModeDefaults(set map[string]bool) {
	if c.Mode != ModeSidecar {
		return
	}
	def := func(p *string, name, v string) {
		if !set[name] {
			*p = v
		}
	}
	def(&c.Listen, "listen", SidecarListen)
	def(&c.AdminListen, "admin-listen", SidecarAdminListen)
	def(&c.LocalAddress, "local-address", "")
	def(&c.BPF, "bpf", BPFOff)
	def(&c.CgroupRoot, "cgroup-root", "")
}

func (c Config) validateSteering() []error {
	var errs []error
	if c.LocalAddress != "" {
		if a, err := netip.ParseAddr(c.LocalAddress); err != nil || !a.Is4() {
			errs = append(errs, fmt.Errorf("--local-address %q: want an IPv4 address, or empty to disable", c.LocalAddress))
		}
	}
	if c.LocalPort < 1 || c.LocalPort > 65535 {
		errs = append(errs, fmt.Errorf("--local-port %d: want 1 to 65535", c.LocalPort))
	}
	if c.LocalAddressInterval <= 0 {
		errs = append(errs, fmt.Errorf("--local-address-interval %s must be positive", c.LocalAddressInterval))
	}
	switch c.BPF {
	case BPFOff:
		return errs
	case BPFAuto, BPFRequired:
	default:
		return append(errs, fmt.Errorf("--bpf %q: want %s, %s or %s", c.BPF, BPFOff, BPFAuto, BPFRequired))
	}
	if c.LocalAddress == "" {
		errs = append(errs, fmt.Errorf("--bpf=%s needs --local-address: steered calls go there", c.BPF))
	}
	if len(c.BPFVIPs) == 0 && (c.BPFService == "" || len(c.ControllerAddresses) > 0) {
		errs = append(errs, fmt.Errorf("--bpf=%s needs --bpf-vips, or --bpf-service read from the API server (not with --controller-addresses)", c.BPF))
	}
	for _, v := range c.BPFVIPs {
		if ap, err := netip.ParseAddrPort(v); err != nil || !ap.Addr().Unmap().Is4() {
			errs = append(errs, fmt.Errorf("--bpf-vips: %q: want IPv4 ip:port", v))
		}
	}
	if c.BPFCgroup != "" && !filepath.IsLocal(c.BPFCgroup) && !filepath.IsAbs(c.BPFCgroup) {
		errs = append(errs, fmt.Errorf("--bpf-cgroup %q: want an absolute path or one relative to the cgroup2 mount, without ..", c.BPFCgroup))
	}
	if c.BPFPinDir != "" && !filepath.IsAbs(c.BPFPinDir) {
		errs = append(errs, fmt.Errorf("--bpf-pin-dir %q: want an absolute path", c.BPFPinDir))
	}
	if c.BPFMaxAge <= 0 {
		errs = append(errs, fmt.Errorf("--bpf-max-age %s must be positive", c.BPFMaxAge))
	}
	return errs
}

// maxNegativeCacheTTL keeps the brief's promise that a new Function is
// callable within 2s of its creation.
const maxNegativeCacheTTL = time.Second
