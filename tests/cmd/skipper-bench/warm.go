package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

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

// cleanups runs what it was given in reverse order, once.
type cleanups struct{ fs []func() }

func (c *cleanups) add(f func()) { c.fs = append(c.fs, f) }

func (c *cleanups) run() {
	for i := len(c.fs) - 1; i >= 0; i-- {
		c.fs[i]()
	}
	c.fs = nil
}
