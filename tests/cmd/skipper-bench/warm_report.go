package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// The markers of skipper-bench warm's section of docs/benchmarks.md.
const (
	warmStart = "<!-- bench:warm:start -->"
	warmEnd   = "<!-- bench:warm:end -->"
)

// warmReport is what a warm run found. It is also the JSON the plotter
// (tests/benchplot) reads: keep the field names in step with it.
type warmReport struct {
	Date        string             `json:"date"`
	Machine     string             `json:"machine"`
	Commit      string             `json:"commit"`
	Command     string             `json:"command"`
	Rounds      int                `json:"rounds"`
	Duration    string             `json:"duration"`
	Threads     int                `json:"threads"`
	Connections int                `json:"connections"`
	Rate        int                `json:"rate"`
	Workers     int                `json:"workers"`           // the router's GOMAXPROCS: nginx workers, haproxy threads, fastproxy's GOMAXPROCS
	Function    string             `json:"function"`          // the function the router calls
	Instance    string             `json:"instance"`          // its one instance: pod IP:port on node N
	Stopped     string             `json:"stopped,omitempty"` // why a run ended before its last round
	Contenders  []contenderSummary `json:"contenders"`
	Allocs      []allocRow         `json:"allocs,omitempty"` // the router's allocations per request (-allocs)
	VIP         []vipRow           `json:"vip,omitempty"`    // per new connection from node 2 (-vip-n)
	VIPN        int                `json:"vip_n,omitempty"`
	Callers     *callersCost       `json:"callers,omitempty"` // router-callers against router-pod
}

// contenderSummary is one contender's figures over the rounds. Latencies
// in milliseconds, CPU in microseconds per request; CPU has N 0 where the
// contender has no proxy process of its own (direct).
type contenderSummary struct {
	Name         string `json:"name"`
	Label        string `json:"label"`
	ClosedRPS    stat   `json:"closed_rps"`
	ClosedP50    stat   `json:"closed_p50_ms"`
	ClosedP99    stat   `json:"closed_p99_ms"`
	ClosedCPU    stat   `json:"closed_cpu_us_per_req"`
	ClosedErrors int64  `json:"closed_errors"`
	OpenP50      stat   `json:"open_p50_ms"`
	OpenP99      stat   `json:"open_p99_ms"`
	OpenP999     stat   `json:"open_p999_ms"`
	OpenRate     stat   `json:"open_rps"` // answered requests per second
	OpenCPU      stat   `json:"open_cpu_us_per_req"`
	OpenErrors   int64  `json:"open_errors"`
}

// roundResult is one contender's closed- and open-loop run in one round.
type roundResult struct {
	closed    wrkResult
	closedCPU time.Duration // -1: not measured
	open      openResult
	openCPU   time.Duration // over the whole run, warm-up included
}

// summarizeContender folds the rounds of one contender.
func summarizeContender(name, label string, rs []roundResult) contenderSummary {
	s := contenderSummary{Name: name, Label: label}
	var rps, c50, c99, ccpu, o50, o99, o999, orate, ocpu []float64
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	perReq := func(cpu time.Duration, n int64) float64 {
		if cpu < 0 || n == 0 {
			return math.NaN()
		}
		return float64(cpu) / float64(time.Microsecond) / float64(n)
	}
	for _, r := range rs {
		rps = append(rps, r.closed.RPS)
		c50 = append(c50, ms(r.closed.P50))
		c99 = append(c99, ms(r.closed.P99))
		ccpu = append(ccpu, perReq(r.closedCPU, r.closed.Requests))
		s.ClosedErrors += r.closed.Errors
		s.OpenErrors += int64(r.open.Errors)
		if r.open.Elapsed > 0 {
			orate = append(orate, float64(r.open.OK)/r.open.Elapsed.Seconds())
		}
		ocpu = append(ocpu, perReq(r.openCPU, int64(r.open.Total))) // the CPU covers the warm-up too
		if len(r.open.Lat) == 0 {
			continue
		}
		lat := sortedCopy(r.open.Lat)
		o50 = append(o50, ms(quantile(lat, 0.50)))
		o99 = append(o99, ms(quantile(lat, 0.99)))
		o999 = append(o999, ms(quantile(lat, 0.999)))
	}
	s.ClosedRPS, s.ClosedP50, s.ClosedP99, s.ClosedCPU = summarize(rps), summarize(c50), summarize(c99), summarize(ccpu)
	s.OpenP50, s.OpenP99, s.OpenP999, s.OpenRate, s.OpenCPU = summarize(o50), summarize(o99), summarize(o999), summarize(orate), summarize(ocpu)
	return s
}

