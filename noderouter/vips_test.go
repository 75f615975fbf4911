package noderouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"skipper.dev/skipper/bpf"
)

func TestServiceVIPs(t *testing.T) {
	t.Parallel()
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name string
		svc  *corev1.Service
		want []netip.AddrPort
	}{
		{"nil", nil, nil},
		{"one IP one port", &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "198.19.0.10",
			Ports: []corev1.ServicePort{{Port: 80}}}}, []netip.AddrPort{ap("198.19.0.10:80")}},
		{"dual stack, UDP skipped, sorted", &corev1.Service{Spec: corev1.ServiceSpec{ClusterIPs: []string{"fd00::1", "198.19.0.10"},
			Ports: []corev1.ServicePort{{Port: 8080, Protocol: corev1.ProtocolTCP}, {Port: 53, Protocol: corev1.ProtocolUDP}, {Port: 80}}}},
			[]netip.AddrPort{ap("198.19.0.10:80"), ap("198.19.0.10:8080")}},
		{"headless", &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "None", Ports: []corev1.ServicePort{{Port: 80}}}}, nil},
		{"no ports", &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "198.19.0.10"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, serviceVIPs(tc.svc), cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestResolveCgroup(t *testing.T) {
	t.Parallel()
	cg2 := map[string]bool{"/sys/fs/cgroup/unified": true, "/sys/fs/cgroup/unified/skipper/node1": true, "/host/cgroup": true}
	isCG2 := func(d string) bool { return cg2[filepath.Clean(d)] }
	mount := func() (string, error) { return "/sys/fs/cgroup/unified", nil }
	noMount := func() (string, error) { return "", errors.New("no cgroup2 filesystem mounted") }
	for _, tc := range []struct {
		name, flag string
		mount      func() (string, error)
		want       string
		wantErr    bool
	}{
		{"empty: the mount", "", mount, "/sys/fs/cgroup/unified", false},
		{"relative: under the mount", "skipper/node1", mount, "/sys/fs/cgroup/unified/skipper/node1", false},
		{"relative, missing", "skipper/node9", mount, "", true},
		{"absolute cgroup2", "/host/cgroup", mount, "/host/cgroup", false},
		{"absolute hybrid root: its unified", "/sys/fs/cgroup", mount, "/sys/fs/cgroup/unified", false},
		{"absolute, not cgroup2", "/tmp", mount, "", true},
		{"no mount", "", noMount, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveCgroup(tc.flag, tc.mount, isCG2)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("resolveCgroup(%q) = %q, %v; want %q, error %v", tc.flag, got, err, tc.want, tc.wantErr)
			}
		})
	}
	// The real machine: whatever /proc/self/mountinfo says, the mount itself is
	// cgroup2 and a temporary directory is not.
	if m, err := resolveCgroup("", bpf.Cgroup2Mount, isCgroup2); err != nil || !isCgroup2(m) {
		t.Errorf("real cgroup2 mount: %q, %v", m, err)
	}
	if isCgroup2(t.TempDir()) {
		t.Error("a temporary directory reported as cgroup2")
	}
}

// watchServiceVIPs follows one named Service: created, changed, deleted.
// (The e2e suite runs it against the real API server with the Role of
// deploy/base, which grants list and watch of that one name.)
func TestWatchServiceVIPs(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "skipper-system"},
		Spec:       corev1.ServiceSpec{ClusterIP: "198.19.0.99", Ports: []corev1.ServicePort{{Port: 80}}},
	})
	got := make(chan []netip.AddrPort, 8)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- watchServiceVIPs(ctx, cs, "skipper-system", "skipper", slog.New(slog.DiscardHandler), func(v []netip.AddrPort) { got <- v })
	}()
	next := func(want string) {
		t.Helper()
		select {
		case v := <-got:
			if fmt.Sprint(v) != want {
				t.Errorf("VIPs = %v, want %s", v, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no VIP update; want %s", want)
		}
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "skipper", Namespace: "skipper-system"},
		Spec:       corev1.ServiceSpec{ClusterIP: "198.19.0.10", Ports: []corev1.ServicePort{{Port: 80}}},
	}
	if _, err := cs.CoreV1().Services("skipper-system").Create(t.Context(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	next("[198.19.0.10:80]")
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "alt", Port: 8080})
	if _, err := cs.CoreV1().Services("skipper-system").Update(t.Context(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	next("[198.19.0.10:80 198.19.0.10:8080]")
	if err := cs.CoreV1().Services("skipper-system").Delete(t.Context(), "skipper", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next("[]")
	cancel()
	if err := <-done; err != nil {
		t.Errorf("watch ended with %v", err)
	}
}
