package noderouter

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/callers"
)

func callerPod(name, sa, ip string, mod ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "app", Image: "app"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
	for _, m := range mod {
		m(p)
	}
	return p
}

func TestCallerOf(t *testing.T) {
	t.Parallel()
	ip := netip.MustParseAddr("10.1.0.5")
	for _, tt := range []struct {
		name string
		pod  *corev1.Pod
		sa   string
		want []netip.Addr
	}{
		{"running", callerPod("a", "web", "10.1.0.5"), "web", []netip.Addr{ip}},
		{"no service account: default", callerPod("a", "", "10.1.0.5"), "default", []netip.Addr{ip}},
		{"podIP only", callerPod("a", "web", "10.1.0.5", func(p *corev1.Pod) { p.Status.PodIPs = nil }), "web", []netip.Addr{ip}},
		{"host network: the node's address names no pod", callerPod("a", "web", "10.1.0.5", func(p *corev1.Pod) { p.Spec.HostNetwork = true }), "web", nil},
		{"finished: its IP may be reused", callerPod("a", "web", "10.1.0.5", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), "web", nil},
		{"no IP yet", callerPod("a", "web", "", func(p *corev1.Pod) { p.Status.PodIPs = nil }), "web", nil},
	} {
		id, ips := callerOf(tt.pod)
		if id.Namespace != "team-a" || id.ServiceAccount != tt.sa || id.Pod != "team-a/a" || len(ips) != len(tt.want) || (len(ips) > 0 && ips[0] != tt.want[0]) {
			t.Errorf("%s: %+v %v", tt.name, id, ips)
		}
	}
	slim, _ := slimPod(callerPod("a", "web", "10.1.0.5"))
	if p := slim.(*corev1.Pod); len(p.Spec.Containers) != 0 || p.Spec.ServiceAccountName != "web" || p.Status.PodIP != "10.1.0.5" || p.UID != "uid-a" {
		t.Errorf("slimPod kept %+v", p)
	}
}

func TestWatchCallers(t *testing.T) {
	t.Parallel()
	cs := fake.NewClientset(callerPod("a", "web", "10.1.0.5"))
	var idx callers.Index
	synced := make(chan struct{})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { done <- watchPods(ctx, cs, &idx, nil, slog.New(slog.DiscardHandler), func() { close(synced) }) }()
	<-synced
	if id, ok := idx.Lookup(netip.MustParseAddr("10.1.0.5")); !ok || id.ServiceAccount != "web" {
		t.Fatalf("after the first list: %+v %v", id, ok)
	}
	if err := cs.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), "team-a", "a"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, pollInterval, "the deleted pod unindexed", func(context.Context) error {
		return poll.Unmet(idx.Len() == 0, "%d pods indexed", idx.Len())
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("watchPods: %v", err)
	}
}
