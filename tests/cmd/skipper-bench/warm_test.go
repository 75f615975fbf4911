package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"skipper.dev/skipper/tests/linuxhost"
)

const wrkOK = `Running 5s test @ http://198.51.100.11:8380/bench
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     3.80ms    0.93ms  10.10ms   84.77%
    Req/Sec     8.45k   242.65     9.53k    70.00%
  Latency Distribution
     50%  812.00us
     75%    2.02ms
     90%    2.71ms
     99%    5.63ms
  84123 requests in 5.00s, 13.50MB read
Requests/sec:  16824.60
Transfer/sec:      2.70MB
`

const wrkErrors = `Running 1s test @ http://127.0.0.1:18999/nonexistent
  1 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.25ms    1.55ms  14.94ms   93.92%
    Req/Sec     1.70k   219.40     1.95k    60.00%
  Latency Distribution
     50%    0.88ms
     75%    1.17ms
     90%    1.81ms
     99%    1.02s
  1690 requests in 1.00m, 858.38KB read
  Socket errors: connect 1, read 2, write 0, timeout 4
  Non-2xx or 3xx responses: 1690
Requests/sec:   1688.94
Transfer/sec:    857.85KB
`

func TestParseWrk(t *testing.T) {
	for _, tc := range []struct {
		name    string
		out     string
		want    wrkResult
		wantErr bool
	}{
		{"clean run", wrkOK, wrkResult{Requests: 84123, Elapsed: 5 * time.Second, RPS: 16824.60,
			P50: 812 * time.Microsecond, P99: 5630 * time.Microsecond}, false},
		{"socket errors and non-2xx add up", wrkErrors, wrkResult{Requests: 1690, Elapsed: time.Minute, RPS: 1688.94,
			P50: 880 * time.Microsecond, P99: 1020 * time.Millisecond, Errors: 1 + 2 + 4 + 1690}, false},
		{"no latency distribution (run without --latency)", strings.Replace(wrkOK, "     99%    5.63ms\n", "", 1), wrkResult{}, true},
		{"connection refused: nothing but an error", "unable to connect to 198.51.100.11:18081 Connection refused\n", wrkResult{}, true},
		{"bad number", strings.Replace(wrkOK, "84123 requests", "8x123 requests", 1), wrkResult{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseWrk(tc.out)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseWrk err = %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			// Float time units: compare to the microsecond.
			got.P50, got.P99 = got.P50.Round(time.Microsecond), got.P99.Round(time.Microsecond)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(wrkResult{})); diff != "" {
				t.Errorf("parseWrk (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseWrkDuration(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"812.00us", 812 * time.Microsecond, false},
		{"1.50ms", 1500 * time.Microsecond, false},
		{"5.00s", 5 * time.Second, false},
		{"1.00m", time.Minute, false},
		{"2.00h", 2 * time.Hour, false},
		{"12", 0, true},
		{"ams", 0, true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseWrkDuration(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if got.Round(time.Microsecond) != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestParseStatCPU(t *testing.T) {
	// Fields 14 and 15 (utime, stime) are 1234 and 56 in each line.
	for _, tc := range []struct {
		name    string
		stat    string
		want    int64
		wantErr bool
	}{
		{"nginx worker", "4242 (nginx) S 4241 4241 4241 0 -1 4194624 2170 0 0 0 1234 56 0 0 20 0 1 0 1033 11137024 1526 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n", 1290, false},
		{"name with spaces and parentheses", "77 (a (b) c) R 1 77 77 0 -1 4194560 0 0 0 0 1234 56 7 8 20 0 3 0\n", 1290, false},
		{"children's time is not counted", "9 (x) S 1 9 9 0 -1 0 0 0 0 0 1234 56 99999 99999 20 0 1 0\n", 1290, false},
		{"truncated", "9 (x) S 1 9 9 0 -1 0 0 0 0 0 1234\n", 0, true},
		{"no name", "9 x S 1\n", 0, true},
		{"not a number", "9 (x) S 1 9 9 0 -1 0 0 0 0 0 12a4 56 0 0 20 0 1 0\n", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatCPU([]byte(tc.stat))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("got %d ticks, want %d", got, tc.want)
			}
		})
	}
}

// TestCgroupCPU reads a fake cgroup tree: this process in a nested
// cgroup.procs, and a pid that has exited (skipped).
func TestCgroupCPU(t *testing.T) {
	dir := t.TempDir()
	nested := filepath.Join(dir, "pod", "c")
	if err := os.MkdirAll(nested, 0o755); err != nil {
		t.Fatal(err)
	}
	// 2^22 is above pid_max's default: no such process.
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("4194304\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nested, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	ticks, err := parseStatCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cgroupCPU(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Duration(ticks) * 10 * time.Millisecond; got < want {
		t.Errorf("cgroupCPU = %s, want at least this process's %s", got, want)
	}
	if _, err := cgroupCPU(filepath.Join(dir, "missing")); err == nil {
		t.Error("cgroupCPU of a missing cgroup: no error")
	}
}

func TestSummarize(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name string
		in   []float64
		want stat
	}{
		{"odd count", []float64{5, 1, 3, 9, 7}, stat{Median: 5, Min: 1, Max: 9, N: 5}},
		{"even count: mean of the middle two", []float64{4, 1, 3, 2}, stat{Median: 2.5, Min: 1, Max: 4, N: 4}},
		{"one", []float64{7}, stat{Median: 7, Min: 7, Max: 7, N: 1}},
		{"NaN rounds left out", []float64{nan, 2, nan, 4}, stat{Median: 3, Min: 2, Max: 4, N: 2}},
		{"nothing", nil, stat{}},
		{"only NaN", []float64{nan}, stat{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.in...)
			if diff := cmp.Diff(tc.want, summarize(tc.in)); diff != "" {
				t.Errorf("summarize (-want +got):\n%s", diff)
			}
			if !cmp.Equal(in, tc.in, cmp.Comparer(func(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) })) {
				t.Errorf("summarize changed its input: %v", tc.in)
			}
		})
	}
}

func TestQuantile(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	var thousand []time.Duration
	for i := 1; i <= 1000; i++ {
		thousand = append(thousand, ms(i))
	}
	for _, tc := range []struct {
		name string
		in   []time.Duration
		q    float64
		want time.Duration
	}{
		{"p50 of 1..1000", thousand, 0.5, ms(500)},
		{"p99 of 1..1000", thousand, 0.99, ms(990)},
		{"p99.9 of 1..1000", thousand, 0.999, ms(999)},
		{"p100", thousand, 1, ms(1000)},
		{"p99.9 of 10 is the max", thousand[:10], 0.999, ms(10)},
		{"one value", []time.Duration{ms(3)}, 0.5, ms(3)},
		{"none", nil, 0.5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := quantile(tc.in, tc.q); got != tc.want {
				t.Errorf("quantile(%v) = %s, want %s", tc.q, got, tc.want)
			}
		})
	}
}

func TestReplaceSection(t *testing.T) {
	const sec = warmStart + "\nnew\n" + warmEnd + "\n"
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"appended after a blank line", "# Benchmarks\n\ntext\n", "# Benchmarks\n\ntext\n\n" + sec},
		{"appended to a file without a final newline", "# B\ntext", "# B\ntext\n\n" + sec},
		{"empty file", "", sec},
		{"replaced in the middle, the rest kept", "# B\n\n" + warmStart + "\nold\nolder\n" + warmEnd + "\n\n## Next\n",
			"# B\n\n" + sec + "\n## Next\n"},
		{"replaced at the end", "# B\n\n" + warmStart + "\nold\n" + warmEnd + "\n", "# B\n\n" + sec},
		{"a stray end marker before the section", "# B\n" + warmEnd + "\n" + warmStart + "\nold\n" + warmEnd + "\n",
			"# B\n" + warmEnd + "\n" + sec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := replaceSection(tc.doc, sec)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("replaceSection (-want +got):\n%s", diff)
			}
			if again := replaceSection(got, sec); again != got {
				t.Errorf("a second rewrite changed the doc:\n%s", cmp.Diff(got, again))
			}
		})
	}
}

