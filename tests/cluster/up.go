package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// ErrRunning is returned by Up when a cluster already runs.
var ErrRunning = errors.New("a local cluster already runs")

// kubeComponents are the bin/kube symlinks the cluster needs.
var kubeComponents = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet", "kubectl"}

// cluster is one run of Up.
type cluster struct {
	cfg     *Config
	log     *slog.Logger
	proxies []*Proc // kube-proxy of node 1, 2, ...
	cg      Cgroups
	// layoutDigest is LayoutDigest of the images the registry serves.
	layoutDigest string
	died         chan *Proc // children that exited (watch)

	mu    sync.Mutex
	procs []*Proc // in start order; a restarted component takes its old slot
	// restart: how each restartable component starts (restart.go);
	// retiredProcs: processes Control stopped, whose exit is expected.
	restart      map[string]restartSpec
	retiredProcs map[*Proc]bool
	outages      map[string]*time.Timer // the MaxOutage restart of each stopped component
	closing      bool                   // teardown began: nothing starts again
}

// Up starts the cluster and blocks until ctx ends or a child dies, then
// tears everything down. It returns nil after a clean shutdown on ctx.
func Up(ctx context.Context, cfg *Config, log *slog.Logger) (err error) {
	begin := time.Now()
	if err := cfg.preflight(); err != nil {
		return err
	}
	live, err := cfg.State.Live()
	if err != nil {
		return err
	}
	if len(live) > 0 {
		return fmt.Errorf("%w (%s): use it, or stop it with 'skipper-cluster down' (make down)", ErrRunning, describeLive(live))
	}
	if cfg.LockWait > 0 && MachineLockHeld() {
		log.Info("another local cluster runs on this machine; waiting for it to stop", "max_wait", cfg.LockWait)
	}
	release, err := acquireMachineLock(ctx, cfg.LockWait)
	if err != nil {
		return err
	}
	defer release() // after the teardown below
	// Leftovers of a crashed run: the same sweep as down.
	if err := cfg.sweep(log); err != nil {
		return fmt.Errorf("clean up a previous run: %w", err)
	}
	// Logs outlive a run for post-mortems; a new run starts them afresh.
	if err := os.RemoveAll(filepath.Join(cfg.State.Dir, "logs")); err != nil {
		return fmt.Errorf("old logs: %w", err)
	}
	if err := os.MkdirAll(cfg.State.PodLogDir(), 0o755); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if err := writePidFile(cfg.State.PidPath(UpPidName), os.Getpid()); err != nil {
		return err
	}
	c := &cluster{cfg: cfg, log: log, died: make(chan *Proc, 64), retiredProcs: map[*Proc]bool{}, outages: map[string]*time.Timer{}}
	defer func() {
		log.Info("tearing down")
		if terr := c.teardown(); terr != nil {
			err = errors.Join(err, fmt.Errorf("teardown: %w", terr))
		} else {
			log.Info("torn down")
		}
	}()
	if err := c.start(ctx); err != nil {
		return err
	}
	ready, err := c.waitReady(ctx)
	if err != nil {
		return err
	}
	envPath := cfg.State.EnvPath()
	if rel, err := filepath.Rel(cfg.RepoDir, envPath); err == nil && !strings.HasPrefix(rel, "..") {
		envPath = rel
	}
	if err := writeFileAtomic(cfg.State.EnvPath(), []byte(FormatEnv(ready)), 0o644); err != nil {
		return fmt.Errorf("write env: %w", err)
	}
	try := "kubectl get nodes,pods -A"
	if cfg.Function != "" {
		try = fmt.Sprintf("curl -H 'x-skipper-function: %s' $ROUTER_URL/hello", cfg.Function)
	}
	fmt.Fprintf(cfg.Stdout, "skipper: ready in %.1fs — source %s && %s\n", time.Since(begin).Seconds(), envPath, try)
	return c.supervise(ctx)
}

