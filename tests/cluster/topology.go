package cluster

import (
	"fmt"
	"net/netip"
)

// Topology names the links, namespaces and addresses of the cluster network.
// DefaultTopology is the one in docs/architecture.md; tests use their own so
// they never collide with a running cluster.
type Topology struct {
	// Bridge is the bridge in the root network namespace.
	Bridge string
	// Gateway is the bridge's address and the node network (198.51.100.1/24).
	Gateway netip.Prefix
	// NodeHostBase: node N's IP is host number NodeHostBase+N in Gateway's network.
	NodeHostBase int
	// PodSupernet holds every node's pod CIDR; node N gets the /24 whose third
	// octet is N.
	PodSupernet netip.Prefix
	// ServiceCIDR is blackholed in the root namespace.
	ServiceCIDR netip.Prefix
	// NetnsPrefix + N names node N's network namespace (under /run/netns).
	NetnsPrefix string
	// VethPrefix + N names the root-namespace end of node N's veth pair.
	VethPrefix string
}

// DefaultTopology returns the addresses fixed by docs/architecture.md.
func DefaultTopology() Topology {
	return Topology{
		Bridge:       "skipper-br0",
		Gateway:      netip.MustParsePrefix("198.51.100.1/24"),
		NodeHostBase: 10,
		PodSupernet:  netip.MustParsePrefix("198.18.0.0/16"),
		ServiceCIDR:  netip.MustParsePrefix("198.19.0.0/16"),
		NetnsPrefix:  "skipper-node",
		VethPrefix:   "skipper-veth",
	}
}

// NodeName is node N's Kubernetes name.
func NodeName(n int) string { return fmt.Sprintf("node%d", n) }

// NodeIP is node N's address on the bridge.
func (t Topology) NodeIP(n int) netip.Addr {
	b := t.Gateway.Masked().Addr().As4()
	b[3] = byte(t.NodeHostBase + n)
	return netip.AddrFrom4(b)
}

// PodCIDR is node N's pod range.
func (t Topology) PodCIDR(n int) netip.Prefix {
	b := t.PodSupernet.Masked().Addr().As4()
	b[2] = byte(n)
	return netip.PrefixFrom(netip.AddrFrom4(b), 24)
}

// Netns is node N's network namespace name.
func (t Topology) Netns(n int) string { return fmt.Sprintf("%s%d", t.NetnsPrefix, n) }

// Veth is the root-namespace end of node N's veth pair.
func (t Topology) Veth(n int) string { return fmt.Sprintf("%s%d", t.VethPrefix, n) }

// Validate checks the topology can hold nodes 1..nodes.
func (t Topology) Validate(nodes int) error {
	switch {
	case nodes < 1 || nodes > 99:
		return fmt.Errorf("nodes %d: want 1..99", nodes)
	case !t.Gateway.Addr().Is4() || t.Gateway.Bits() != 24:
		return fmt.Errorf("gateway %s: want an IPv4 /24", t.Gateway)
	case t.NodeHostBase+nodes > 254:
		return fmt.Errorf("node host base %d + %d nodes leaves the /24", t.NodeHostBase, nodes)
	case !t.PodSupernet.Addr().Is4() || t.PodSupernet.Bits() != 16:
		return fmt.Errorf("pod supernet %s: want an IPv4 /16", t.PodSupernet)
	case len(t.Veth(nodes)) > 15 || len(t.Bridge) > 15:
		return fmt.Errorf("link names %q/%q longer than 15 bytes", t.Veth(nodes), t.Bridge)
	}
	return nil
}