func TestSummarizeContenderAndMarkdown(t *testing.T) {
	lat := func(ms ...int) []time.Duration {
		var ds []time.Duration
		for _, m := range ms {
			ds = append(ds, time.Duration(m)*time.Millisecond)
		}
		return ds
	}
	rounds := []roundResult{
		{closed: wrkResult{Requests: 50000, RPS: 10000, P50: 2 * time.Millisecond, P99: 8 * time.Millisecond},
			closedCPU: 5 * time.Second, open: openResult{Total: 2, Sent: 4, OK: 4, Elapsed: 2 * time.Second, Lat: lat(4, 1, 2, 3)}, openCPU: 400 * time.Microsecond},
		{closed: wrkResult{Requests: 60000, RPS: 12000, P50: 3 * time.Millisecond, P99: 9 * time.Millisecond, Errors: 2},
			closedCPU: 3 * time.Second, open: openResult{Total: 4, Sent: 4, OK: 3, Errors: 1, Elapsed: 2 * time.Second, Lat: lat(5, 6, 7)}, openCPU: 800 * time.Microsecond},
	}
	got := summarizeContender("router", "router (node 1 IP:8380)", rounds)
	want := contenderSummary{
		Name: "router", Label: "router (node 1 IP:8380)",
		ClosedRPS:    stat{Median: 11000, Min: 10000, Max: 12000, N: 2},
		ClosedP50:    stat{Median: 2.5, Min: 2, Max: 3, N: 2},
		ClosedP99:    stat{Median: 8.5, Min: 8, Max: 9, N: 2},
		ClosedCPU:    stat{Median: 75, Min: 50, Max: 100, N: 2}, // 5 s / 50000 = 100 µs, 3 s / 60000 = 50 µs
		ClosedErrors: 2,
		OpenP50:      stat{Median: 4, Min: 2, Max: 6, N: 2},
		OpenP99:      stat{Median: 5.5, Min: 4, Max: 7, N: 2},
		OpenP999:     stat{Median: 5.5, Min: 4, Max: 7, N: 2},
		OpenRate:     stat{Median: 1.75, Min: 1.5, Max: 2, N: 2},
		OpenCPU:      stat{Median: 200, Min: 200, Max: 200, N: 2}, // 400 µs / 2 sent in all, 800 µs / 4
		OpenErrors:   1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("summarizeContender (-want +got):\n%s", diff)
	}
	direct := summarizeContender("direct", "direct", []roundResult{{closed: wrkResult{Requests: 1, RPS: 1}, closedCPU: -1, openCPU: -1}})
	if direct.ClosedCPU.N != 0 || direct.OpenCPU.N != 0 {
		t.Errorf("a contender without a proxy got CPU figures: %+v %+v", direct.ClosedCPU, direct.OpenCPU)
	}

	md := warmReport{Rounds: 2, Duration: "5s", Threads: 2, Connections: 64, Rate: 1000,
		Contenders: []contenderSummary{got, direct}}.markdown([]string{"bench/warm-closed.png"})
	for _, s := range []string{
		warmStart + "\n", warmEnd + "\n",
		"`wrk -t2 -c64 -d5s --latency`",
		"| router (node 1 IP:8380) | 11000 (10000–12000) | 2.50 ms (2.00–3.00) | 8.50 ms (8.00–9.00) | 75.0 µs (50.0–100.0) | 2 |",
		"| direct | 1 | 0.000 ms | 0.000 ms | – | 0 |",
		"![warm-closed](bench/warm-closed.png)",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	if !strings.HasPrefix(md, warmStart) || !strings.HasSuffix(md, warmEnd+"\n") {
		t.Errorf("markdown not between the markers:\n%s", md)
	}
}

func TestCPUModel(t *testing.T) {
	info := "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nprocessor\t: 1\nmodel name\t: other\n"
	if got := cpuModel(info); got != "Intel(R) Xeon(R) CPU @ 2.20GHz" {
		t.Errorf("cpuModel = %q", got)
	}
	if got := cpuModel("processor : 0\n"); got != "unknown CPU" {
		t.Errorf("cpuModel without a model name = %q", got)
	}
}

func TestGaugeValue(t *testing.T) {
	page := "# HELP go_sched_gomaxprocs_threads x\n# TYPE go_sched_gomaxprocs_threads gauge\ngo_sched_gomaxprocs_threads 2\ngo_sched_gomaxprocs_threads_other 9\n"
	if v, ok := gaugeValue(strings.NewReader(page), "go_sched_gomaxprocs_threads"); !ok || v != 2 {
		t.Errorf("gaugeValue = %v, %v; want 2, true", v, ok)
	}
	if _, ok := gaugeValue(strings.NewReader(page), "missing"); ok {
		t.Error("gaugeValue found a missing metric")
	}
}

func TestWarmFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    []string // contenders
		wantErr string
	}{
		{"defaults", nil, []string{"direct", "router", "nginx", "haproxy", "fasthttp", "loop", "vip", "kube-proxy", "router-pod", "router-callers"}, ""},
		{"fasthttp alone", []string{"-contenders", "fasthttp"}, []string{"fasthttp"}, ""},
		{"a chosen order", []string{"-contenders", "haproxy, router"}, []string{"haproxy", "router"}, ""},
		{"unknown contender", []string{"-contenders", "router,envoy"}, nil, `unknown "envoy"`},
		{"twice", []string{"-contenders", "router,router"}, nil, `"router" twice`},
		{"the caller check's pair split", []string{"-contenders", "router,router-callers"}, nil, "router-pod and router-callers run together"},
		{"all errors at once", []string{"-rounds", "0", "-duration", "1500ms", "-rate", "0"}, nil, "-rounds 0"},
		{"fractional duration", []string{"-duration", "1500ms"}, nil, "whole seconds"},
		{"more threads than connections", []string{"-threads", "4", "-connections", "2"}, nil, "threads ≤ connections"},
		{"stray argument", []string{"extra"}, nil, "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr strings.Builder
			cfg, err := parseWarmFlags(tc.args, &stderr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, cfg.Contenders); diff != "" {
				t.Errorf("contenders (-want +got):\n%s", diff)
			}
		})
	}
	for _, tc := range []struct {
		name    string
		args    []string
		wantOut string
	}{
		{"default", nil, "docs/bench"},
		{"-docs empty: only print", []string{"-docs", ""}, ""},
		{"-docs empty, -out given", []string{"-docs", "", "-out", "/tmp/b"}, "/tmp/b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseWarmFlags(tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Out != tc.wantOut {
				t.Errorf("-out = %q, want %q", cfg.Out, tc.wantOut)
			}
		})
	}
	var stderr strings.Builder
	if _, err := parseWarmFlags([]string{"--help"}, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: err = %v, want flag.ErrHelp", err)
	}
	for _, f := range []string{"-rounds", "-duration", "-connections", "-rate", "-contenders", "-env", "-docs", "-fastproxy", "fasthttp", "tests/fastproxy", "kube-proxy"} {
		if !strings.Contains(stderr.String(), f) {
			t.Errorf("--help does not mention %s:\n%s", f, stderr.String())
		}
	}
}

