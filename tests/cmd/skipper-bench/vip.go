package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"skipper.dev/skipper/tests/cluster"
	"skipper.dev/skipper/tests/linuxhost"
)

// vipPath is one way a caller on a node reaches its router.
type vipPath struct {
	name     string
	url      string
	inCgroup bool // the caller runs in the node's cgroup, where BPF steers
}

// clientResult is what one vip-client run prints.
type clientResult struct {
	N       int             `json:"n"`
	Errors  int             `json:"errors"`
	FirstEr string          `json:"first_error,omitempty"`
	Elapsed time.Duration   `json:"elapsed"`
	Lat     []time.Duration `json:"latencies"`
}

// runVIP compares, from a caller on one node, the paths to that node's
// router: the skipper Service VIP steered by BPF, the VIP through
// kube-proxy (a caller outside the node's cgroup, where nothing steers),
// and the router addresses dialled directly. Each request opens a new
// connection (connect + request is what steering changes).
func runVIP(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("vip", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 2000, "requests per path, each on a new connection")
	node := fs.Int("node", 2, "the caller's node")
	function := fs.String("function", "default/echo", "function called")
	envFile := fs.String("env", ".skipper/env", "the local cluster's env file")
	rounds := fs.Int("rounds", 3, "rounds, each running every path once in turn")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 1 || *node < 1 || *rounds < 1 {
		return fmt.Errorf("-n, -node and -rounds must be at least 1")
	}
	_, _, cs, err := attach(*envFile)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "vip: caller on node%d, %d requests per path and round, each on a new connection, function %s, %d rounds (the paths interleaved in each; median and min–max)\n\n",
		*node, *n, *function, *rounds)
	rows, err := vipRounds(ctx, cs, vipConfig{n: *n, node: *node, rounds: *rounds, function: *function}, stderr)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, vipTable(rows))
	return nil
}

// vipConfig is what one vip measurement runs.
type vipConfig struct {
	n, node, rounds int
	function        string
}

// vipRow is one path's figures over the rounds: latencies in
// milliseconds, the median and range of the rounds' p50 and p99.
type vipRow struct {
	Path   string `json:"path"`
	P50    stat   `json:"p50_ms"`
	P99    stat   `json:"p99_ms"`
	RPS    stat   `json:"rps"`
	Errors int    `json:"errors"`
}

// vipRounds runs every path once per round, in turn, so that a drift of
// the machine (a warming cache, a neighbour's load) falls on all of them.
func vipRounds(ctx context.Context, cs kubernetes.Interface, cfg vipConfig, stderr io.Writer) ([]vipRow, error) {
	svc, err := cs.CoreV1().Services("skipper-system").Get(ctx, "skipper", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the skipper Service: %w", err)
	}
	mnt, err := linuxhost.Cgroup2Mount()
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	topo := cluster.DefaultTopology()
	vip := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	paths := []vipPath{
		{"VIP via BPF (connect4 rewrite)", "http://" + vip, true},
		{"VIP via kube-proxy (no BPF)", "http://" + vip, false},
		{"169.254.20.20:80 direct", "http://169.254.20.20:80", false},
		{"node IP:8380 direct", "http://" + net.JoinHostPort(topo.NodeIP(cfg.node).String(), "8380"), false},
	}
	rows := make([]vipRow, len(paths))
	p50s, p99s, rpss := make([][]float64, len(paths)), make([][]float64, len(paths)), make([][]float64, len(paths))
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for range cfg.rounds {
		for i, p := range paths {
			// The caller joins the node's cgroup (or not) before entering its
			// network namespace: ip netns exec remounts /sys.
			script := `exec ip netns exec "$1" "$2" vip-client -url "$3" -n "$4" -function "$5"`
			if p.inCgroup {
				script = `echo $$ > "$6/cgroup.procs" && ` + script
			}
			cmd := exec.CommandContext(ctx, "sh", "-c", script, "caller", topo.Netns(cfg.node), self, p.url,
				strconv.Itoa(cfg.n), cfg.function, filepath.Join(mnt, "skipper", cluster.NodeName(cfg.node)))
			cmd.Stderr = stderr
			out, err := cmd.Output()
			if err != nil {
				return nil, fmt.Errorf("%s: client: %w", p.name, err)
			}
			var r clientResult
			if err := json.Unmarshal(out, &r); err != nil {
				return nil, fmt.Errorf("%s: client output: %w", p.name, err)
			}
			if len(r.Lat) == 0 {
				return nil, fmt.Errorf("%s: no request answered: %d/%d failed (%s)", p.name, r.Errors, r.N, r.FirstEr)
			}
			s := sortedCopy(r.Lat)
			p50s[i] = append(p50s[i], ms(quantile(s, 0.50)))
			p99s[i] = append(p99s[i], ms(quantile(s, 0.99)))
			rpss[i] = append(rpss[i], float64(len(s))/r.Elapsed.Seconds())
			rows[i].Errors += r.Errors
		}
	}
	for i, p := range paths {
		rows[i].Path, rows[i].P50, rows[i].P99, rows[i].RPS = p.name, summarize(p50s[i]), summarize(p99s[i]), summarize(rpss[i])
	}
	return rows, nil
}

// vipTable renders the rows as a markdown table.
func vipTable(rows []vipRow) string {
	var b strings.Builder
	b.WriteString("| path | p50 | p99 | requests/s | errors |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d |\n", r.Path, fmtStat(r.P50, "%.3f", " ms"), fmtStat(r.P99, "%.3f", " ms"),
			fmtStat(r.RPS, "%.0f", ""), r.Errors)
	}
	return b.String()
}

// runVIPClient makes n sequential GETs to url, each on a new connection,
// and prints a clientResult as JSON. It runs inside the caller's node
// namespace (and cgroup), started by runVIP.
func runVIPClient(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("vip-client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "target")
	n := fs.Int("n", 1000, "requests")
	function := fs.String("function", "default/echo", "function called")
	if err := fs.Parse(args); err != nil {
		return err
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	res := clientResult{N: *n}
	start := time.Now()
	for range *n {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url+"/vip", nil)
		if err != nil {
			return err
		}
		req.Header.Set("x-skipper-function", *function)
		t0 := time.Now()
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		if err != nil {
			if res.Errors++; res.FirstEr == "" {
				res.FirstEr = err.Error()
			}
			if res.Errors >= 5 && len(res.Lat) == 0 {
				break // the path does not work here; say so rather than wait out n timeouts
			}
			continue
		}
		res.Lat = append(res.Lat, time.Since(t0))
	}
	res.Elapsed = time.Since(start)
	return json.NewEncoder(stdout).Encode(res)
}
