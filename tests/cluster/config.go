package cluster

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"skipper.dev/skipper/controller/flagenv"
)

// Config is the configuration of `skipper-cluster up` and `down`.
type Config struct {
	// RepoDir is the repository root; relative paths below resolve against it.
	// Default: the working directory.
	RepoDir string
	// State is the state directory. Default: <RepoDir>/.skipper.
	State State
	// BinDir holds bin/kube's symlinks and the Skipper binaries. Default: <RepoDir>/bin.
	BinDir string
	// Nodes is the node count. Default 2.
	Nodes int
	// Apply lists kustomize directories applied in order with
	// `kubectl apply --server-side -k`. Default: deploy/overlays/local, deploy/overlays/local-examples.
	Apply []string
	// Function is the function whose answer through node 1's router marks the
	// cluster ready; empty skips the wait. Default: default/echo.
	Function string
	// StartTimeout bounds each control-plane component's start. Default 90s.
	StartTimeout time.Duration
	// ReadyTimeout bounds the wait for the node, the manifests and Function
	// to answer. Default 120s.
	ReadyTimeout time.Duration
	// StopTimeout is the grace between SIGTERM and SIGKILL. Default 10s.
	StopTimeout time.Duration
	// LockWait bounds the wait for another cluster on this machine (one with
	// another state directory, e.g. a test's) to stop; 0 refuses at once.
	// Default 5m from the command line, 0 for a Config built in code.
	LockWait time.Duration
	// Topology is the network; DefaultTopology unless a test sets another.
	Topology Topology
	// CgroupName is the cluster's cgroup under the root of every cgroup
	// hierarchy. Default "skipper".
	CgroupName string
	// ProxyMode is kube-proxy's mode on every node: iptables, nftables, or
	// none (no kube-proxy: Service ClusterIPs do not work). Default iptables.
	ProxyMode string
	// Stdout receives the one `skipper: ready` line. Default os.Stdout.
	Stdout io.Writer
}

// DefaultCgroupName is the cluster's cgroup, /skipper under the root of
// every hierarchy; node N's is /skipper/node<N>.
const DefaultCgroupName = "skipper"

// kube-proxy modes (Config.ProxyMode).
const (
	ProxyIPTables = "iptables"
	ProxyNFTables = "nftables"
	ProxyNone     = "none"
)

// defaults fills unset fields.
func (c *Config) defaults() error {
	if c.RepoDir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		c.RepoDir = wd
	}
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return filepath.Clean(p)
		}
		return filepath.Join(c.RepoDir, p)
	}
	c.RepoDir = abs(c.RepoDir)
	if c.State.Dir == "" {
		c.State.Dir = ".skipper"
	}
	c.State.Dir = abs(c.State.Dir)
	if c.BinDir == "" {
		c.BinDir = "bin"
	}
	c.BinDir = abs(c.BinDir)
	if c.Nodes == 0 {
		c.Nodes = 2
	}
	if c.Apply == nil {
		c.Apply = []string{"deploy/overlays/local", "deploy/overlays/local-examples"}
	}
	for i, a := range c.Apply {
		c.Apply[i] = abs(a)
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = 90 * time.Second
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 120 * time.Second
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = 10 * time.Second
	}
	if c.Topology.Bridge == "" {
		c.Topology = DefaultTopology()
	}
	if c.CgroupName == "" {
		c.CgroupName = DefaultCgroupName
	}
	if c.ProxyMode == "" {
		c.ProxyMode = ProxyIPTables
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	return nil
}

// Validate reports every problem with the configuration.
func (c *Config) Validate() error {
	var errs []error
	if err := c.Topology.Validate(c.Nodes); err != nil {
		errs = append(errs, err)
	}
	if c.StartTimeout <= 0 || c.ReadyTimeout <= 0 || c.StopTimeout <= 0 || c.LockWait < 0 {
		errs = append(errs, errors.New("timeouts must be positive"))
	}
	switch c.ProxyMode {
	case ProxyIPTables, ProxyNFTables, ProxyNone:
	default:
		errs = append(errs, fmt.Errorf("--proxy-mode %q: want %s, %s or %s", c.ProxyMode, ProxyIPTables, ProxyNFTables, ProxyNone))
	}
	if c.Function != "" && !strings.Contains(c.Function, "/") {
		errs = append(errs, fmt.Errorf("--function %q: want <namespace>/<name>", c.Function))
	}
	return errors.Join(errs...)
}

// listFlag is a repeatable string flag; the first Set replaces the default.
type listFlag struct {
	vals *[]string
	set  bool
}

func (l *listFlag) String() string {
	if l.vals == nil {
		return ""
	}
	return strings.Join(*l.vals, ",")
}

