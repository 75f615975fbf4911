package noderouter

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestMembersFromSlices(t *testing.T) {
	ptr := func(v bool) *bool { return &v }
	port := func(name string, p int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: &name, Port: &p}
	}
	ep := func(ready *bool, ips ...string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: ips, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
	}
	tests := []struct {
		name   string
		slices []*discoveryv1.EndpointSlice
		want   []string
	}{
		{"none", nil, nil},
		{"ready, unready and unset", []*discoveryv1.EndpointSlice{{
			Ports:     []discoveryv1.EndpointPort{port("http", 9091), port("grpc", 9090)},
			Endpoints: []discoveryv1.Endpoint{ep(ptr(true), "198.18.1.5"), ep(ptr(false), "198.18.1.6"), ep(nil, "198.18.1.7")},
		}}, []string{"198.18.1.5:9090", "198.18.1.7:9090"}},
		{"first port when none is named grpc; duplicates across slices", []*discoveryv1.EndpointSlice{
			{Ports: []discoveryv1.EndpointPort{port("", 7000)}, Endpoints: []discoveryv1.Endpoint{ep(ptr(true), "198.18.2.2")}},
			{Ports: []discoveryv1.EndpointPort{port("grpc", 7000)}, Endpoints: []discoveryv1.Endpoint{ep(ptr(true), "198.18.2.2", "198.18.2.1")}},
		}, []string{"198.18.2.1:7000", "198.18.2.2:7000"}},
		{"no ports", []*discoveryv1.EndpointSlice{{Endpoints: []discoveryv1.Endpoint{ep(nil, "198.18.1.5")}}}, nil},
		{"ipv6", []*discoveryv1.EndpointSlice{{
			Ports: []discoveryv1.EndpointPort{port("grpc", 9090)}, Endpoints: []discoveryv1.Endpoint{ep(nil, "fd00::5")},
		}}, []string{"[fd00::5]:9090"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, membersFromSlices(tt.slices, "grpc")); diff != "" {
				t.Errorf("members (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWatchMembers(t *testing.T) {
	ready := true
	name, port := "grpc", int32(9090)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "skipper-controller-abc", Namespace: "skipper-system",
			Labels: map[string]string{discoveryv1.LabelServiceName: "skipper-controller"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"198.18.1.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
	other := slice.DeepCopy()
	other.Name, other.Labels = "someone-else", map[string]string{discoveryv1.LabelServiceName: "other"}
	other.Endpoints[0].Addresses = []string{"198.18.9.9"}
	cs := fake.NewClientset(slice, other)

	got := make(chan []string, 16)
	synced := make(chan struct{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- watchMembers(ctx, cs, "skipper-system", "skipper-controller", "grpc", slog.New(slog.DiscardHandler),
			func(m []string) {
				select {
				case got <- m:
				case <-ctx.Done():
				}
			}, func() { close(synced) })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watchMembers: %v", err)
		}
	}()
	<-synced
	waitMembers(t, got, []string{"198.18.1.5:9090"})

	notReady := false
	slice.Endpoints[0].Conditions.Ready = &notReady
	if _, err := cs.DiscoveryV1().EndpointSlices("skipper-system").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, got, nil)
}

func waitMembers(t *testing.T, got <-chan []string, want []string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m := <-got:
			if cmp.Equal(want, m) {
				return
			}
		case <-timeout:
			t.Fatalf("members never became %v", want)
		}
	}
}
