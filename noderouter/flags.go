package noderouter

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"skipper.dev/skipper/controller/flagenv"
)

// listFlag is a comma-separated list.
type listFlag struct{ p *[]string }

func (l listFlag) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l listFlag) Set(s string) error {
	*l.p = nil
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l.p = append(*l.p, v)
		}
	}
	return nil
}

// flagSet binds c's fields to flags and names each flag's env fallbacks:
// its SKIPPER_<FLAG>, then the downward API's variable where it has one.
func (c *Config) flagSet() (*flag.FlagSet, flagenv.Vars) {
	fs := flag.NewFlagSet("skipper-noderouter", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	downward := flagenv.Vars{}
	str := func(p *string, name, usage string, extra ...string) {
		fs.StringVar(p, name, *p, usage)
		if len(extra) > 0 {
			downward[name] = extra
		}
	}
	dur := func(p *time.Duration, name, usage string) {
		fs.DurationVar(p, name, *p, usage)
	}
	str(&c.Listen, "listen", "data-plane address; the DaemonSet passes $(HOST_IP):8380")
	str(&c.AdminListen, "admin-listen", "address of /metrics, /healthz and /readyz; the DaemonSet passes $(HOST_IP):8381")
	str(&c.Mode, "mode", "daemonset (one router per node) or sidecar (in the caller's pod: --listen and --admin-listen default to 127.0.0.1:8380/8381, --listen must be loopback while --admin-listen may be the pod IP for the kubelet's probes, no --local-address, --bpf=off, no cgroup reading)")
	str(&c.NodeName, "node-name", "node this router serves (downward API spec.nodeName); labels metrics, identifies the router", "NODE_NAME")
	str(&c.PodName, "pod-name", "router pod's name (downward API metadata.name); required: controllers key the router's stream by it", "POD_NAME")
	str(&c.PodNamespace, "pod-namespace", "router pod's namespace (downward API metadata.namespace)", "POD_NAMESPACE")
	str(&c.PodServiceAccount, "pod-service-account", "router pod's ServiceAccount (downward API spec.serviceAccountName); a sidecar's calls are its own pod's, so this and --pod-namespace say who they come from for functions that list callers (spec.callers); unset: a sidecar's calls to such functions get 403 caller_unknown", "POD_SERVICE_ACCOUNT")
	fs.BoolVar(&c.CallerIndex, "caller-index", c.CallerIndex, "a DaemonSet router watches every pod of the cluster (list and watch of pods, kept small) to tell which pod a call came from by its source address, for functions that list callers (spec.callers); false: calls to such functions get 403 caller_unknown; sidecars never watch (their calls are their own pod's)")
	str(&c.ControllerService, "controller-service", "headless Service of the controllers; its ready EndpointSlice endpoints are the ring members")
	str(&c.ControllerNamespace, "controller-namespace", "namespace of --controller-service")
	str(&c.ControllerPortName, "controller-port-name", "EndpointSlice port of the controllers' gRPC server (the first port when none has this name)")
	fs.Var(listFlag{&c.ControllerAddresses}, "controller-addresses", "static comma-separated controller ip:port list; replaces the EndpointSlice informer (tests without Kubernetes)")
	str(&c.TokenFile, "token-file", "projected ServiceAccount token (audience skipper) sent to the controllers as authorization: Bearer, re-read as it is renewed; a path missing at start sends none (controllers with --auth tokenreview then refuse the router); empty: none")
	str(&c.ControllerTLSDir, "controller-tls-dir", "directory holding ca.crt (the controllers' Secret skipper-controller-tls, or a ConfigMap with its CA where that Secret cannot be mounted): controllers are dialled over TLS and their certificates verified against it and --controller-tls-server-name; re-read within a second of a change, the last good one kept when a new one does not parse; a bad directory fails the start; empty: plaintext (controllers must not run with --tls-dir)")
	str(&c.ControllerTLSServerName, "controller-tls-server-name", "DNS name the controllers' certificates carry, verified whatever pod IP is dialled (never resolved); empty: <controller-service>.<controller-namespace>.svc")
	str(&c.Kubeconfig, "kubeconfig", "kubeconfig path; empty: in-cluster config", "KUBECONFIG")
	str(&c.ClusterDomain, "cluster-domain", "the cluster's DNS `domain`: a call whose Host is <name>.<namespace>.svc.<domain> (a Function's own Service, an ExternalName of the router's) goes to that function, as do <name>.<namespace>.svc, <name>.<namespace> and <name>.<namespace>.fn; empty: the first form names nothing")
	str(&c.DefaultNamespace, "default-namespace", "namespace of a bare `x-skipper-function: <name>`; empty: <namespace>/<name> required")
	dur(&c.ColdStartTimeout, "cold-start-timeout", "bound of a cache miss (GetInstance); then 503 with Retry-After")
	dur(&c.NegativeCacheTTL, "negative-cache-ttl", "a function the controller reported unknown is answered 404 without asking again for this long; 0: off; at most 1s")
	fs.IntVar(&c.NegativeCacheSize, "negative-cache-size", c.NegativeCacheSize, "unknown function names remembered at most (the oldest is dropped first); 0: off")
	dur(&c.RequestTimeout, "request-timeout", "bound of a proxied request when the function sets no timeout; 0: none")
	dur(&c.ReportInterval, "report-interval", "interval of the load report sent to each connected controller")
	dur(&c.ReconnectMin, "reconnect-min", "first backoff between controller stream attempts (jittered, doubling)")
	dur(&c.ReconnectMax, "reconnect-max", "longest backoff between controller stream attempts")
	dur(&c.DrainDelay, "drain-delay", "after SIGTERM, keep serving this long with /readyz failing before closing the listeners")
	dur(&c.ShutdownTimeout, "shutdown-timeout", "then wait at most this long for in-flight requests (drain-delay + this < terminationGracePeriodSeconds)")
	dur(&c.DialTimeout, "dial-timeout", "bound of a TCP connect to an instance")
	fs.IntVar(&c.MaxIdleConnsPerHost, "max-idle-conns-per-host", c.MaxIdleConnsPerHost, "keep-alive connections kept per instance")
	fs.IntVar(&c.PreconnectPoolPods, "preconnect-pool-pods", c.PreconnectPoolPods, "a DaemonSet router keeps one idle connection open to each ready, unclaimed pool pod, up to this many, so that a function's first call finds its instance connected (opened and renewed with the instance's GET of its assignment; needs the pod watch, so a Kubernetes client; the h1 and loop forwarders); 0: none")
	dur(&c.IdleConnTimeout, "idle-conn-timeout", "idle instance connections are closed after this")
	fs.IntVar(&c.MaxAttempts, "max-attempts", c.MaxAttempts, "sends of a request at most, the first included, when it failed before any response (dial failure; broken connection of an idempotent request with no body sent)")
	fs.IntVar(&c.MaxQueue, "max-queue", c.MaxQueue, "requests per function that wait, each at most --cold-start-timeout, while every instance is at the function's concurrencyLimit; more: 503 with Retry-After; 0: no queue")
	dur(&c.RetryBackoffBase, "retry-backoff-base", "wait before the first retry (jittered, doubling per retry)")
	dur(&c.RetryBackoffMax, "retry-backoff-max", "longest wait before a retry")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", c.MaxHeaderBytes, "largest request header accepted; larger: 431")
	str(&c.Forwarder, "forwarder", "what forwards HTTP/1.1 requests: loop, event loops (one goroutine and epoll set each, nginx's way) serve warm bodiless GETs and HEADs whose answers have a length, and hand everything else with its connection to h1; h1, the router's own goroutine path alone (the goroutine that reads a request sends it on a pooled instance connection and copies the answer back, no hand-off); or nethttp (Go's net/http server and httputil.ReverseProxy); h2c callers are always served by net/http")
	fs.IntVar(&c.Loops, "loops", c.Loops, "event loops with --forwarder=loop; 0: one fewer than GOMAXPROCS, at least one (a P is left idle for the rest of the router: with every P in a loop, each wait in epoll makes the runtime start a spinning thread)")
	fs.Int64Var(&c.MaxBodyBytes, "max-body-bytes", c.MaxBodyBytes, "largest request body accepted, in bytes, for a Function without its own spec.maxBodyBytes; larger: 413 with a JSON reason (body_too_large), at once for a Content-Length over it, as the body streams otherwise; 0: no limit")
	fs.IntVar(&c.MaxInFlight, "max-in-flight", c.MaxInFlight, "requests the router handles at once, across all functions (queued and cold ones included); more: 503 with Retry-After and a JSON reason (router_overloaded); 0: no limit")
	dur(&c.CacheIdleTimeout, "cache-idle-timeout", "a function's cache entry with no request for this long and no instance assigned is dropped with its metric series; the next request asks the controller again")
	str(&c.LogLevel, "log-level", "debug, info, warn or error")
	str(&c.CgroupRoot, "cgroup-root", "directory below each cgroup hierarchy's mount (from /proc/self/mountinfo) where the pods' cgroups are found by the kubelet's naming; the CPU and memory of this node's instances are read there for the reports (a DaemonSet mounts the host's /sys/fs/cgroup); empty: not read")
	str(&c.LocalAddress, "local-address", "node-local IPv4 address kept on dummy link skipper0 (or as lo:skipper where dummy links are unsupported) and served on at --local-port; BPF steers calls there; needs CAP_NET_ADMIN (and CAP_NET_BIND_SERVICE for a port below 1024); empty: off")
	fs.IntVar(&c.LocalPort, "local-port", c.LocalPort, "data-plane port on --local-address")
	dur(&c.LocalAddressInterval, "local-address-interval", "how often --local-address is checked and restored if removed")
	str(&c.BPF, "bpf", "eBPF steering of calls to --bpf-vips to --local-address: off; auto (on when the kernel and capabilities allow, otherwise logged and off); required (start-up fails without it)")
	str(&c.BPFCgroup, "bpf-cgroup", "cgroup2 directory whose sockets are steered: absolute (or its unified/ subdirectory on a hybrid host; in a DaemonSet the host's /sys/fs/cgroup by hostPath), relative to the cgroup2 mount (the local cluster passes skipper/<node>), or empty: the cgroup2 mount in /proc/self/mountinfo")
	str(&c.BPFPinDir, "bpf-pin-dir", "bpffs directory where steering is pinned so it survives router restarts; empty: not pinned")
	fs.Var(listFlag{&c.BPFVIPs}, "bpf-vips", "comma-separated ip:port list of steered destinations; empty: the ClusterIPs and ports of --bpf-service, followed as it changes")
	fs.BoolVar(&c.BPFSkMsg, "bpf-sk-msg", c.BPFSkMsg, "with BPF steering, also redirect payload between steered callers' sockets and this router's (sk_msg on a sockhash), skipping the TCP/IP stack on the node")
	str(&c.BPFService, "bpf-service", "the router's own Service in --controller-namespace, whose ClusterIP:port pairs are steered when --bpf-vips is empty")
	dur(&c.BPFMaxAge, "bpf-max-age", "steering stays on this long after the router's last liveness heartbeat (sent every quarter of it), then calls fail open to the Service")
	return fs, flagenv.Names(fs, downward)
}

// ParseConfig builds a Config from the defaults, the environment variables
// getenv looks up and args, by flagenv's rules (flags win over the
// environment). It returns flag.ErrHelp after writing usage to w for
// --help, and a validated Config otherwise.
func ParseConfig(args []string, getenv func(string) (string, bool), w io.Writer) (Config, error) {
	c := DefaultConfig()
	fs, vars := c.flagSet()
	if err := flagenv.Parse(fs, vars, args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			writeUsage(w, fs, vars)
		}
		return c, err
	}
	set := map[string]bool{} // by flag or environment
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.applyModeDefaults(set)
	return c, c.Validate()
}

func writeUsage(w io.Writer, fs *flag.FlagSet, vars flagenv.Vars) {
	fmt.Fprint(w, `Usage: skipper-noderouter [flags]

skipper-noderouter routes HTTP calls to Skipper functions from the node they
are made on. A request names its function with the header
"x-skipper-function: <namespace>/<name>", or by its Host: the function's own
Service (<name>.<namespace>.svc.<--cluster-domain>, <name>.<namespace>.svc,
<name>.<namespace>) or <name>.<namespace>.fn; the router proxies it to an
instance it has cached, asking the function's owning controller
(GetInstance) only on a miss.

Subcommands:
  skipper-noderouter bpf-cleanup [--bpf-pin-dir DIR] [--local-address ADDR]
        uninstall: detach and unpin the BPF steering under --bpf-pin-dir and
        remove the node-local address (see bpf-cleanup --help)

Flags (each falls back to the environment variables shown; flags win):
`)
	flagenv.PrintFlags(w, fs, vars)
}
