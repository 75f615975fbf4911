package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/tests/cluster"
	"skipper.dev/skipper/tests/linuxhost"
)

// warmNode is the node whose router is measured and where the reverse
// proxies run; warmFunction is the Function the bench makes for the run.
const (
	warmNode     = 1
	warmFunction = "skipper-bench-warm"
)

// warmProxies are the reverse proxies run beside the router, by contender
// name, each with the port it listens on at node 1's IP.
var warmProxies = map[string]struct {
	kind proxyKind
	port int
}{
	"nginx":    {nginxKind, 18081},
	"haproxy":  {haproxyKind, 18082},
	"fasthttp": {fasthttpKind, 18083},
	"loop":     {loopKind, 18084},
}

// fastproxyBuild says how to build the fasthttp contender's binary.
const fastproxyBuild = "make bench builds it; or: cd tests/fastproxy && CGO_ENABLED=0 go build -o ../../bin/ ."

// loopproxyBuild says how to build the event-loop contender's binary.
const loopproxyBuild = "make bench builds it; or: CGO_ENABLED=0 go build -o bin/ ./tests/loopproxy"

// warmContenders are the known contenders, in the default order.
var warmContenders = []struct{ name, label string }{
	{"direct", "direct to the instance (pod IP)"},
	{"router", "router (node 1 IP:8380)"},
	{"nginx", "nginx (node 1)"},
	{"haproxy", "haproxy (node 1)"},
	{"fasthttp", "fasthttp proxy (node 1)"},
	{"loop", "Go event-loop proxy (node 1, tests/loopproxy)"},
	{"vip", "router via the Service VIP, BPF-steered (caller on node 1)"},
	{"kube-proxy", "router via the Service VIP, kube-proxy (caller on node 1)"},
	{"router-pod", "router (node 1 IP:8380), from a pod on node 2"},
	{"router-callers", "router, the same pod calling a Function with spec.callers"},
}

// warmConfig is skipper-bench warm's flags.
type warmConfig struct {
	Rounds      int
	Duration    time.Duration
	Threads     int
	Connections int
	Rate        int
	Contenders  []string
	EnvFile     string
	Docs        string
	Out         string
	Pool        string
	Namespace   string
	Fastproxy   string
	Allocs      string // go test -bench -benchmem output to report; "" none
	VIPN        int    // requests per path and round of the per-connection VIP figures; 0 none
	VIPRounds   int
}

