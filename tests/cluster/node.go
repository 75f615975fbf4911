package cluster

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// A node runs a real kubelet and containerd (see NodeSpec). What each
// needs and neither defaults to is set here, once, as pure functions of
// the node: the files are written by Up and the node
// process (RunNode) only mounts them and starts the daemons.

// Paths on the machine the node's daemons use.
const (
	// cniBinDir holds Debian's containernetworking-plugins.
	cniBinDir = "/usr/lib/cni"
	// runcPath is Debian's runc.
	runcPath = "/usr/sbin/runc"
	// registryPort is the image registry's port on the bridge's address.
	registryPort = 5000
	// clusterDNSHost is the host number of the cluster DNS Service's
	// ClusterIP in the service range (198.19.0.10).
	clusterDNSHost = 10
	// podBridge is each node's pod bridge (the CNI bridge plugin's).
	podBridge = "cbr0"
	// clusterDNSDir is the cluster DNS's kustomize directory (CoreDNS),
	// relative to the repository, applied before Config.Apply.
	clusterDNSDir = "tests/cluster/dns"
)

// The node's private view of these machine paths: each is bound (or, for
// /run/netns, a fresh tmpfs) in the node's own mount namespace, so nodes
// never share a runtime socket, a content store, an IPAM record, a pod
// network namespace or the kubelet's fixed device-plugin socket directory.
var nodeMountPoints = []struct{ name, target string }{
	{"containerd", "/var/lib/containerd"},
	{"containerd-run", "/run/containerd"},
	{"kubelet", "/var/lib/kubelet"},
	{"cni", "/var/lib/cni"},
	{"log-containers", "/var/log/containers"},
}

// kernelTunables are the machine-wide sysctls the kubelet sets at start
// (kernel.panic and the rest: its setupKernelTunables) with the values it
// wants. A node binds a file of its own over each, so no node changes the
// machine's (this VM is shared; kernel.panic_on_oops=1 would be its
// owner's choice, not ours).
var kernelTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// inotifyFloors are the machine's inotify limits the nodes need, raised
// to these values if lower and never lowered (kind asks the same of its
// hosts). They are per user of the machine, not per namespace: every
// node's kubelet (its cAdvisor watches each container's cgroups) and
// containerd, and CoreDNS's reload, run as root and share them; the
// default of 128 instances runs out at a few dozen pods. Open files need
// nothing: Go raises a process's soft limit to its hard limit at start,
// and this VM's hard limit (20000 for root) cannot be raised (no
// CAP_SYS_RESOURCE), which is also why the kubelet logs that it failed to
// raise it.
var inotifyFloors = []struct {
	key   string
	floor int
}{
	{"fs/inotify/max_user_instances", 512},
	{"fs/inotify/max_user_watches", 524288},
}

// raiseInotify raises each of inotifyFloors that is lower; it reports
// what it changed.
func raiseInotify() ([]string, error) {
	var changed []string
	for _, f := range inotifyFloors {
		path := filepath.Join("/proc/sys", f.key)
		b, err := os.ReadFile(path)
		if err != nil {
			return changed, fmt.Errorf("read %s: %w", f.key, err)
		}
		cur, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return changed, fmt.Errorf("%s = %q: %w", f.key, b, err)
		}
		if cur >= f.floor {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.Itoa(f.floor)), 0o644); err != nil {
			return changed, fmt.Errorf("raise %s from %d to %d: %w", f.key, cur, f.floor, err)
		}
		changed = append(changed, fmt.Sprintf("%s %d -> %d", strings.ReplaceAll(f.key, "/", "."), cur, f.floor))
	}
	return changed, nil
}

// NodeMount is one mount the node process makes in its mount namespace.
type NodeMount struct {
	// Source is bound onto Target; empty mounts a fresh tmpfs there.
	Source string `json:"source,omitempty"`
	Target string `json:"target"`
}

// NodeDaemon is one daemon the node process starts.
type NodeDaemon struct {
	Name string   `json:"name"` // its log is <LogDir>/<node>-<Name>.log
	Path string   `json:"path"`
	Args []string `json:"args"`
	Env  []string `json:"env"`
	// Socket, when set, is a unix socket the daemon serves once ready:
	// the next daemon starts after it accepts a connection.
	Socket string `json:"socket,omitempty"`
}