func (l *listFlag) Set(v string) error {
	if !l.set {
		*l.vals, l.set = []string{}, true // non-nil: an explicit empty list is not the default
	}
	if v != "" {
		*l.vals = append(*l.vals, v)
	}
	return nil
}

const usageHead = `skipper-cluster runs Skipper's local Kubernetes cluster (root only).

Usage:
  skipper-cluster up [flags]    start the cluster in the foreground; Ctrl-C (or
                                'skipper-cluster down' from any shell) stops it
  skipper-cluster down [flags]  stop a running cluster and remove everything it
                                made (processes, netns, links, routes, mounts,
                                cgroups, .skipper/ runtime state); idempotent
  skipper-cluster stop NAME [flags]
                                stop one control-plane component of the running
                                cluster (etcd, kube-apiserver,
                                kube-controller-manager, kube-scheduler) while
                                the rest keeps running; it is started again by
                                'start', or by the cluster after 30s so that
                                nodes stay Ready
  skipper-cluster start NAME [flags]
                                start it again; returns once it is ready

'up' generates a CA, certificates and kubeconfigs under .skipper/pki, builds the
network (bridge skipper-br0 198.51.100.1/24, node N in netns skipper-node<N> at
198.51.100.<10+N> with pods in 198.18.<N>.0/24, each pod in its own netns on
the node's bridge cbr0), starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler (from bin/kube) and a registry on the bridge serving make
image's images (198.51.100.1:5000), and runs each node in its netns and a
mount namespace of its own: a kubelet (bin/kube), containerd (make
containerd) with Debian's runc and CNI plugins, and one kube-proxy; applies
the cluster DNS (tests/cluster/dns, CoreDNS), then each --apply directory
with 'kubectl apply --server-side -k', waits for --function to answer
through node 1's router, writes .skipper/env and prints one line
'skipper: ready ...'.
`

// parseFlags parses the flags of up and down into a Config, each falling
// back to the variable named in its usage, looked up by getenv, by
// flagenv's rules.
func parseFlags(cmd string, args []string, getenv func(string) (string, bool), stderr io.Writer) (*Config, error) {
	c := &Config{}
	fs := flag.NewFlagSet("skipper-cluster "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.RepoDir, "repo", "", "repository root; relative paths resolve against it (default: working directory) [SKIPPER_REPO]")
	fs.StringVar(&c.State.Dir, "state-dir", ".skipper", "state directory: pki, pid files, logs, env, nodes/ (each node's containerd, kubelet and CNI state) [SKIPPER_STATE_DIR]")
	fs.StringVar(&c.BinDir, "bin-dir", "bin", "directory with kube's symlinks and the Skipper binaries [SKIPPER_BIN_DIR]")
	fs.IntVar(&c.Nodes, "nodes", 2, "number of nodes [SKIPPER_NODES]")
	c.Apply = []string{"deploy/overlays/local", "deploy/overlays/local-examples"}
	fs.Var(&listFlag{vals: &c.Apply}, "apply", "kustomize directory to apply, in order; repeatable; an empty value applies nothing")
	fs.StringVar(&c.Function, "function", "default/echo", "function that must answer through node 1's router before 'ready'; empty: do not wait [SKIPPER_READY_FUNCTION]")
	fs.StringVar(&c.ProxyMode, "proxy-mode", ProxyIPTables, "kube-proxy mode on every node: iptables, nftables, or none (no kube-proxy; Service ClusterIPs do not work) [SKIPPER_PROXY_MODE]")
	fs.DurationVar(&c.StartTimeout, "start-timeout", 90*time.Second, "bound on each control-plane component's start [SKIPPER_START_TIMEOUT]")
	fs.DurationVar(&c.ReadyTimeout, "ready-timeout", 120*time.Second, "bound on the wait for a Ready node, the manifests and the function's answer [SKIPPER_READY_TIMEOUT]")
	fs.DurationVar(&c.StopTimeout, "stop-timeout", 10*time.Second, "grace between SIGTERM and SIGKILL for each process [SKIPPER_STOP_TIMEOUT]")
	fs.DurationVar(&c.LockWait, "lock-wait", 5*time.Minute, "how long 'up' waits for another local cluster on this machine (one with another state dir, e.g. a test's) to stop; 0 refuses at once [SKIPPER_LOCK_WAIT]")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHead)
		fmt.Fprint(fs.Output(), "\nFlags (environment fallbacks in brackets):\n")
		fs.PrintDefaults()
	}
	vars := flagenv.Names(fs, nil)
	vars["function"] = []string{"SKIPPER_READY_FUNCTION"}
	delete(vars, "apply") // repeatable: the command line only
	if err := flagenv.Parse(fs, vars, args, getenv); err != nil {
		return nil, err
	}
	if err := c.defaults(); err != nil {
		return nil, err
	}
	return c, c.Validate()
}