func parseWarmFlags(args []string, stderr io.Writer) (warmConfig, error) {
	var c warmConfig
	names := make([]string, len(warmContenders))
	for i, k := range warmContenders {
		names[i] = k.name
	}
	fs := flag.NewFlagSet("warm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: skipper-bench warm [flags]

Measures warm requests on the local cluster (make up first), with the
contenders interleaved in every round: a closed loop (wrk) and an open loop
at a fixed rate against each, and the CPU the proxy's processes spend per
request. Needs wrk, nginx and haproxy (.ci/install-bench), fastproxy
(tests/fastproxy, built by make bench into bin/) and root.

Contenders:
  direct      the function's instance, by pod IP (no proxy)
  router      node 1's router at ROUTER_URL
  nginx       nginx in node 1's network namespace, proxying to the instance
  haproxy     haproxy likewise
  fasthttp    fastproxy likewise: a minimal reverse proxy on fasthttp (tests/fastproxy)
  loop        loopproxy likewise: a minimal Go proxy built as nginx is, an epoll loop per
              thread and no goroutine per connection (tests/loopproxy; GET only)
  vip         the skipper Service VIP from node 1's namespace and cgroup (BPF steers it to the router)
  kube-proxy  the skipper Service VIP from node 1's namespace outside its cgroup (kube-proxy)

Flags:
`)
		fs.PrintDefaults()
	}
	fs.IntVar(&c.Rounds, "rounds", 5, "rounds; each runs every contender once, closed loop then open loop")
	fs.DurationVar(&c.Duration, "duration", 5*time.Second, "length of each closed-loop and each open-loop run (whole seconds)")
	fs.IntVar(&c.Threads, "threads", 2, "wrk threads")
	fs.IntVar(&c.Connections, "connections", 64, "wrk connections (closed loop); idle connections kept by the open loop")
	fs.IntVar(&c.Rate, "rate", 1000, "open-loop requests per second")
	contenders := fs.String("contenders", strings.Join(names, ","), "comma-separated contenders, in the order each round runs them")
	fs.StringVar(&c.EnvFile, "env", ".skipper/env", "the local cluster's env file")
	fs.StringVar(&c.Docs, "docs", "docs/benchmarks.md", "the file whose "+warmStart+" section is rewritten; empty: only print")
	fs.StringVar(&c.Out, "out", "docs/bench", "directory for warm.json and the plots (skipper-benchplot); empty: none (the default when -docs is empty)")
	fs.StringVar(&c.Pool, "pool", "echo", "pool of the Function "+warmFunction+" the bench makes (one instance)")
	fs.StringVar(&c.Namespace, "namespace", "default", "namespace of the pool and the Function")
	fs.StringVar(&c.Fastproxy, "fastproxy", "", "the fasthttp contender's binary (tests/fastproxy); empty: fastproxy next to this binary, else on PATH")
	fs.StringVar(&c.Allocs, "allocs", "", "a file of `go test -bench -benchmem` output (make bench: the router's BenchmarkProxyWarmServed) whose allocs/op the report shows; empty: none")
	fs.IntVar(&c.VIPN, "vip-n", 1000, "after the rounds, requests per path and round on a new connection each from node 2 (the VIP steered by BPF, by kube-proxy, the router direct: skipper-bench vip); 0: skip")
	fs.IntVar(&c.VIPRounds, "vip-rounds", 5, "rounds of the per-connection VIP figures, the paths interleaved in each")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	outSet := false
	fs.Visit(func(f *flag.Flag) { outSet = outSet || f.Name == "out" })
	if c.Docs == "" && !outSet {
		c.Out = "" // -docs "": only print
	}
	for n := range strings.SplitSeq(*contenders, ",") {
		if n = strings.TrimSpace(n); n != "" {
			c.Contenders = append(c.Contenders, n)
		}
	}
	return c, c.validate(names)
}

// validate checks the flags, all problems at once.
func (c warmConfig) validate(known []string) error {
	var errs []error
	if c.Rounds < 1 {
		errs = append(errs, fmt.Errorf("-rounds %d: want at least 1", c.Rounds))
	}
	if c.Duration < time.Second || c.Duration%time.Second != 0 {
		errs = append(errs, fmt.Errorf("-duration %s: want whole seconds, at least 1s (wrk counts in seconds)", c.Duration))
	}
	if c.Threads < 1 || c.Connections < c.Threads {
		errs = append(errs, fmt.Errorf("-threads %d, -connections %d: want 1 ≤ threads ≤ connections", c.Threads, c.Connections))
	}
	if c.Rate < 1 || c.Rate > 1_000_000 {
		errs = append(errs, fmt.Errorf("-rate %d: want 1..1000000", c.Rate))
	}
	if c.VIPN < 0 || (c.VIPN > 0 && c.VIPRounds < 1) {
		errs = append(errs, fmt.Errorf("-vip-n %d, -vip-rounds %d: want n ≥ 0 and rounds ≥ 1", c.VIPN, c.VIPRounds))
	}
	if len(c.Contenders) == 0 {
		errs = append(errs, errors.New("-contenders: none given"))
	}
	if slices.Contains(c.Contenders, "router-pod") != slices.Contains(c.Contenders, "router-callers") {
		errs = append(errs, fmt.Errorf("-contenders: %w", errNoCallerPair))
	}
	seen := map[string]bool{}
	for _, n := range c.Contenders {
		if !slices.Contains(known, n) {
			errs = append(errs, fmt.Errorf("-contenders: unknown %q (known: %s)", n, strings.Join(known, ", ")))
		}
		if seen[n] {
			errs = append(errs, fmt.Errorf("-contenders: %q twice", n))
		}
		seen[n] = true
	}
	return errors.Join(errs...)
}

// contender is one way to the instance, placed and wired.
type contender struct {
	name, label string
	url         string
	function    string    // x-skipper-function header; "" none
	client      placement // where wrk and the open-loop generator run
	cpuDir      string    // cgroup2 dir of the proxy's processes; "" none
	// before and after, when set, run around each of the contender's
	// runs, unmeasured.
	before, after func(context.Context) error
}

// runWarm is skipper-bench warm: see the usage text in parseWarmFlags.
func runWarm(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseWarmFlags(args, stderr)
	if err != nil {
		return err
	}
	var allocs []allocRow
	if cfg.Allocs != "" {
		if allocs, err = readAllocs(cfg.Allocs); err != nil {
			return err // before the cluster is touched
		}
	}
	var fastproxy string
	if slices.Contains(cfg.Contenders, "fasthttp") {
		if fastproxy, err = findFastproxy(cfg.Fastproxy); err != nil {
			return err
		}
	}
	bins, err := ensureBenchBins(ctx, cfg.Contenders, stderr)
	if err != nil {
		return err
	}
	if fastproxy != "" {
		bins["fasthttp"] = fastproxy
	}
	if slices.Contains(cfg.Contenders, "loop") {
		if bins["loop"], err = findBuilt(loopKind.binName(), selfDir(), loopproxyBuild); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	env, kcfg, cs, err := attach(cfg.EnvFile, "ROUTER_URL", "ROUTER_METRICS_URL")
	if err != nil {
		return err
	}
	cleanup := &cleanups{}
	defer cleanup.run()

	// The function: one instance, so every contender reaches the same
	// process (echo itself would scale up under the router's load alone).
	dyn, err := dynamic.NewForConfig(kcfg)
	if err != nil {
		return err
	}
	fnName := cfg.Namespace + "/" + warmFunction
	if err := ensureWarmFunction(ctx, dyn, cfg); err != nil {
		return err
	}
	cleanup.add(func() {
		_ = dyn.Resource(v1alpha1.Resource).Namespace(cfg.Namespace).Delete(context.Background(), warmFunction, metav1.DeleteOptions{})
	})
	if err := waitCallable(ctx, env["ROUTER_URL"]+"/", fnName, 60*time.Second); err != nil {
		return err
	}
	var callerNetns string
	if slices.Contains(cfg.Contenders, "router-callers") {
		if callerNetns, err = startCallerPod(ctx, cs, cfg.Namespace, cluster.ImageFromEnv(env), cleanup); err != nil {
			return err
		}
		if err := waitCallableIn(ctx, callerNetns, env["ROUTER_URL"]+"/", fnName, 60*time.Second); err != nil {
			return err
		}
	}
	inst, instNode, err := warmInstance(ctx, cs, cfg.Namespace)
	if err != nil {
		return err
	}
	router, err := nodeRouterPod(ctx, cs, warmNode)
	if err != nil {
		return err
	}
	workers := routerGOMAXPROCS(ctx, env["ROUTER_METRICS_URL"])

	// Cgroups: the proxies beside the router pod, with its weight; the
	// callers in a group of their own beside the nodes (a caller machine).
	hs, err := linuxhost.Hierarchies()
	if err != nil {
		return err
	}
	cgName := cluster.DefaultCgroupName
	routerRel := path.Join("/", cgName, cluster.NodeName(warmNode), cluster.PodCgroup(router.Status.QOSClass, router.UID))
	mkcg := func(rel, like string) ([]string, error) {
		dirs, err := makeCgroup(hs, rel, like)
		if err != nil {
			return nil, err
		}
		cleanup.add(func() {
			for _, d := range dirs {
				_ = linuxhost.RemoveTree(d, 5*time.Second)
			}
		})
		return dirs, nil
	}
	callerDirs, err := mkcg(path.Join("/", cgName, "skipper-bench-caller"), "")
	if err != nil {
		return err
	}
	topo := cluster.DefaultTopology()
	nodeIP := topo.NodeIP(warmNode).String()
	netns := topo.Netns(warmNode)

	var contenders []contender
	for _, name := range cfg.Contenders {
		c := contender{name: name, client: placement{cgroups: callerDirs}}
		for _, k := range warmContenders {
			if k.name == name {
				c.label = k.label
			}
		}
		switch name {
		case "direct":
			c.url = "http://" + inst + "/bench"
		case "router":
			c.url, c.function = env["ROUTER_URL"]+"/bench", fnName
			c.cpuDir = linuxhost.Dirs(hs[:1], routerRel)[0]
		case "router-pod", "router-callers":
			c.url, c.function = env["ROUTER_URL"]+"/bench", fnName
			c.cpuDir = linuxhost.Dirs(hs[:1], routerRel)[0]
			c.client.netns = callerNetns
			if name == "router-callers" {
				// Every other contender calls with no callers set.
				c.before = func(ctx context.Context) error {
					return setCallers(ctx, dyn, cfg, env["ROUTER_URL"], callerNetns, true)
				}
				c.after = func(ctx context.Context) error {
					return setCallers(ctx, dyn, cfg, env["ROUTER_URL"], callerNetns, false)
				}
			}
		case "nginx", "haproxy", "fasthttp", "loop":
			kind, port := warmProxies[name].kind, warmProxies[name].port
			dirs, err := mkcg(path.Join(path.Dir(routerRel), "skipper-bench-"+name), routerRel)
			if err != nil {
				return err
			}
			listen := net.JoinHostPort(nodeIP, strconv.Itoa(port))
			scratch, err := os.MkdirTemp("", "skipper-bench-"+name+"-")
			if err != nil {
				return err
			}
			cleanup.add(func() { _ = os.RemoveAll(scratch) })
			var log strings.Builder // shown only when it fails: haproxy notes its start
			pp, err := startProxy(kind, bins[name], proxyConfig{Dir: scratch, Listen: listen, Upstream: inst, Workers: workers},
				placement{netns: netns, cgroups: dirs}, &syncWriter{w: &log})
			if err != nil {
				return err
			}
			cleanup.add(func() { pp.stop(5 * time.Second) })
			c.url, c.cpuDir = "http://"+listen+"/bench", dirs[0]
			if err := pp.waitReady(ctx, c.url, 10*time.Second); err != nil {
				return fmt.Errorf("%w\n%s", err, log.String())
			}
		case "vip", "kube-proxy":
			svc, err := cs.CoreV1().Services("skipper-system").Get(ctx, "skipper", metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("the skipper Service: %w", err)
			}
			c.url, c.function = "http://"+net.JoinHostPort(svc.Spec.ClusterIP, "80")+"/bench", fnName
			c.cpuDir = linuxhost.Dirs(hs[:1], routerRel)[0]
			c.client.netns = netns
			if name == "vip" {
				// BPF steers connects made in the node's cgroup2 subtree;
				// the v1 groups (CPU weight) stay the other callers'.
				d, err := mkcg(path.Join("/", cgName, cluster.NodeName(warmNode), "skipper-bench-caller"), "")
				if err != nil {
					return err
				}
				c.client.cgroups = append([]string{d[0]}, callerDirs[1:]...)
			}
		}
		contenders = append(contenders, c)
	}

	// Warm up every contender (connections, the instance's and proxies'
	// code paths) and check it answers before anything is recorded.
	for _, c := range contenders {
		r, err := around(ctx, c, func() (wrkResult, error) { return runWrk(ctx, bins["wrk"], c, cfg, time.Second) })
		if err != nil {
			return fmt.Errorf("%s: warm-up: %w", c.name, err)
		}
		if r.Requests == 0 || r.Errors > 0 {
			return fmt.Errorf("%s: warm-up at %s: %d requests, %d errors", c.name, c.url, r.Requests, r.Errors)
		}
	}

	fmt.Fprintf(stderr, "warm: %d rounds × %d contenders (%s), %s closed + %s open each\n",
		cfg.Rounds, len(contenders), strings.Join(cfg.Contenders, ", "), cfg.Duration, cfg.Duration)
	results, done, runErr := runRounds(ctx, contenders, cfg, bins["wrk"], self, stderr)
	if done == 0 {
		return runErr
	}

	var vip []vipRow
	var vipErr error
	if runErr == nil && cfg.VIPN > 0 {
		fmt.Fprintf(stderr, "warm: per-connection VIP figures, %d rounds × %d requests per path\n", cfg.VIPRounds, cfg.VIPN)
		if vip, vipErr = vipRounds(ctx, cs, vipConfig{n: cfg.VIPN, node: 2, rounds: cfg.VIPRounds, function: fnName}, stderr); vipErr != nil {
			vipErr = fmt.Errorf("per-connection VIP figures: %w", vipErr)
		}
	}

	rep := warmReport{
		Date:        time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		Machine:     machine(),
		Commit:      commit(),
		Command:     shellCommand(append([]string{"skipper-bench", "warm"}, args...)),
		Rounds:      done,
		Duration:    cfg.Duration.String(),
		Threads:     cfg.Threads,
		Connections: cfg.Connections,
		Rate:        cfg.Rate,
		Workers:     workers,
		Function:    fnName,
		Instance:    fmt.Sprintf("%s on %s", inst, instNode),
		Allocs:      allocs,
		VIP:         vip,
		VIPN:        cfg.VIPN,
	}
	switch {
	case runErr != nil:
		rep.Stopped = fmt.Sprintf("after %d of %d rounds: %v", done, cfg.Rounds, runErr)
	case vipErr != nil:
		rep.Stopped = fmt.Sprintf("after every round, in the %v", vipErr)
		runErr = vipErr
	}
	for i, c := range contenders {
		rep.Contenders = append(rep.Contenders, summarizeContender(c.name, c.label, results[i]))
	}
	if i, j := slices.Index(cfg.Contenders, "router-pod"), slices.Index(cfg.Contenders, "router-callers"); i >= 0 && j >= 0 {
		cost := callersRatios(results[i], results[j])
		rep.Callers = &cost
	}
	// A run cut short still reports its whole rounds, and fails.
	return errors.Join(writeWarmReport(ctx, rep, cfg, stdout, stderr), runErr)
}

// runRounds runs every contender, closed loop then open loop, once per
// round. On an error it returns the rounds every contender completed.
func runRounds(ctx context.Context, contenders []contender, cfg warmConfig, wrk, self string, stderr io.Writer) ([][]roundResult, int, error) {
	results := make([][]roundResult, len(contenders))
	for round := 1; round <= cfg.Rounds; round++ {
		for i, c := range contenders {
			var rr roundResult
			var err error
			if c.before != nil {
				if err := c.before(ctx); err != nil {
					return trimRounds(results, round-1), round - 1, fmt.Errorf("round %d, %s, before: %w", round, c.name, err)
				}
			}
			cpu := cpuMeter(c.cpuDir)
			if rr.closed, rr.closedCPU, err = measure(cpu, func() (wrkResult, error) { return runWrk(ctx, wrk, c, cfg, cfg.Duration) }); err != nil {
				return trimRounds(results, round-1), round - 1, fmt.Errorf("round %d, %s, closed loop: %w", round, c.name, err)
			}
			if rr.open, rr.openCPU, err = measure(cpu, func() (openResult, error) { return runOpen(ctx, self, c, cfg) }); err != nil {
				return trimRounds(results, round-1), round - 1, fmt.Errorf("round %d, %s, open loop: %w", round, c.name, err)
			}
			if c.after != nil {
				if err := c.after(ctx); err != nil {
					return trimRounds(results, round-1), round - 1, fmt.Errorf("round %d, %s, after: %w", round, c.name, err)
				}
			}
			results[i] = append(results[i], rr)
			fmt.Fprintf(stderr, "  round %d %-10s closed %7.0f req/s p99 %-9s cpu %s errors %d | open p99 %-9s cpu %s errors %d\n", round, c.name,
				rr.closed.RPS, rr.closed.P99, cpuPerReq(rr.closedCPU, rr.closed.Requests), rr.closed.Errors,
				quantile(sortedCopy(rr.open.Lat), 0.99).Round(time.Microsecond), cpuPerReq(rr.openCPU, int64(rr.open.Total)), rr.open.Errors)
		}
	}
	return results, cfg.Rounds, nil
}

// around runs f between c's before and after hooks.
func around[T any](ctx context.Context, c contender, f func() (T, error)) (T, error) {
	var zero T
	if c.before != nil {
		if err := c.before(ctx); err != nil {
			return zero, err
		}
	}
	v, err := f()
	if c.after != nil {
		if aerr := c.after(ctx); aerr != nil && err == nil {
			return zero, aerr
		}
	}
	return v, err
}

// cpuPerReq renders CPU per request for the progress lines.
func cpuPerReq(cpu time.Duration, n int64) string {
	if cpu < 0 || n == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1fµs/req", float64(cpu)/float64(time.Microsecond)/float64(n))
}

// trimRounds keeps the first n rounds of every contender.
func trimRounds(results [][]roundResult, n int) [][]roundResult {
	for i := range results {
		results[i] = results[i][:min(n, len(results[i]))]
	}
	return results
}

// writeWarmReport writes warm.json and the plots into cfg.Out, prints the
// section and rewrites it in cfg.Docs.
func writeWarmReport(ctx context.Context, rep warmReport, cfg warmConfig, stdout, stderr io.Writer) error {
	var images []string
	if cfg.Out != "" {
		if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
			return err
		}
		data, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		js := filepath.Join(cfg.Out, "warm.json")
		if err := os.WriteFile(js, append(data, '\n'), 0o644); err != nil {
			return err
		}
		pngs, err := plotWarm(ctx, js, cfg.Out, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "warm: no plots: %v\n", err)
		}
		base := "."
		if cfg.Docs != "" {
			base = filepath.Dir(cfg.Docs)
		}
		for _, p := range pngs {
			if rel, err := filepath.Rel(base, p); err == nil {
				images = append(images, filepath.ToSlash(rel))
			}
		}
	}
	section := rep.markdown(images)
	fmt.Fprint(stdout, section)
	if cfg.Docs == "" {
		return nil
	}
	doc, err := os.ReadFile(cfg.Docs)
	if err != nil {
		return err
	}
	return os.WriteFile(cfg.Docs, []byte(replaceSection(string(doc), section)), 0o644)
}

// plotWarm runs skipper-benchplot (tests/benchplot: next to this binary,
// or on PATH) on the JSON and returns the PNGs it wrote.
func plotWarm(ctx context.Context, js, out string, stderr io.Writer) ([]string, error) {
	bin, err := findBuilt("skipper-benchplot", selfDir(), "cd tests/benchplot && go build -o ../../bin/ ./cmd/skipper-benchplot")
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, "-in", js, "-out", out)
	cmd.Stderr = stderr
	list, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	return strings.Fields(string(list)), nil
}

// findFastproxy is the fasthttp contender's binary: flagPath when given,
// else fastproxy next to this binary or on PATH.
func findFastproxy(flagPath string) (string, error) {
	if flagPath == "" {
		return findBuilt(fasthttpKind.binName(), selfDir(), fastproxyBuild)
	}
	if !isExecutable(flagPath) {
		return "", fmt.Errorf("-fastproxy %s: not an executable file (%s)", flagPath, fastproxyBuild)
	}
	return flagPath, nil
}

// findBuilt finds name, a binary this repository builds outside the main
// module (make bench puts it in bin/, beside skipper-bench): in dir first,
// then on PATH. Its error says how to build it (build).
func findBuilt(name, dir, build string) (string, error) {
	if p := filepath.Join(dir, name); dir != "" && isExecutable(p) {
		return p, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	where := "on PATH"
	if dir != "" {
		where = "in " + dir + " or on PATH"
	}
	return "", fmt.Errorf("%s not found %s (%s)", name, where, build)
}

// selfDir is the directory of this executable; "" when unknown.
func selfDir() string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Dir(self)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// cpuMeter returns a reading of the CPU used so far by the processes in
// the cgroup dir; nil for "".
func cpuMeter(dir string) func() (time.Duration, error) {
	if dir == "" {
		return nil
	}
	return func() (time.Duration, error) { return cgroupCPU(dir) }
}

// measure runs f and returns its result with the CPU cpu counted during
// it; -1 when cpu is nil.
func measure[T any](cpu func() (time.Duration, error), f func() (T, error)) (T, time.Duration, error) {
	var zero T
	if cpu == nil {
		r, err := f()
		return r, -1, err
	}
	before, err := cpu()
	if err != nil {
		return zero, 0, err
	}
	r, err := f()
	if err != nil {
		return zero, 0, err
	}
	after, err := cpu()
	if err != nil {
		return zero, 0, err
	}
	return r, after - before, nil
}

// runWrk runs wrk against c for d from c's caller placement.
func runWrk(ctx context.Context, bin string, c contender, cfg warmConfig, d time.Duration) (wrkResult, error) {
	args := []string{"-t", strconv.Itoa(cfg.Threads), "-c", strconv.Itoa(cfg.Connections),
		"-d", fmt.Sprintf("%ds", int(d/time.Second)), "--latency", "--timeout", "5s"}
	if c.function != "" {
		args = append(args, "-H", "x-skipper-function: "+c.function)
	}
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	cmd := c.client.command(ctx, bin, append(args, c.url)...)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return wrkResult{}, fmt.Errorf("wrk: %w: %s", err, strings.TrimSpace(errb.String()))
	}
	return parseWrk(string(out))
}

// runOpen runs the open-loop generator (this binary's warm-open) against c
// from c's caller placement.
func runOpen(ctx context.Context, self string, c contender, cfg warmConfig) (openResult, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration+openWarmup+30*time.Second)
	defer cancel()
	cmd := c.client.command(ctx, self, "warm-open", "-url", c.url, "-rate", strconv.Itoa(cfg.Rate),
		"-duration", cfg.Duration.String(), "-connections", strconv.Itoa(cfg.Connections), "-function", c.function)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return openResult{}, fmt.Errorf("warm-open: %w: %s", err, strings.TrimSpace(errb.String()))
	}
	var r openResult
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("warm-open output: %w", err)
	}
	return r, nil
}

// ensureWarmFunction creates the bench's Function (one instance, never
// scaled to zero), or keeps one an interrupted run left.
func ensureWarmFunction(ctx context.Context, dyn dynamic.Interface, cfg warmConfig) error {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": "Function",
		"metadata": map[string]any{"name": warmFunction, "namespace": cfg.Namespace},
		"spec":     map[string]any{"pool": cfg.Pool, "minInstances": int64(1), "maxInstances": int64(1)},
	}}
	_, err := dyn.Resource(v1alpha1.Resource).Namespace(cfg.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Function %s/%s: %w", cfg.Namespace, warmFunction, err)
	}
	return nil
}

// waitCallable calls function through the router until it answers 200.
func waitCallable(ctx context.Context, url, function string, timeout time.Duration) error {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	for {
		err := get(ctx, c, url, function)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s through %s: not answering 200 within %s: %w", function, url, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// warmInstance returns the bench Function's ready instance as pod IP:port
// (the pod's first container port, which a Function's port defaults to)
// and its node.
func warmInstance(ctx context.Context, cs kubernetes.Interface, ns string) (string, string, error) {
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelFunction + "=" + warmFunction})
	if err != nil {
		return "", "", err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || !ready(p) || p.Status.PodIP == "" ||
			len(p.Spec.Containers) == 0 || len(p.Spec.Containers[0].Ports) == 0 {
			continue
		}
		port := strconv.Itoa(int(p.Spec.Containers[0].Ports[0].ContainerPort))
		return net.JoinHostPort(p.Status.PodIP, port), p.Spec.NodeName, nil
	}
	return "", "", fmt.Errorf("no ready instance of %s/%s with a pod IP and a container port", ns, warmFunction)
}

// nodeRouterPod is the router pod running on node n.
func nodeRouterPod(ctx context.Context, cs kubernetes.Interface, n int) (*corev1.Pod, error) {
	pods, err := cs.CoreV1().Pods("skipper-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=skipper-noderouter",
		FieldSelector: "spec.nodeName=" + cluster.NodeName(n),
	})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil && ready(*p) {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no ready router pod on %s", cluster.NodeName(n))
}

// routerGOMAXPROCS reads go_sched_gomaxprocs_threads from the router's
// metrics; this machine's CPU count when it cannot.
func routerGOMAXPROCS(ctx context.Context, metricsURL string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return runtime.NumCPU()
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}
	resp, err := c.Do(req)
	if err != nil {
		return runtime.NumCPU()
	}
	defer resp.Body.Close()
	if v, ok := gaugeValue(resp.Body, "go_sched_gomaxprocs_threads"); ok && v >= 1 {
		return int(v)
	}
	return runtime.NumCPU()
}

// gaugeValue finds an unlabelled sample of name in a Prometheus text page.
func gaugeValue(r io.Reader, name string) (float64, bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			return v, err == nil
		}
	}
	return 0, false
}

// benchBinDirs are searched after PATH: nginx and haproxy live in sbin
// directories a non-login root shell may lack.
var benchBinDirs = []string{"/usr/sbin", "/sbin", "/usr/local/sbin"}

// lookBin finds name on PATH or in benchBinDirs.
func lookBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range benchBinDirs {
		if p := filepath.Join(d, name); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

// ensureBenchBins finds the binaries the contenders need (wrk always, ip,
// nginx and haproxy when measured). When some are missing it runs
// .ci/install-bench as root, and otherwise says to.
func ensureBenchBins(ctx context.Context, contenders []string, stderr io.Writer) (map[string]string, error) {
	need := []string{"wrk", "ip"}
	for _, n := range []string{"nginx", "haproxy"} {
		if slices.Contains(contenders, n) {
			need = append(need, n)
		}
	}
	find := func() (map[string]string, []string) {
		found, missing := map[string]string{}, []string(nil)
		for _, n := range need {
			if p, err := lookBin(n); err == nil {
				found[n] = p
			} else {
				missing = append(missing, n)
			}
		}
		return found, missing
	}
	found, missing := find()
	if len(missing) == 0 {
		return found, nil
	}
	script := filepath.Join(".ci", "install-bench")
	if top, err := exec.Command("git", "--no-optional-locks", "rev-parse", "--show-toplevel").Output(); err == nil {
		script = filepath.Join(strings.TrimSpace(string(top)), script)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("missing %s: run `sudo bash %s` (Debian packages wrk, nginx, haproxy)", strings.Join(missing, ", "), script)
	}
	fmt.Fprintf(stderr, "warm: missing %s: running %s\n", strings.Join(missing, ", "), script)
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w", script, err)
	}
	if found, missing = find(); len(missing) > 0 {
		return nil, fmt.Errorf("still missing after %s: %s", script, strings.Join(missing, ", "))
	}
	return found, nil
}

// shellCommand renders argv for a shell, quoting the arguments that need it.
func shellCommand(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = a
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`|&;<>()*?[]#~") {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

// cleanups runs what it was given in reverse order, once.
type cleanups struct{ fs []func() }

func (c *cleanups) add(f func()) { c.fs = append(c.fs, f) }

func (c *cleanups) run() {
	for i := len(c.fs) - 1; i >= 0; i-- {
		c.fs[i]()
	}
	c.fs = nil
}