func TestProxyConfigs(t *testing.T) {
	c := proxyConfig{Dir: "/tmp/x", Listen: "198.51.100.11:18081", Upstream: "198.18.1.9:8080", Workers: 2}
	for _, tc := range []struct {
		kind     proxyKind
		bin      string
		wantConf []string // in the config file; nil: the kind has none
		wantArgs []string
	}{
		{nginxKind, "nginx", []string{"worker_processes 2;", "listen 198.51.100.11:18081", "server 198.18.1.9:8080;", "keepalive 256;",
			"proxy_http_version 1.1;", `proxy_set_header Connection "";`, "pid /tmp/x/nginx.pid;"},
			[]string{"-p", "/tmp/x", "-c", "/tmp/x/nginx.conf", "-e", "stderr"}},
		{haproxyKind, "haproxy", []string{"nbthread 2", "bind 198.51.100.11:18081", "server instance 198.18.1.9:8080", "http-reuse always"},
			[]string{"-db", "-f", "/tmp/x/haproxy.conf"}},
		{fasthttpKind, "fastproxy", nil,
			[]string{"-listen", "198.51.100.11:18081", "-upstream", "198.18.1.9:8080", "-procs", "2"}},
		{loopKind, "loopproxy", nil,
			[]string{"-listen", "198.51.100.11:18081", "-upstream", "198.18.1.9:8080", "-procs", "2"}},
	} {
		t.Run(tc.kind.name, func(t *testing.T) {
			if got := tc.kind.binName(); got != tc.bin {
				t.Errorf("binary %q, want %q", got, tc.bin)
			}
			if diff := cmp.Diff(tc.wantArgs, tc.kind.args(c)); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
			got, err := renderProxyConf(tc.kind, c)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantConf == nil && got != "" {
				t.Errorf("a kind without a config file rendered one:\n%s", got)
			}
			for _, s := range tc.wantConf {
				if !strings.Contains(got, s) {
					t.Errorf("config lacks %q:\n%s", s, got)
				}
			}
		})
	}
}

