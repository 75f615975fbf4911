package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

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
