package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"skipper.dev/skipper/noderouter"
	"skipper.dev/skipper/tests/attach"
	"skipper.dev/skipper/tests/cluster"
)

// upTimeout bounds a cluster start.
const upTimeout = 5 * time.Minute

// env is the cluster and the in-process router the tests use.
var env struct {
	rest      *rest.Config // the cluster admin's
	kube      kubernetes.Interface
	dyn       dynamic.Interface
	routerURL string // the in-process router's data plane
	metrics   string // its /metrics
	image     string // the Skipper image the nodes pull (SKIPPER_CLUSTER_IMAGE)
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	root, err := attach.RepoRoot()
	if err != nil {
		return fail(err)
	}
	stop, err := attach.OrStart(root, upTimeout)
	if err != nil {
		return fail(err)
	}
	defer stop()
	e, err := cluster.ReadEnv(filepath.Join(root, ".skipper", "env"))
	if err != nil {
		return fail(fmt.Errorf("read cluster env: %w", err))
	}
	kubeconfig := e["KUBECONFIG"]
	env.image = cluster.ImageFromEnv(e)
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fail(fmt.Errorf("kubeconfig: %w", err))
	}
	env.rest = cfg
	if env.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return fail(err)
	}
	if env.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return fail(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done, err := startRouter(ctx, kubeconfig)
	if err != nil {
		cancel()
		return fail(err)
	}
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		return fail(fmt.Errorf("router: %w", err))
	}
	return code
}

// startRouter runs noderouter.Run in process as a router of node1 (on
// loopback; no node-local address, no BPF), ring from the controllers'
// EndpointSlices, and waits until it is ready. Its log goes to a file
// named on stderr.
func startRouter(ctx context.Context, kubeconfig string) (<-chan error, error) {
	data, err := freePort()
	if err != nil {
		return nil, err
	}
	admin, err := freePort()
	if err != nil {
		return nil, err
	}
	log, err := os.CreateTemp("", "skipper-integration-router-*.log")
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(os.Stderr, "integration: router log", log.Name())
	var b [4]byte
	_, _ = rand.Read(b[:])
	podName := "integration-router-" + hex.EncodeToString(b[:])
	tokenFile, cleanup, err := routerIdentity(ctx, env.kube, podName, env.image)
	if err != nil {
		return nil, err
	}
	args := []string{
		"--listen", data, "--admin-listen", admin, "--token-file", tokenFile,
		"--node-name", "node1", "--pod-name", podName, "--pod-namespace", "skipper-system",
		"--kubeconfig", kubeconfig,
		"--local-address=", "--bpf=off", "--cgroup-root=/skipper",
		"--report-interval", "200ms", "--drain-delay=0", "--shutdown-timeout", "10s",
		"--log-level", "debug",
	}
	done := make(chan error, 1)
	go func() {
		defer log.Close()
		err := noderouter.Run(ctx, args, os.LookupEnv, log)
		cleanup() // ctx has ended: the renewals stop, the identity pod goes
		done <- err
	}()
	env.routerURL = "http://" + data
	env.metrics = "http://" + admin + "/metrics"
	c := http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.Get("http://" + admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return done, nil
			}
		}
		select {
		case err := <-done:
			return nil, fmt.Errorf("router exited before it was ready: %w", err)
		default:
		}
		if time.Now().After(deadline) {
			return nil, errors.New("router not ready within 30s")
		}
		time.Sleep(50 * time.Millisecond) // sleep: poll (TestMain has no t for poll.Until)
	}
}

// freePort returns a loopback address nothing listens on now.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return "127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), nil
}

// metric sums a metric of the in-process router.
func metric(t *testing.T, name string, match map[string]string) float64 {
	t.Helper()
	v, err := attach.MetricSum(env.metrics, name, match)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