// TestWarmProxies: every proxy contender has a kind of its name and a port
// of its own.
func TestWarmProxies(t *testing.T) {
	ports := map[int]string{}
	for _, k := range warmContenders {
		p, ok := warmProxies[k.name]
		if !ok {
			continue
		}
		if p.kind.name != k.name {
			t.Errorf("contender %s runs kind %s", k.name, p.kind.name)
		}
		if other, dup := ports[p.port]; dup {
			t.Errorf("%s and %s both listen on %d", other, k.name, p.port)
		}
		ports[p.port] = k.name
	}
	if len(ports) != len(warmProxies) {
		t.Errorf("%d proxies, %d of them contenders", len(warmProxies), len(ports))
	}
}

func TestFindBuilt(t *testing.T) {
	write := func(dir, name string, mode os.FileMode) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	beside, onPath, empty := t.TempDir(), t.TempDir(), t.TempDir()
	besideBin := write(beside, "fastproxy", 0o755)
	pathBin := write(onPath, "fastproxy", 0o755)
	write(empty, "fastproxy", 0o644) // not executable: passed over
	t.Setenv("PATH", onPath)
	for _, tc := range []struct {
		name, dir, want, wantErr string
	}{
		{"beside this binary first", beside, besideBin, ""},
		{"then on PATH", empty, pathBin, ""},
		{"dir unknown: PATH", "", pathBin, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := findBuilt("fastproxy", tc.dir, fastproxyBuild)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("found %s, want %s", got, tc.want)
			}
		})
	}
	t.Setenv("PATH", empty)
	_, err := findBuilt("fastproxy", empty, fastproxyBuild)
	if err == nil || !strings.Contains(err.Error(), "cd tests/fastproxy && CGO_ENABLED=0 go build") {
		t.Errorf("missing binary: err = %v, want one that says how to build it", err)
	}
	if _, err := findFastproxy(filepath.Join(empty, "fastproxy")); err == nil || !strings.Contains(err.Error(), "make bench") {
		t.Errorf("-fastproxy naming a non-executable: err = %v, want one that says how to build it", err)
	}
	if got, err := findFastproxy(besideBin); err != nil || got != besideBin {
		t.Errorf("-fastproxy %s: got %s, %v", besideBin, got, err)
	}
}