// preflight checks what Up needs before it changes anything.
func (c *Config) preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("skipper-cluster up needs root (network namespaces, bridges, mounts, cgroups)")
	}
	var errs []error
	for _, name := range kubeComponents {
		if _, err := os.Stat(c.kube(name)); err != nil {
			errs = append(errs, fmt.Errorf("%s missing: run 'make kube' (builds bin/kube and its symlinks)", c.kube(name)))
		}
	}
	for _, f := range []struct{ path, fix string }{
		{filepath.Join(c.BinDir, "skipper-cluster"), "run 'make build'"},
		{filepath.Join(c.BinDir, "containerd"), "run 'make containerd'"},
		{filepath.Join(c.BinDir, "containerd-shim-runc-v2"), "run 'make containerd'"},
		{filepath.Join(c.BinDir, "skipper-image"), "run 'make image'"},
		{filepath.Join(c.BinDir, "image", "index.json"), "run 'make image'"},
		{runcPath, "run 'make deps' (Debian's runc)"},
		{filepath.Join(cniBinDir, "bridge"), "run 'make deps' (Debian's containernetworking-plugins)"},
		{filepath.Join(cniBinDir, "host-local"), "run 'make deps' (Debian's containernetworking-plugins)"},
		{filepath.Join(cniBinDir, "loopback"), "run 'make deps' (Debian's containernetworking-plugins)"},
		{filepath.Join(cniBinDir, "portmap"), "run 'make deps' (Debian's containernetworking-plugins)"},
	} {
		if _, err := os.Stat(f.path); err != nil {
			errs = append(errs, fmt.Errorf("%s missing: %s", f.path, f.fix))
		}
	}
	for _, dir := range c.Apply {
		if !hasKustomization(dir) {
			errs = append(errs, fmt.Errorf("manifests %s missing (no kustomization.yaml in it): nothing to apply (pass --apply to choose others)", dir))
		}
	}
	return errors.Join(errs...)
}

func hasKustomization(dir string) bool {
	for _, name := range []string{"kustomization.yaml", "kustomization.yml", "Kustomization"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return true
		}
	}
	return false
}

func describeLive(live map[string]int) string {
	var parts []string
	for name, pid := range live {
		parts = append(parts, fmt.Sprintf("%s pid %d", name, pid))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

func (c *cluster) start(ctx context.Context) error {
	cfg, log := c.cfg, c.log
	pki := PKI{Dir: cfg.State.PKI(), Server: cfg.apiserverURL()}
	if err := pki.Generate(cfg.Topology, cfg.Nodes, time.Now()); err != nil {
		return err
	}
	admin, err := os.ReadFile(pki.Kubeconfig("admin"))
	if err != nil {
		return err
	}
	if err := writeFileAtomic(cfg.State.Kubeconfig(), admin, 0o600); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	log.Info("pki written", "dir", pki.Dir)

	if err := cfg.Topology.SetupNetwork(cfg.Nodes); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	log.Info("network up", "bridge", cfg.Topology.Bridge, "gateway", cfg.Topology.Gateway, "nodes", cfg.Nodes)

	if c.cg, err = FindCgroups(cfg.CgroupName); err != nil {
		return err
	}
	if err := c.cg.Ensure(cfg.Nodes); err != nil {
		return err
	}

	etcdReady := func(ctx context.Context, p *Proc) error {
		return waitHTTP(ctx, &http.Client{Timeout: 3 * time.Second}, etcdClientURL+"/health", p, cfg.StartTimeout)
	}
	etcd, err := c.spawnRestartable(c.cg.Place(cfg.etcdSpec(), c.cg.ControlPlaneRel()), etcdReady)
	if err != nil {
		return err
	}
	if err := etcdReady(ctx, etcd); err != nil {
		return err
	}
	log.Info("etcd ready")

	hc, err := adminHTTPClient(pki)
	if err != nil {
		return err
	}
	apiReady := func(ctx context.Context, p *Proc) error {
		return waitHTTP(ctx, hc, cfg.apiserverURL()+"/readyz", p, cfg.StartTimeout)
	}
	api, err := c.spawnRestartable(c.cg.Place(cfg.apiserverSpec(), c.cg.ControlPlaneRel()), apiReady)
	if err != nil {
		return err
	}
	if err := apiReady(ctx, api); err != nil {
		return err
	}
	log.Info("kube-apiserver ready", "url", cfg.apiserverURL())

	lc := loopbackHealthClient()
	healthz := func(port int) readyFunc {
		return func(ctx context.Context, p *Proc) error {
			return waitHTTP(ctx, lc, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), p, cfg.StartTimeout)
		}
	}
	kcmReady, schedReady := healthz(kcmPort), healthz(schedulerPort)
	kcm, err := c.spawnRestartable(c.cg.Place(cfg.kcmSpec(), c.cg.ControlPlaneRel()), kcmReady)
	if err != nil {
		return err
	}
	sched, err := c.spawnRestartable(c.cg.Place(cfg.schedulerSpec(), c.cg.ControlPlaneRel()), schedReady)
	if err != nil {
		return err
	}
	if err := kcmReady(ctx, kcm); err != nil {
		return err
	}
	if err := schedReady(ctx, sched); err != nil {
		return err
	}
	log.Info("kube-controller-manager and kube-scheduler ready")

	if err := c.startRegistry(ctx); err != nil {
		return err
	}
	changed, err := raiseInotify()
	if err != nil {
		return err
	}
	if len(changed) > 0 {
		log.Info("raised the machine's inotify limits for the nodes", "changed", strings.Join(changed, ", "))
	}
	for n := 1; n <= cfg.Nodes; n++ {
		spec, err := cfg.writeNode(n, c.cg)
		if err != nil {
			return err
		}
		if _, err := c.spawn(spec); err != nil {
			return err
		}
		if cfg.ProxyMode != ProxyNone {
			p, err := c.spawn(cfg.kubeProxySpec(n, c.cg))
			if err != nil {
				return err
			}
			c.proxies = append(c.proxies, p)
		}
	}
	return nil
}

// startRegistry serves make image's images (bin/image) from a registry on
// the bridge's address, where every node's containerd pulls them, and
// waits until the last of them is there.
func (c *cluster) startRegistry(ctx context.Context) error {
	cfg := c.cfg
	spec := ProcSpec{Name: "skipper-registry", Path: filepath.Join(cfg.BinDir, "skipper-image"), Args: []string{
		"serve", "--addr=" + cfg.Registry(), "--layout=" + filepath.Join(cfg.BinDir, "image"),
	}}
	digest, err := LayoutDigest(cfg.BinDir)
	if err != nil {
		return err
	}
	p, err := c.spawn(c.cg.Place(spec, c.cg.ControlPlaneRel()))
	if err != nil {
		return err
	}
	c.layoutDigest = digest
	// The last image the registry pushes into itself (make image's order).
	url := "http://" + cfg.Registry() + "/v2/skipper-dev/testpod/manifests/dev"
	if err := waitHTTP(ctx, &http.Client{Timeout: 3 * time.Second}, url, p, cfg.StartTimeout); err != nil {
		return err
	}
	c.log.Info("registry ready", "addr", cfg.Registry())
	return nil
}

// writeNode writes node n's configuration files and NodeSpec and returns
// how to start its node process: bin/skipper-cluster node, in the node's
// network namespace and system cgroup, in a mount namespace of its own.
func (c *Config) writeNode(n int, cg Cgroups) (ProcSpec, error) {
	spec, files := c.nodeSpec(n, cg)
	p := cg.Place(ProcSpec{
		Name: nodeProcPrefix + NodeName(n), Path: filepath.Join(c.BinDir, "skipper-cluster"),
		Netns: c.Topology.Netns(n), NewMountNS: true,
	}, cg.SystemRel(n))
	spec.V1Cgroups = p.V1Cgroups
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return ProcSpec{}, err
	}
	specPath := filepath.Join(c.State.nodeDir(n), "node.json")
	files[specPath] = string(data) + "\n"
	for path, content := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return ProcSpec{}, fmt.Errorf("node %d: %w", n, err)
		}
		if err := writeFileAtomic(path, []byte(content), 0o644); err != nil {
			return ProcSpec{}, fmt.Errorf("node %d: %w", n, err)
		}
	}
	if err := os.MkdirAll(filepath.Join(c.State.PodLogDir(), NodeName(n)), 0o755); err != nil {
		return ProcSpec{}, fmt.Errorf("node %d: %w", n, err)
	}
	p.Args = []string{"node", "--spec", specPath}
	return p, nil
}

