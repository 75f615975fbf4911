package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"skipper.dev/skipper/tests/cluster"
)

// env is the cluster the tests run against.
var env struct {
	root           string
	kubeconfig     string
	routerURL      string
	routerMetrics  string
	controllerURLs []string
	kube           kubernetes.Interface
	dyn            dynamic.Interface
}

// upTimeout bounds a cluster start (the binaries are built by make first).
const upTimeout = 5 * time.Minute

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	env.root = root
	stop, err := attachOrStart(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer stop()
	if err := loadEnv(filepath.Join(root, ".skipper", "env")); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	return m.Run()
}

func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.HasPrefix(string(b), "module skipper.dev/skipper\n") {
			return d, nil
		}
	}
	return "", fmt.Errorf("no skipper.dev/skipper go.mod above %s", wd)
}

// attachOrStart uses the running cluster when .skipper/env answers, or
// starts one and returns the function that stops it.
func attachOrStart(root string) (func(), error) {
	if e, err := cluster.ReadEnv(filepath.Join(root, ".skipper", "env")); err == nil && routerAnswers(e["ROUTER_URL"]) {
		return func() {}, nil
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("no local cluster runs and starting one needs root (sudo make e2e)")
	}
	bin := filepath.Join(root, "bin", "skipper-cluster")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s missing: run make build kube first (make e2e does): %w", bin, err)
	}
	cmd := exec.Command(bin, "up")
	cmd.Dir = root
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s up: %w", bin, err)
	}
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(os.Stderr, "cluster:", line)
			if strings.HasPrefix(line, "skipper: ready") {
				ready <- nil
				_, _ = io.Copy(os.Stderr, out)
				return
			}
		}
		ready <- errors.New("skipper-cluster up exited before it was ready")
	}()
	select {
	case err := <-ready:
		if err != nil {
			stop()
			return nil, err
		}
		return stop, nil
	case <-time.After(upTimeout):
		stop()
		return nil, fmt.Errorf("cluster not ready within %s", upTimeout)
	}
}

func routerAnswers(url string) bool {
	if url == "" {
		return false
	}
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url + "/")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

func loadEnv(path string) error {
	e, err := cluster.ReadEnv(path)
	if err != nil {
		return fmt.Errorf("read cluster env: %w", err)
	}
	for _, k := range []string{"KUBECONFIG", "ROUTER_URL", "ROUTER_METRICS_URL", "CONTROLLER_METRICS_URLS"} {
		if e[k] == "" {
			return fmt.Errorf("%s: %s is not set", path, k)
		}
	}
	env.kubeconfig = e["KUBECONFIG"]
	env.routerURL = e["ROUTER_URL"]
	env.routerMetrics = e["ROUTER_METRICS_URL"]
	env.controllerURLs = strings.Fields(e["CONTROLLER_METRICS_URLS"])
	cfg, err := clientcmd.BuildConfigFromFlags("", e["KUBECONFIG"])
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	if env.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	env.dyn, err = dynamic.NewForConfig(cfg)
	return err
}

// metricSum scrapes url and sums the samples of metric whose labels include
// every pair in match; the metric must be exported.
func metricSum(t *testing.T, url, metric string, match map[string]string) float64 {
	t.Helper()
	fam, ok := scrape(t, url)[metric]
	if !ok {
		t.Fatalf("%s does not export %s", url, metric)
	}
	return sumFamily(fam, match)
}

// counterSum is metricSum for a labelled counter whose series appear on
// first use: a metric not exported yet counts as zero.
func counterSum(t *testing.T, url, metric string, match map[string]string) float64 {
	t.Helper()
	return sumFamily(scrape(t, url)[metric], match)
}

// sumFamily sums the samples of fam (nil: none) whose labels include every
// pair in match.
func sumFamily(fam *dto.MetricFamily, match map[string]string) float64 {
	var sum float64
next:
	for _, m := range fam.GetMetric() {
		for k, v := range match {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

// scrape returns the metric families url exports, by name.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// eventually polls cond every 100ms until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for {
		if last = cond(ctx); last == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %s: %v", what, timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