// TestWarmOpen runs the open-loop generator against a local server: every
// scheduled request is sent, answered ones are timed, others counted.
func TestWarmOpen(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1)%10 == 0 || r.Header.Get("x-skipper-function") != "default/f" {
			http.Error(w, "no", http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	var out, stderr strings.Builder
	err := runWarmOpen(t.Context(), []string{"-url", srv.URL, "-rate", "200", "-duration", "250ms", "-function", "default/f"}, &out, &stderr)
	if err != nil {
		t.Fatalf("warm-open: %v (%s)", err, stderr.String())
	}
	var r openResult
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatal(err)
	}
	// 200/s: 100 in the warm-up (not recorded), then 50.
	if r.Total != 150 || r.Sent != 50 || r.OK+r.Errors != r.Sent || len(r.Lat) != r.OK || r.Errors < 4 || r.Errors > 6 {
		t.Errorf("sent %d, ok %d, errors %d, %d latencies; want 50 sent, 5±1 errors", r.Sent, r.OK, r.Errors, len(r.Lat))
	}
	if r.Elapsed < 245*time.Millisecond { // the last of 50 starts 49 intervals in
		t.Errorf("elapsed %s, want at least 245ms", r.Elapsed)
	}
}

// TestPlacementEntersCgroups checks the shell wrapper writes the process's
// pid into each cgroup (plain files standing in for cgroup.procs) before
// it execs the command.
func TestPlacementEntersCgroups(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	p := placement{cgroups: []string{a, b}}
	out, err := p.command(t.Context(), "sh", "-c", "echo $$").Output()
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(out))
	for _, d := range []string{a, b} {
		got, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(got)) != pid {
			t.Errorf("%s/cgroup.procs = %q, want the command's pid %s", d, got, pid)
		}
	}
	if err := (placement{cgroups: []string{filepath.Join(a, "missing")}}).command(t.Context(), "true").Run(); err == nil {
		t.Error("a cgroup that cannot be entered: the command ran anyway")
	}
}

