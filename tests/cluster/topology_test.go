package cluster

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTopology(t *testing.T) {
	top := DefaultTopology()
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"node 1 IP", top.NodeIP(1).String(), "198.51.100.11"},
		{"node 3 IP", top.NodeIP(3).String(), "198.51.100.13"},
		{"node 1 pods", top.PodCIDR(1).String(), "198.18.1.0/24"},
		{"node 2 pods", top.PodCIDR(2).String(), "198.18.2.0/24"},
		{"netns", top.Netns(1), "skipper-node1"},
		{"veth", top.Veth(1), "skipper-veth1"},
		{"node name", NodeName(1), "node1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if err := top.Validate(1); err != nil {
		t.Errorf("Validate(1): %v", err)
	}
	if err := top.Validate(0); err == nil {
		t.Errorf("Validate(0): want an error")
	}
}
