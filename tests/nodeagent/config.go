package nodeagent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// Config is the node agent's configuration. Defaults live in defaultConfig.
type Config struct {
	// Kubeconfig is the node's kubeconfig (identity system:node:<NodeName>). Required.
	Kubeconfig string
	// NodeName is the Node to register. Required.
	NodeName string
	// NodeIP is the node's InternalIP; hostNetwork pods get it. Required.
	NodeIP netip.Addr
	// PodCIDR is written to the Node's spec and pod IPs come from it. Required.
	PodCIDR netip.Prefix
	// APIServerHost/Port become KUBERNETES_SERVICE_HOST/PORT in every
	// container. Default: the kubeconfig's server.
	APIServerHost string
	APIServerPort int
	// Images maps image repositories to local directories (--image-dir).
	Images ImageMap
	// PodLogDir receives <ns>_<pod>_<container>.log. Default .skipper/logs/pods.
	PodLogDir string
	// MaxPods is the Node's pods capacity. Default 250.
	MaxPods int
	// StatusInterval is how often the Node's Ready condition is refreshed. Default 10s.
	StatusInterval time.Duration
	// LeaseDuration is the Lease's leaseDurationSeconds. Default 40s.
	LeaseDuration time.Duration
	// LeaseRenewInterval is how often the Lease is renewed. Default 10s.
	LeaseRenewInterval time.Duration
	// VolumeResync is how often mounted volumes are rewritten from the API
	// (ConfigMap changes, token refreshes). Default 60s.
	VolumeResync time.Duration
	// Cgroup is the node's cgroup2 directory (the agent itself runs in a
	// leaf of it, so cgroup2 lets it hand controllers down). Pod
	// cgroups are made under it, kubepods/<qos>/pod<uid>/<container>, and at
	// the same relative path in the v1 hierarchies of cpu, cpuacct, memory
	// and pids. Empty: pods get no cgroups of their own.
	Cgroup string
	// PodNetnsPrefix + pod UID names each pod's network namespace (under
	// /run/netns). Default: skipper-<NodeName>-pod-.
	PodNetnsPrefix string
	// KubeletVersion is reported in the Node's nodeInfo. Default v1.37.2.
	KubeletVersion string
	// ContainerInit is the container init binary (package containerinit)
	// started for every container. Default: skipper-container-init next to
	// the agent's own executable.
	ContainerInit string
}

func defaultConfig() Config {
	return Config{
		Images:             ImageMap{},
		PodLogDir:          ".skipper/logs/pods",
		MaxPods:            250,
		StatusInterval:     10 * time.Second,
		LeaseDuration:      40 * time.Second,
		LeaseRenewInterval: 10 * time.Second,
		VolumeResync:       60 * time.Second,
		KubeletVersion:     "v1.37.2",
	}
}

// Validate reports every problem with the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.Kubeconfig == "" {
		errs = append(errs, errors.New("--kubeconfig is required"))
	}
	if c.NodeName == "" {
		errs = append(errs, errors.New("--node-name is required"))
	}
	if !c.NodeIP.IsValid() || !c.NodeIP.Is4() {
		errs = append(errs, errors.New("--node-ip is required (IPv4)"))
	}
	if !c.PodCIDR.IsValid() || !c.PodCIDR.Addr().Is4() {
		errs = append(errs, errors.New("--pod-cidr is required (IPv4)"))
	}
	if c.APIServerHost == "" || c.APIServerPort <= 0 {
		errs = append(errs, errors.New("--apiserver-host and --apiserver-port are required when the kubeconfig does not name a server"))
	}
	if c.PodNetnsPrefix == "" || strings.Contains(c.PodNetnsPrefix, "/") {
		errs = append(errs, fmt.Errorf("--pod-netns-prefix %q: want a non-empty name prefix (every namespace with it belongs to this agent)", c.PodNetnsPrefix))
	}
	if c.MaxPods <= 0 {
		errs = append(errs, fmt.Errorf("--max-pods %d: must be positive", c.MaxPods))
	}
	for name, d := range map[string]time.Duration{"--status-interval": c.StatusInterval, "--lease-duration": c.LeaseDuration,
		"--lease-renew-interval": c.LeaseRenewInterval, "--volume-resync": c.VolumeResync} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	if c.LeaseRenewInterval >= c.LeaseDuration {
		errs = append(errs, errors.New("--lease-renew-interval must be shorter than --lease-duration"))
	}
	return errors.Join(errs...)
}