// TestProxiesServe starts nginx, haproxy, fastproxy and loopproxy with the bench's
// configs on loopback in front of a local upstream (skipped where they are
// not installed: .ci/install-bench; fastproxy and loopproxy: not in the
// repository's bin/ nor on PATH).
func TestProxiesServe(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(upstream.Close)
	look := map[string]func() (string, error){
		"nginx":   func() (string, error) { return lookBin("nginx") },
		"haproxy": func() (string, error) { return lookBin("haproxy") },
		"fasthttp": func() (string, error) {
			return findBuilt("fastproxy", filepath.Join("..", "..", "..", "bin"), fastproxyBuild)
		},
		"loop": func() (string, error) {
			return findBuilt("loopproxy", filepath.Join("..", "..", "..", "bin"), loopproxyBuild)
		},
	}
	for _, kind := range []proxyKind{nginxKind, haproxyKind, fasthttpKind, loopKind} {
		t.Run(kind.name, func(t *testing.T) {
			bin, err := look[kind.name]()
			if err != nil {
				t.Skipf("%v (nginx, haproxy: sudo bash .ci/install-bench)", err)
			}
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			listen := l.Addr().String()
			l.Close()
			var log strings.Builder
			pp, err := startProxy(kind, bin, proxyConfig{Dir: t.TempDir(), Listen: listen,
				Upstream: strings.TrimPrefix(upstream.URL, "http://"), Workers: 2}, placement{}, &syncWriter{w: &log})
			if err != nil {
				t.Fatal(err)
			}
			defer pp.stop(5 * time.Second)
			if err := pp.waitReady(t.Context(), "http://"+listen+"/bench", 10*time.Second); err != nil {
				t.Fatalf("%v\n%s", err, log.String())
			}
		})
	}
}

// TestMakeCgroupCopiesWeight makes a cgroup beside a reference one in a
// fresh test subtree of the machine's hierarchies and checks it gets the
// reference's CPU weight wherever the cpu controller is.
func TestMakeCgroupCopiesWeight(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups")
	}
	hs, err := linuxhost.Hierarchies()
	if err != nil {
		t.Skip(err)
	}
	base := fmt.Sprintf("/skipper-bench-test-%d", os.Getpid())
	t.Cleanup(func() {
		for _, d := range linuxhost.Dirs(hs, base) {
			_ = linuxhost.RemoveTree(d, 5*time.Second)
		}
	})
	ref := base + "/ref"
	refDirs, err := makeCgroup(hs, ref, "")
	if err != nil {
		t.Fatal(err)
	}
	weighted := 0
	for i, h := range hs {
		file, value := "cpu.shares", "512"
		if h.V2() {
			file, value = "cpu.weight", "50"
		}
		if err := os.WriteFile(filepath.Join(refDirs[i], file), []byte(value), 0o644); err == nil {
			weighted++
		}
	}
	if weighted == 0 {
		t.Skip("no cpu controller in any hierarchy")
	}
	dirs, err := makeCgroup(hs, base+"/proxy", ref)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		file, want := "cpu.shares", "512"
		if h.V2() {
			file, want = "cpu.weight", "50"
		}
		got, err := os.ReadFile(filepath.Join(dirs[i], file))
		if err != nil {
			continue // no cpu controller here
		}
		if strings.TrimSpace(string(got)) != want {
			t.Errorf("%s/%s = %q, want the reference's %s", dirs[i], file, got, want)
		}
	}
}

