package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"skipper.dev/skipper/tests/attach"
	"skipper.dev/skipper/tests/cluster"
)

// env is the cluster the tests run against.
var env struct {
	root          string
	kubeconfig    string
	routerURL     string
	routerMetrics string
	image         string // the Skipper image the nodes pull (SKIPPER_CLUSTER_IMAGE)
	testPodImage  string // the e2e tests' pod image (SKIPPER_CLUSTER_TESTPOD_IMAGE)
	kube          kubernetes.Interface
	dyn           dynamic.Interface
}

// upTimeout bounds a cluster start (the binaries are built by make first).
const upTimeout = 5 * time.Minute

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, err := attach.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	env.root = root
	stop, err := attach.OrStart(root, upTimeout)
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

func loadEnv(path string) error {
	e, err := cluster.ReadEnv(path)
	if err != nil {
		return fmt.Errorf("read cluster env: %w", err)
	}
	for _, k := range []string{"KUBECONFIG", "ROUTER_URL", "ROUTER_METRICS_URL", "CONTROLLER_METRICS_URLS", "SKIPPER_CLUSTER_TESTPOD_IMAGE"} {
		if e[k] == "" {
			return fmt.Errorf("%s: %s is not set", path, k)
		}
	}
	env.kubeconfig = e["KUBECONFIG"]
	env.routerURL = e["ROUTER_URL"]
	env.routerMetrics = e["ROUTER_METRICS_URL"]
	env.image = cluster.ImageFromEnv(e)
	env.testPodImage = e["SKIPPER_CLUSTER_TESTPOD_IMAGE"]
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
// every pair in match.
func metricSum(t *testing.T, url, metric string, match map[string]string) float64 {
	t.Helper()
	v, err := attach.MetricSum(url, metric, match)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// counterSum is metricSum for a labelled counter whose series appear on
// first use: not exported yet counts as zero.
func counterSum(t *testing.T, url, metric string, match map[string]string) float64 {
	t.Helper()
	v, err := attach.CounterSum(url, metric, match)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// pollInterval is how often the suites' poll.Until calls a condition.
const pollInterval = 100 * time.Millisecond
