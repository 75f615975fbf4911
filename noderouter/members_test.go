package noderouter

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/google/go-cmp/cmp"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"skipper.dev/skipper/internal/poll"
)

func TestWatchMembers(t *testing.T) {
	t.Parallel()
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
	// members is a poll.Until condition: the updates so far include want.
	var last []string
	members := func(want []string) func(context.Context) error {
		return func(context.Context) error {
			for {
				select {
				case last = <-got:
					if cmp.Equal(want, last) {
						return nil
					}
				default:
					return fmt.Errorf("members %v", last)
				}
			}
		}
	}
	poll.Until(t, pollTimeout, pollInterval, "the ready member", members([]string{"198.18.1.5:9090"}))

	notReady := false
	slice.Endpoints[0].Conditions.Ready = &notReady
	if _, err := cs.DiscoveryV1().EndpointSlices("skipper-system").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, pollTimeout, pollInterval, "no member", members(nil))
}