func TestMeasure(t *testing.T) {
	readings := []time.Duration{2 * time.Second, 5 * time.Second}
	cpu := func() (time.Duration, error) {
		d := readings[0]
		readings = readings[1:]
		return d, nil
	}
	r, used, err := measure(cpu, func() (int, error) { return 42, nil })
	if err != nil || r != 42 || used != 3*time.Second {
		t.Errorf("measure = %d, %s, %v; want 42, 3s, nil", r, used, err)
	}
	if _, used, _ := measure(nil, func() (int, error) { return 1, nil }); used != -1 {
		t.Errorf("measure without a meter: CPU %s, want -1", used)
	}
	boom := errors.New("boom")
	if _, _, err := measure(func() (time.Duration, error) { return 0, nil }, func() (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Errorf("measure of a failing run: err %v, want %v", err, boom)
	}
}

func TestShellCommand(t *testing.T) {
	got := shellCommand([]string{"skipper-bench", "warm", "-docs", "", "-contenders", "a,b", "-x", "it's"})
	if want := `skipper-bench warm -docs '' -contenders a,b -x 'it'\''s'`; got != want {
		t.Errorf("shellCommand = %s, want %s", got, want)
	}
}

// TestCutShort: a run that fails mid-round reports its whole rounds only,
// and says it was cut short.
func TestCutShort(t *testing.T) {
	r := func(rps float64) roundResult { return roundResult{closed: wrkResult{RPS: rps}} }
	// Round 3 failed at the second contender: the first has 3 results.
	got := trimRounds([][]roundResult{{r(1), r(2), r(3)}, {r(4), r(5)}}, 2)
	if len(got[0]) != 2 || len(got[1]) != 2 || got[0][1].closed.RPS != 2 {
		t.Errorf("trimRounds kept %v", got)
	}
	md := warmReport{Rounds: 2, Stopped: "after 2 of 5 rounds: boom"}.markdown(nil)
	if !strings.Contains(md, "- **Cut short** after 2 of 5 rounds: boom.\n") {
		t.Errorf("markdown does not say the run was cut short:\n%s", md)
	}
}

func TestCallersRatios(t *testing.T) {
	round := func(cpu time.Duration, n int64) roundResult {
		return roundResult{closed: wrkResult{Requests: n}, closedCPU: cpu, open: openResult{Total: int(n)}, openCPU: cpu}
	}
	without := []roundResult{round(100*time.Millisecond, 1000), round(200*time.Millisecond, 1000), round(-1, 1000)}
	with := []roundResult{round(105*time.Millisecond, 1000), round(220*time.Millisecond, 1000), round(time.Second, 1000)}
	c := callersRatios(without, with)
	// Rounds pair up; one not measured is left out.
	if c.ClosedCPU.N != 2 || math.Abs(c.ClosedCPU.Median-1.075) > 1e-9 || math.Abs(c.ClosedCPU.Min-1.05) > 1e-9 || math.Abs(c.ClosedCPU.Max-1.1) > 1e-9 {
		t.Errorf("closed = %+v, want median 1.075 of 1.05 and 1.10", c.ClosedCPU)
	}
	if md := c.markdown(); !strings.Contains(md, "| closed | 1.075× (1.050–1.100) | ≤ 1.05 |") {
		t.Errorf("markdown:\n%s", md)
	}
}