const usage = `skipper-nodeagent is the local cluster's kubelet stand-in. It registers a
Node, keeps it Ready (status and Lease), and runs the containers of pods bound
to it as local processes: image repositories map to directories (--image-dir),
the executable is <dir>/<basename of command[0]>. Every pod gets its own
network namespace (unless hostNetwork) with eth0 on the bridge cbr0 (gateway:
the first address of --pod-cidr) and an IP from --pod-cidr, its own cgroups
under --cgroup named as the kubelet names them, and its own mount namespace
with a private /run holding its volumes (projected service-account token,
ConfigMaps, Secrets, downward API, emptyDir; mount paths must be under /run or
/var/run). Run it inside the node's network namespace, in a leaf cgroup of
--cgroup.

Usage: skipper-nodeagent [flags]

Flags (environment fallbacks in brackets):
`

// parseFlags parses args into a Config.
func parseFlags(args []string, stderr io.Writer) (*Config, error) {
	c := defaultConfig()
	fs := flag.NewFlagSet("skipper-nodeagent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var nodeIP, podCIDR string
	fs.StringVar(&c.Kubeconfig, "kubeconfig", env("SKIPPER_NODEAGENT_KUBECONFIG", ""), "kubeconfig with the node's identity (system:node:<node>) (required) [SKIPPER_NODEAGENT_KUBECONFIG]")
	fs.StringVar(&c.NodeName, "node-name", env("SKIPPER_NODEAGENT_NODE_NAME", ""), "name of the Node to register (required) [SKIPPER_NODEAGENT_NODE_NAME]")
	fs.StringVar(&nodeIP, "node-ip", env("SKIPPER_NODEAGENT_NODE_IP", ""), "the node's IPv4 address: InternalIP, hostIP, hostNetwork pods' IP (required) [SKIPPER_NODEAGENT_NODE_IP]")
	fs.StringVar(&podCIDR, "pod-cidr", env("SKIPPER_NODEAGENT_POD_CIDR", ""), "the node's pod CIDR, written to the Node's spec.podCIDR (required) [SKIPPER_NODEAGENT_POD_CIDR]")
	fs.StringVar(&c.APIServerHost, "apiserver-host", env("SKIPPER_NODEAGENT_APISERVER_HOST", ""), "KUBERNETES_SERVICE_HOST for containers (default: the kubeconfig's server host) [SKIPPER_NODEAGENT_APISERVER_HOST]")
	fs.IntVar(&c.APIServerPort, "apiserver-port", envInt("SKIPPER_NODEAGENT_APISERVER_PORT", 0), "KUBERNETES_SERVICE_PORT for containers (default: the kubeconfig's server port) [SKIPPER_NODEAGENT_APISERVER_PORT]")
	fs.Func("image-dir", "image repository mapped to a local directory, <image>=<abs dir>, any tag; repeatable, e.g. ghcr.io/skipper-dev/skipper=/work/main/bin", c.Images.ParseImageDir)
	fs.StringVar(&c.PodLogDir, "pod-log-dir", env("SKIPPER_NODEAGENT_POD_LOG_DIR", c.PodLogDir), "directory for container logs <ns>_<pod>_<container>.log [SKIPPER_NODEAGENT_POD_LOG_DIR]")
	fs.IntVar(&c.MaxPods, "max-pods", envInt("SKIPPER_NODEAGENT_MAX_PODS", c.MaxPods), "pods capacity and allocatable of the Node [SKIPPER_NODEAGENT_MAX_PODS]")
	fs.DurationVar(&c.StatusInterval, "status-interval", envDuration("SKIPPER_NODEAGENT_STATUS_INTERVAL", c.StatusInterval), "how often the Node status (Ready heartbeat) is written [SKIPPER_NODEAGENT_STATUS_INTERVAL]")
	fs.DurationVar(&c.LeaseDuration, "lease-duration", envDuration("SKIPPER_NODEAGENT_LEASE_DURATION", c.LeaseDuration), "the node Lease's duration [SKIPPER_NODEAGENT_LEASE_DURATION]")
	fs.DurationVar(&c.LeaseRenewInterval, "lease-renew-interval", envDuration("SKIPPER_NODEAGENT_LEASE_RENEW_INTERVAL", c.LeaseRenewInterval), "how often the node Lease in kube-node-lease is renewed [SKIPPER_NODEAGENT_LEASE_RENEW_INTERVAL]")
	fs.DurationVar(&c.VolumeResync, "volume-resync", envDuration("SKIPPER_NODEAGENT_VOLUME_RESYNC", c.VolumeResync), "how often running pods' volumes are rewritten from the API [SKIPPER_NODEAGENT_VOLUME_RESYNC]")
	fs.StringVar(&c.Cgroup, "cgroup", env("SKIPPER_NODEAGENT_CGROUP", ""), "the node's cgroup2 directory: pod cgroups go under it (kubepods/<qos>/pod<uid>/<container>) and at the same relative path in the v1 cpu, cpuacct, memory and pids hierarchies; empty: no pod cgroups [SKIPPER_NODEAGENT_CGROUP]")
	fs.StringVar(&c.PodNetnsPrefix, "pod-netns-prefix", env("SKIPPER_NODEAGENT_POD_NETNS_PREFIX", ""), "prefix of the pods' network namespace names (prefix + pod UID, under /run/netns); the agent deletes every namespace with it at start and exit (default: skipper-<node-name>-pod-) [SKIPPER_NODEAGENT_POD_NETNS_PREFIX]")
	fs.StringVar(&c.ContainerInit, "container-init", env("SKIPPER_NODEAGENT_CONTAINER_INIT", ""), "the container init binary started for every container: it sets up the container's mount namespace and execs its command (default: skipper-container-init next to this binary) [SKIPPER_NODEAGENT_CONTAINER_INIT]")
	fs.StringVar(&c.KubeletVersion, "kubelet-version", env("SKIPPER_NODEAGENT_KUBELET_VERSION", c.KubeletVersion), "version reported as the Node's kubeletVersion [SKIPPER_NODEAGENT_KUBELET_VERSION]")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var errs []error
	if nodeIP != "" {
		ip, err := netip.ParseAddr(nodeIP)
		if err != nil {
			errs = append(errs, fmt.Errorf("--node-ip: %w", err))
		}
		c.NodeIP = ip
	}
	if podCIDR != "" {
		p, err := netip.ParsePrefix(podCIDR)
		if err != nil {
			errs = append(errs, fmt.Errorf("--pod-cidr: %w", err))
		}
		c.PodCIDR = p.Masked()
	}
	if c.PodNetnsPrefix == "" && c.NodeName != "" {
		c.PodNetnsPrefix = "skipper-" + c.NodeName + "-pod-"
	}
	if (c.APIServerHost == "" || c.APIServerPort == 0) && c.Kubeconfig != "" {
		if host, port, err := serverFromKubeconfig(c.Kubeconfig); err == nil {
			if c.APIServerHost == "" {
				c.APIServerHost = host
			}
			if c.APIServerPort == 0 {
				c.APIServerPort = port
			}
		}
	}
	if err := errors.Join(append(errs, c.Validate())...); err != nil {
		return nil, err
	}
	return &c, nil
}

func serverFromKubeconfig(path string) (string, int, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return "", 0, err
	}
	u, err := url.Parse(rc.Host)
	if err != nil {
		return "", 0, err
	}
	port := 443
	if p := u.Port(); p != "" {
		port, _ = strconv.Atoi(p)
	}
	return u.Hostname(), port, nil
}

func env(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

func envInt(key string, def int) int {
	if v, ok := os.LookupEnv(key); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
			return n
		}
	}
	return def
}

func envDuration(key string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(key); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}