func (c *cluster) spawn(spec ProcSpec) (*Proc, error) {
	if spec.Env == nil {
		spec.Env = childEnv()
	}
	p, err := c.cfg.State.startProc(spec)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	c.log.Info("started", "name", p.Name, "pid", p.Pid, "log", p.LogPath)
	return p, nil
}

// childEnv is this process's environment without variables that would point
// the children at another cluster.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "KUBECONFIG=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// supervise blocks until ctx ends (nil) or a child dies (an error); a
// component Control stopped is not a death. It serves the control socket
// meanwhile.
func (c *cluster) supervise(ctx context.Context) error {
	c.mu.Lock()
	for _, p := range c.procs {
		c.watch(ctx, p)
	}
	c.mu.Unlock()
	stopControl, err := c.serveControl(ctx)
	if err != nil {
		return err
	}
	defer stopControl()
	for {
		select {
		case <-ctx.Done():
			c.log.Info("stopping on signal")
			return nil
		case p := <-c.died:
			if c.stoppedOnRequest(p) {
				continue
			}
			return fmt.Errorf("%s exited unexpectedly (%v); last lines of %s:\n%s", p.Name, p.Err(), p.LogPath, tailFile(p.LogPath, 25))
		}
	}
}

// teardown stops the children (nodes first, etcd last) and sweeps.
func (c *cluster) teardown() error {
	// The nodes first and all at once (each node process stops its
	// kubelet, kills what is left in its pod cgroups, then containerd and
	// the shims), then the control plane in reverse start order.
	c.closeControl()
	c.mu.Lock()
	procs := slices.Clone(c.procs)
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		if stopRank(p.Name) == 0 {
			wg.Go(func() { p.stop(c.cfg.stopGrace(p.Name)) })
		}
	}
	wg.Wait()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop(c.cfg.StopTimeout) // a no-op for the stopped
	}
	return c.cfg.sweep(c.log)
}
