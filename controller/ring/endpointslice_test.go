package ring

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func ptr[T any](v T) *T { return &v }

func TestMembersFromEndpointSlices(t *testing.T) {
	t.Parallel()
	port := func(name string, p int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: &name, Port: &p}
	}
	ep := func(ready, terminating *bool, addrs ...string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: ready, Terminating: terminating}}
	}
	grpc := []discoveryv1.EndpointPort{port("grpc", 9090)}
	tests := []struct {
		name   string
		slices []*discoveryv1.EndpointSlice
		want   []string
	}{
		{name: "none", want: nil},
		{
			name: "ready and unset are members, not ready and terminating are not",
			slices: []*discoveryv1.EndpointSlice{{Ports: grpc, Endpoints: []discoveryv1.Endpoint{
				ep(ptr(true), nil, "198.18.1.5"),
				ep(nil, nil, "198.18.1.6"),
				ep(ptr(false), nil, "198.18.1.7"),
				ep(ptr(true), ptr(true), "198.18.1.8"),
			}}},
			want: []string{"198.18.1.5:9090", "198.18.1.6:9090"},
		},
		{
			name: "several slices, duplicates merged, sorted",
			slices: []*discoveryv1.EndpointSlice{
				{Ports: grpc, Endpoints: []discoveryv1.Endpoint{ep(ptr(true), nil, "198.18.1.9")}},
				{Ports: grpc, Endpoints: []discoveryv1.Endpoint{ep(ptr(true), nil, "198.18.1.2"), ep(ptr(true), nil, "198.18.1.9")}},
			},
			want: []string{"198.18.1.2:9090", "198.18.1.9:9090"},
		},
		{
			name:   "only the first address of an endpoint",
			slices: []*discoveryv1.EndpointSlice{{Ports: grpc, Endpoints: []discoveryv1.Endpoint{ep(nil, nil, "198.18.2.2", "198.18.2.1")}}},
			want:   []string{"198.18.2.2:9090"},
		},
		{
			name:   "endpoint without addresses skipped",
			slices: []*discoveryv1.EndpointSlice{{Ports: grpc, Endpoints: []discoveryv1.Endpoint{ep(nil, nil)}}},
			want:   nil,
		},
		{
			name:   "slice without ports contributes nothing",
			slices: []*discoveryv1.EndpointSlice{{Endpoints: []discoveryv1.Endpoint{ep(ptr(true), nil, "198.18.1.5")}}},
			want:   nil,
		},
		{
			name:   "IPv6 addresses are bracketed",
			slices: []*discoveryv1.EndpointSlice{{Ports: grpc, Endpoints: []discoveryv1.Endpoint{ep(nil, nil, "fd00::5")}}},
			want:   []string{"[fd00::5]:9090"},
		},
		{
			name: "named port preferred over the first",
			slices: []*discoveryv1.EndpointSlice{{
				Ports:     []discoveryv1.EndpointPort{port("http", 9091), port("grpc", 9090)},
				Endpoints: []discoveryv1.Endpoint{ep(nil, nil, "198.18.1.5")},
			}},
			want: []string{"198.18.1.5:9090"},
		},
		{
			name: "first port when none has the name",
			slices: []*discoveryv1.EndpointSlice{{
				Ports:     []discoveryv1.EndpointPort{port("", 7000)},
				Endpoints: []discoveryv1.Endpoint{ep(ptr(true), nil, "198.18.2.2")},
			}},
			want: []string{"198.18.2.2:7000"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, MembersFromEndpointSlices(tt.slices, PortName)); diff != "" {
				t.Errorf("members (-want +got):\n%s", diff)
			}
		})
	}
}
