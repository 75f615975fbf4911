// Package routertest holds the helpers the router's tests share: package
// noderouter's, which run a whole router against a fake controller, and
// package dataplane's, which run the proxy alone. Only tests import it.
package routertest

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/cmd/skipper-echo/echo"
	"skipper.dev/skipper/controller/api/v1alpha1"
)

// Counter is c's value.
func Counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// Value sums the series of the metric name in g whose labels include
// labels (name, value pairs): a counter's or gauge's value, a histogram's
// count of samples. 0 when none.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// CallerRefusal is a controller's PermissionDenied of a caller, with its
// ErrorInfo of domain skipper.dev (reason caller_unknown or
// caller_denied).
func CallerRefusal(reason string) error {
	st, _ := status.New(codes.PermissionDenied, reason+": refused").WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "skipper.dev"})
	return st.Err()
}

// ErrorBody is the JSON body of the router's own answers.
type ErrorBody struct {
	Error    string `json:"error"`
	Reason   string `json:"reason"`
	Function string `json:"function,omitempty"`
}

// Listen listens on a free loopback port.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// DeadAddress is a loopback address that refuses connections for the
// test's life: a socket bound to it that never listens holds the port, so
// no listener the test starts later (the router's own) can be given it.
func DeadAddress(t testing.TB) string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*unix.SockaddrInet4).Port))
}

// UpgradeEcho serves an instance that answers an Upgrade to skipper-test
// with 101 and echoes bytes both ways, and returns its address.
func UpgradeEcho(t testing.TB) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "skipper-test" {
			http.Error(w, "want an upgrade", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: skipper-test\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		_, _ = io.Copy(conn, brw)
	}))
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().String()
}

// WarmPoolPod is a ready, unclaimed pool pod at addr (host:port).
func WarmPoolPod(t testing.TB, uid, addr string, opts ...func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-" + uid, Namespace: "default", UID: types.UID(uid),
			Labels: map[string]string{v1alpha1.LabelPool: "echo"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "echo", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(n)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: host,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// ConnEcho is the real echo handler as pod uid, recording which
// connection (the caller's address) each request came on.
type ConnEcho struct {
	Addr string
	mu   sync.Mutex
	reqs []string // "path from"
	conn map[string]int
}

// StartConnEcho serves a ConnEcho as pod uid.
func StartConnEcho(t testing.TB, uid string) *ConnEcho {
	t.Helper()
	cfg := echo.DefaultConfig()
	cfg.PodUID, cfg.PodName = uid, "pod-"+uid
	h := echo.NewServer(cfg, slog.New(slog.DiscardHandler))
	e := &ConnEcho{conn: map[string]int{}}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.reqs = append(e.reqs, r.URL.Path+" "+r.RemoteAddr)
		e.conn[r.RemoteAddr]++
		e.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	e.Addr = ts.Listener.Addr().String()
	return e
}

// Requests are the requests seen ("path from") and how many connections
// they came on.
func (e *ConnEcho) Requests() ([]string, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.reqs...), len(e.conn)
}