// markdown renders the report as the docs section, markers included.
// images are the plots' paths relative to the docs file (none: no plots).
func (r warmReport) markdown(images []string) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("%s\n", warmStart)
	p("## Warm requests: the router against nginx, haproxy and a fasthttp proxy (`skipper-bench warm`)\n\n")
	p("Written by `skipper-bench warm` (`make bench`); rerun it rather than edit this section.\n\n")
	p("- Date: %s. Machine: %s.\n", r.Date, r.Machine)
	p("- Commit: %s. Command: `%s`.\n", r.Commit, r.Command)
	p("- Function `%s` (made by the bench: one instance, %s), called through each contender; "+
		"nginx, haproxy and the fasthttp proxy (tests/fastproxy) run in node 1's network namespace, in a cgroup beside the router pod's with its CPU weight, "+
		"with %d worker processes / threads / GOMAXPROCS (the router's GOMAXPROCS), keeping connections to the instance alive.\n",
		r.Function, r.Instance, r.Workers)
	p("- %d rounds, the contenders interleaved in each (A B C D, A B C D, …); each figure is the median over the rounds, "+
		"the range in parentheses. Proxy CPU is the user+system time of the proxy's processes (/proc/<pid>/stat) "+
		"during the run divided by the requests it served.\n", r.Rounds)
	if r.Stopped != "" {
		p("- **Cut short** %s.\n", r.Stopped)
	}
	p("\n")

	p("### Closed loop: `wrk -t%d -c%d -d%s --latency`\n\n", r.Threads, r.Connections, r.Duration)
	p("| contender | requests/s | p50 | p99 | proxy CPU / request | errors |\n|---|---|---|---|---|---|\n")
	for _, c := range r.Contenders {
		p("| %s | %s | %s | %s | %s | %d |\n", c.Label, fmtStat(c.ClosedRPS, "%.0f", ""),
			fmtStat(c.ClosedP50, msFormat(c.ClosedP50), " ms"), fmtStat(c.ClosedP99, msFormat(c.ClosedP99), " ms"),
			fmtStat(c.ClosedCPU, "%.1f", " µs"), c.ClosedErrors)
	}
	p("\n### Open loop: %d requests/s for %s\n\n", r.Rate, r.Duration)
	p("Latency from each request's scheduled start (a stalled proxy is charged for the requests queued behind it), "+
		"after a %s warm-up.\n\n", openWarmup)
	p("| contender | p50 | p99 | p99.9 | answered/s | proxy CPU / request | errors |\n|---|---|---|---|---|---|---|\n")
	for _, c := range r.Contenders {
		p("| %s | %s | %s | %s | %s | %s | %d |\n", c.Label,
			fmtStat(c.OpenP50, msFormat(c.OpenP50), " ms"), fmtStat(c.OpenP99, msFormat(c.OpenP99), " ms"),
			fmtStat(c.OpenP999, msFormat(c.OpenP999), " ms"), fmtStat(c.OpenRate, "%.0f", ""),
			fmtStat(c.OpenCPU, "%.1f", " µs"), c.OpenErrors)
	}
	if len(r.VIP) > 0 {
		p("\n### Per new connection from node 2: the Service VIP steered by BPF against kube-proxy\n\n")
		p("`skipper-bench vip`'s measurement, after the rounds: a caller in node 2's namespace makes %d sequential GETs per path and round, "+
			"each on a new connection (connect + request, which steering changes), the paths interleaved in each of the rounds; "+
			"each figure is the median of the rounds' p50 and p99, the range in parentheses.\n\n", r.VIPN)
		p("%s", vipTable(r.VIP))
	}
	if r.Callers != nil {
		p("%s", r.Callers.markdown())
	}
	if len(r.Allocs) > 0 {
		p("\n### Allocations per proxied request\n\n")
		p("`go test -run '^$' -bench 'ProxyWarmServed|CallerCheck' -benchmem ./noderouter/dataplane/ ./noderouter/callers/` (make bench): " +
			"ProxyWarmServed, a raw keep-alive client to a raw instance " +
			"through the router's served path per forwarder, on loopback (-callers: a Function with spec.callers, the caller in an index of 10,000 pods); " +
			"allocs/op counts the whole test process, the client's included (the largest of the runs); CallerCheck, the caller check alone from both Ps.\n\n")
		p("%s", allocsTable(r.Allocs))
	}
	if len(images) > 0 {
		p("\n")
		for _, img := range images {
			p("![%s](%s)\n", strings.TrimSuffix(img[strings.LastIndex(img, "/")+1:], ".png"), img)
		}
	}
	p("%s\n", warmEnd)
	return b.String()
}

// msFormat picks the precision of a latency in ms by its size.
func msFormat(s stat) string {
	switch {
	case s.Max < 1:
		return "%.3f"
	case s.Max < 10:
		return "%.2f"
	}
	return "%.1f"
}

// fmtStat renders "median unit (min–max)", or "–" without values.
func fmtStat(s stat, format, unit string) string {
	if s.N == 0 {
		return "–"
	}
	m := fmt.Sprintf(format, s.Median)
	if s.N == 1 {
		return m + unit
	}
	return fmt.Sprintf("%s%s (%s–%s)", m, unit, fmt.Sprintf(format, s.Min), fmt.Sprintf(format, s.Max))
}

// replaceSection puts section (markers included) in place of doc's text
// from its first warmStart to the next warmEnd, or appends it after a blank line when doc has
// no such pair.
func replaceSection(doc, section string) string {
	if i := strings.Index(doc, warmStart); i >= 0 {
		if j := strings.Index(doc[i:], warmEnd); j >= 0 {
			rest := strings.TrimPrefix(doc[i+j+len(warmEnd):], "\n")
			return doc[:i] + section + rest
		}
	}
	doc = strings.TrimRight(doc, "\n")
	if doc == "" {
		return section
	}
	return doc + "\n\n" + section
}

// cpuModel is the first "model name" of a /proc/cpuinfo text.
func cpuModel(cpuinfo string) string {
	sc := bufio.NewScanner(strings.NewReader(cpuinfo))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// machine describes this machine: CPUs, their model, the kernel.
func machine() string {
	info, _ := os.ReadFile("/proc/cpuinfo")
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%d CPUs (%s), Linux %s", runtime.NumCPU(), cpuModel(string(info)), strings.TrimSpace(string(kernel)))
}

// commit is `git rev-parse --short HEAD`, with " (dirty)" when tracked
// files differ from it. Read-only: no optional locks, no index refresh.
func commit() string {
	out, err := exec.Command("git", "--no-optional-locks", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	c := strings.TrimSpace(string(out))
	st, err := exec.Command("git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no").Output()
	if err == nil && len(strings.TrimSpace(string(st))) > 0 {
		c += " (dirty)"
	}
	return c
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