// NodeSpec is what the node process (`skipper-cluster node`) of one node
// runs: written by Up as <node dir>/node.json, read by RunNode.
type NodeSpec struct {
	Name string `json:"name"`
	// Mounts, in order, in the node's own mount namespace.
	Mounts []NodeMount `json:"mounts"`
	// Sysctls are set in the node's network namespace (keys as
	// /proc/sys paths: net/ipv4/ip_forward).
	Sysctls map[string]string `json:"sysctls"`
	// Daemons start in order and stop in reverse.
	Daemons []NodeDaemon `json:"daemons"`
	// PodCgroups are the cgroup directories (one per hierarchy) holding
	// the node's pods: every process left in them is killed once the
	// kubelet has stopped.
	PodCgroups []string `json:"podCgroups"`
	// V1Cgroups are the node process's own v1 cgroups (its node's system
	// leaf), joined before any daemon starts: the cluster moves the
	// process there only after it has started, so a daemon started first
	// would stay in the machine's root cgroups.
	V1Cgroups []string `json:"v1Cgroups,omitempty"`
	LogDir    string   `json:"logDir"`
	// StopTimeout is each daemon's grace between SIGTERM and SIGKILL.
	StopTimeout Duration `json:"stopTimeout"`
}

// Duration is a time.Duration as JSON text ("10s").
type Duration string

// nodeDir is node n's directory under the state directory: its configs
// and the sources of its private mounts.
func (s State) nodeDir(n int) string { return filepath.Join(s.Dir, "nodes", NodeName(n)) }

// ContainerdSocket is node n's containerd socket, as the machine sees it
// (crictl --runtime-endpoint unix://<it>).
func (s State) ContainerdSocket(n int) string {
	return filepath.Join(s.nodeDir(n), "containerd-run", "containerd.sock")
}

// RuncRoot is the runc state directory of node n's pod containers (its
// containerd's k8s.io namespace), as the machine sees it: runc --root <it>
// kill <container ID> KILL.
func (s State) RuncRoot(n int) string {
	return filepath.Join(s.nodeDir(n), "containerd-run", "runc", "k8s.io")
}

// Registry is the address of the cluster's image registry (on the bridge).
func (c *Config) Registry() string {
	return netip.AddrPortFrom(c.Topology.Gateway.Addr(), registryPort).String()
}

// LocalImage is ref (a repository path such as skipper-dev/skipper, and
// a tag) in the cluster's registry.
func (c *Config) LocalImage(repo, tag string) string {
	return c.Registry() + "/" + repo + ":" + tag
}

// pauseImage is the sandbox image every node's containerd uses (pinned).
func (c *Config) pauseImage() string { return c.LocalImage("skipper-dev/pause", "dev") }

// ClusterDNS is the cluster DNS Service's ClusterIP.
func (t Topology) ClusterDNS() netip.Addr {
	b := t.ServiceCIDR.Masked().Addr().As4()
	b[3] = clusterDNSHost
	return netip.AddrFrom4(b)
}

// nodeSpec returns node n's NodeSpec and the files Up writes for it (path
// → content) before starting its node process.
func (c *Config) nodeSpec(n int, cg Cgroups) (NodeSpec, map[string]string) {
	dir := c.State.nodeDir(n)
	etc := filepath.Join(dir, "etc")
	files := map[string]string{
		filepath.Join(etc, "containerd.toml"):                     c.containerdConfig(dir),
		filepath.Join(etc, "kubelet.yaml"):                        c.kubeletConfig(n, cg),
		filepath.Join(etc, "cni", "10-skipper.conflist"):          c.cniConfig(n),
		filepath.Join(etc, "certs.d", c.Registry(), "hosts.toml"): registryHosts(c.Registry()),
	}
	spec := NodeSpec{
		Name:        NodeName(n),
		Sysctls:     map[string]string{"net/ipv4/ip_forward": "1"},
		LogDir:      filepath.Dir(c.State.LogPath("x")),
		StopTimeout: Duration(c.StopTimeout.String()),
	}
	// A pod reaching a Service backend on its own bridge has its reply
	// un-NATed by kube-proxy's rules only if bridged traffic passes
	// iptables (br_netfilter, a per-namespace setting).
	if _, err := os.Stat("/proc/sys/net/bridge/bridge-nf-call-iptables"); err == nil {
		spec.Sysctls["net/bridge/bridge-nf-call-iptables"] = "1"
	}
	for _, m := range nodeMountPoints {
		spec.Mounts = append(spec.Mounts, NodeMount{Source: filepath.Join(dir, m.name), Target: m.target})
	}
	// Container logs outlive the run, beside the other logs.
	spec.Mounts = append(spec.Mounts,
		NodeMount{Source: filepath.Join(c.State.PodLogDir(), NodeName(n)), Target: "/var/log/pods"},
		NodeMount{Target: "/run/netns"})
	for _, k := range sortedKeys(kernelTunables) {
		src := filepath.Join(dir, "sysctl", strings.ReplaceAll(k, "/", "."))
		files[src] = kernelTunables[k] + "\n"
		spec.Mounts = append(spec.Mounts, NodeMount{Source: src, Target: "/proc/sys/" + k})
	}
	if len(cg.Hier) > 0 {
		spec.PodCgroups = cg.allDirs(path.Join(cg.NodeRel(n), "kubepods"))
	}
	pathEnv := "PATH=" + c.BinDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	p := PKI{Dir: c.State.PKI()}
	spec.Daemons = []NodeDaemon{
		{
			Name: "containerd", Path: filepath.Join(c.BinDir, "containerd"),
			Args:   []string{"--config", filepath.Join(etc, "containerd.toml")},
			Env:    []string{pathEnv},
			Socket: "/run/containerd/containerd.sock",
		},
		{
			Name: "kubelet", Path: c.kube("kubelet"),
			Args: []string{
				"--config=" + filepath.Join(etc, "kubelet.yaml"),
				"--kubeconfig=" + p.Kubeconfig(NodeName(n)),
				"--hostname-override=" + NodeName(n),
				"--node-ip=" + c.Topology.NodeIP(n).String(),
				"--cert-dir=" + filepath.Join(dir, "pki"),
				"--v=1",
			},
			Env: []string{pathEnv},
		},
	}
	return spec, files
}

