package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"skipper.dev/skipper/internal/poll"
)

// promQuery is one query of skipper-promql --queries.
type promQuery struct {
	Where, Query, Kind string
}

// A real Prometheus (Debian's package, installed by .ci/install) scrapes
// the local cluster's controllers and routers under demo load, and every
// dashboard query returns data; every alert expression evaluates.
func TestPrometheusScrapesDashboardQueries(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not installed (make deps installs Debian's package): %v", err)
	}
	mon := filepath.Join(env.root, "deploy", "monitoring")
	out, err := exec.Command(filepath.Join(env.root, "bin", "skipper-promql"), "--queries",
		filepath.Join(mon, "skipper-dashboard.json"), filepath.Join(mon, "alerts.yaml")).Output()
	if err != nil {
		t.Fatalf("skipper-promql --queries: %v", err)
	}
	var queries []promQuery
	if err := json.Unmarshal(out, &queries); err != nil {
		t.Fatal(err)
	}

	// Targets: every controller pod and every router, as PodMonitors would
	// find them (pod label on controllers; routers carry their node label).
	ctx := t.Context()
	var static []string
	for _, sel := range []struct{ label, port, job string }{
		{"app.kubernetes.io/name=skipper-controller", "9091", "skipper-controller"},
		{"app.kubernetes.io/name=skipper-noderouter", "8381", "skipper-noderouter"},
	} {
		pods, err := env.kube.CoreV1().Pods("skipper-system").List(ctx, metav1.ListOptions{LabelSelector: sel.label})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.Status.PodIP == "" {
				continue
			}
			static = append(static, fmt.Sprintf("  - job_name: %s-%s\n    scrape_interval: 1s\n    static_configs:\n      - targets: ['%s']\n        labels: {pod: %s, namespace: skipper-system}\n",
				sel.job, p.Name, net.JoinHostPort(p.Status.PodIP, sel.port), p.Name))
		}
	}
	if len(static) < 3 {
		t.Fatalf("found %d controller and router pods to scrape", len(static))
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"+strings.Join(static, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.CommandContext(ctx, bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	// When the test ends (ctx is done): SIGTERM, then SIGKILL if it has
	// not stopped within 20 s.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Wait() })
	api := "http://" + addr + "/api/v1/"
	get := func(ctx context.Context, path string, v url.Values) (json.RawMessage, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, api+path+"?"+v.Encode(), nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var r struct {
			Status string          `json:"status"`
			Error  string          `json:"error"`
			Data   json.RawMessage `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if r.Status != "success" {
			return nil, fmt.Errorf("%s: %s", path, r.Error)
		}
		return r.Data, nil
	}
	instant := func(ctx context.Context, q string) (int, error) {
		d, err := get(ctx, "query", url.Values{"query": {q}})
		if err != nil {
			return 0, err
		}
		var res struct {
			Result []json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(d, &res); err != nil {
			return 0, err
		}
		return len(res.Result), nil
	}
	poll.Until(t, time.Minute, pollInterval, "every target up", func(ctx context.Context) error {
		n, err := instant(ctx, "up == 1")
		if err != nil {
			return err
		}
		if n != len(static) {
			return fmt.Errorf("%d of %d targets up", n, len(static))
		}
		return nil
	})

	// Demo load, with some 5xx so the error ratio has a numerator, spread
	// over a few scrapes so rates have two samples.
	for i := range 40 {
		path := "/hello"
		if i%10 == 0 {
			path = "/hello?status=503"
		}
		if code, body := call(t, "default/echo", path); code >= 500 && !strings.Contains(path, "status") {
			t.Fatalf("demo call: %d %s", code, body)
		}
		time.Sleep(100 * time.Millisecond) // sleep: load (10 calls/s over 4 s, spread over a few scrapes)
	}

	// Rates need two samples in their window: poll until every panel and
	// variable query has data, then report those that never had.
	poll.Until(t, 45*time.Second, time.Second, "data for every panel and variable query", func(context.Context) error {
		var missing []string
		for _, q := range queries {
			expr := q.Query
			if q.Kind == "variable" {
				if expr = labelValuesMetric(q.Query); expr == "" {
					t.Fatalf("%s: %q is not label_values(metric, label)", q.Where, q.Query)
				}
			}
			n, err := instant(ctx, expr)
			switch {
			case err != nil:
				t.Fatalf("%s: %v", q.Where, err)
			case n == 0 && q.Kind != "rule": // alert expressions are empty unless firing
				missing = append(missing, fmt.Sprintf("%s: %s", q.Where, expr))
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("no data:\n%s", strings.Join(missing, "\n"))
		}
		return nil
	})
}

// labelValuesMetric returns the metric of a Grafana label_values(metric,
// label) query, or "".
func labelValuesMetric(q string) string {
	inner, ok := strings.CutPrefix(strings.TrimSpace(q), "label_values(")
	if !ok {
		return ""
	}
	m, _, ok := strings.Cut(inner, ",")
	if !ok {
		return ""
	}
	return strings.TrimSpace(m)
}