// containerdConfig is node's containerd configuration (version 3, for
// containerd 2.x). Every path it would default to outside the node's
// private mounts is moved into dir, or the plugin needing it is off.
func (c *Config) containerdConfig(dir string) string {
	q := strconv.Quote
	return fmt.Sprintf(`# Written by skipper-cluster for one node; see tests/cluster/node.go.
version = 3
# Not /etc/containerd/conf.d: nothing of the machine's applies.
imports = []
# NRI's socket would be the machine's /var/run/nri; tracing exports nowhere.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "/run/containerd/containerd.sock"

[ttrpc]
  address = "/run/containerd/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = %[1]s

[plugins."io.containerd.image-verifier.v1.bindir"]
  bin_dir = %[2]s

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  # No public registry is reachable: the sandbox image comes from the
  # cluster's registry and is pinned, never collected.
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %[3]s
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %[4]s

[plugins."io.containerd.cri.v1.runtime"]
  # This VM denies CAP_SYS_RESOURCE: an OOM score below the runtime's own
  # fails every sandbox ("can't get final child's PID from pipe").
  restrict_oom_score_adj = true
  enable_cdi = false
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %[5]s
        # The kubelet's cgroupfs driver (hybrid cgroups: cpu and memory on v1).
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%[6]s]
    conf_dir = %[7]s
    max_conf_num = 1
`, q(filepath.Join(dir, "opt")), q(filepath.Join(dir, "image-verifier")), q(c.pauseImage()),
		q(filepath.Join(dir, "etc", "certs.d")), q(runcPath), q(cniBinDir), q(filepath.Join(dir, "etc", "cni")))
}

// registryHosts is containerd's hosts.toml for the cluster's registry:
// plain HTTP on the bridge.
func registryHosts(registry string) string {
	return fmt.Sprintf(`server = "http://%[1]s"

[host."http://%[1]s"]
  capabilities = ["pull", "resolve"]
`, registry)
}

// cniConfig wires node n's pods to its bridge cbr0 with addresses from
// its pod CIDR, the bridge holding the first as the pods' gateway;
// hairpin lets a pod reach itself through a Service.
func (c *Config) cniConfig(n int) string {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "skipper",
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      podBridge,
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": c.Topology.PodCIDR(n).String()}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	b, _ := json.MarshalIndent(conf, "", "  ")
	return string(b) + "\n"
}

// kubeletConfig is node n's KubeletConfiguration: what this machine and a
// test cluster need and the kubelet does not default to, each said.
func (c *Config) kubeletConfig(n int, cg Cgroups) string {
	cgroupRoot := ""
	if len(cg.Hier) > 0 {
		cgroupRoot = "cgroupRoot: " + cg.NodeRel(n) + "\n"
	}
	return fmt.Sprintf(`# Written by skipper-cluster for one node; see tests/cluster/node.go.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
# This VM's cgroups are hybrid (cpu and memory on v1): the cgroupfs driver
# (containerd's runc too), the node's pods under its own cgroup, and v1
# allowed (the kubelet refuses it by default since 1.35).
cgroupDriver: cgroupfs
%[1]sfailCgroupV1: false
failSwapOn: false
address: %[2]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[3]s}
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS: [%[4]s]
podCIDR: %[5]s
# Benches run hundreds of pool pods per node (the default is 110).
maxPods: 250
# Never evict and never collect images on a small shared disk: the
# thresholds are the least the kubelet accepts.
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1Mi"
  nodefs.inodesFree: "1"
  imagefs.available: "1Mi"
  imagefs.inodesFree: "1"
evictionPressureTransitionPeriod: 5s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# Pods start as soon as their images are there; nothing waits for a slow
# status sync.
nodeStatusUpdateFrequency: 4s
fileCheckFrequency: 20s
syncFrequency: 10s
# The kubelet's own tunables go to files bound over them (NodeSpec).
protectKernelDefaults: false
rotateCertificates: false
serverTLSBootstrap: false
`, cgroupRoot, c.Topology.NodeIP(n), PKI{Dir: c.State.PKI()}.Path("ca.crt"), c.Topology.ClusterDNS(), c.Topology.PodCIDR(n))
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
