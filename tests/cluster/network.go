package cluster

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"skipper.dev/skipper/tests/linuxhost"
)

// SetupNetwork makes (or repairs) the bridge, node namespaces 1..nodes, their
// veth pairs, addresses and routes. Safe to re-run: existing pieces are
// reused or replaced.
func (t Topology) SetupNetwork(nodes int) error {
	if err := t.Validate(nodes); err != nil {
		return err
	}
	br, err := t.ensureBridge()
	if err != nil {
		return err
	}
	for n := 1; n <= nodes; n++ {
		if err := t.setupNode(n, br); err != nil {
			return fmt.Errorf("node %d network: %w", n, err)
		}
	}
	blackhole := &netlink.Route{Dst: linuxhost.PrefixNet(t.ServiceCIDR), Type: unix.RTN_BLACKHOLE}
	if err := netlink.RouteReplace(blackhole); err != nil {
		return fmt.Errorf("blackhole %s: %w", t.ServiceCIDR, err)
	}
	// Pods of one node reach another node's pods through the root namespace:
	// forward only what arrives on the bridge, and only when there is another
	// node to forward to. Node namespaces have no default route, so nothing
	// is forwarded off the machine.
	if nodes > 1 {
		if err := linuxhost.Sysctl("net/ipv4/conf/"+t.Bridge+"/forwarding", "1"); err != nil {
			return err
		}
	}
	return nil
}

func (t Topology) ensureBridge() (netlink.Link, error) {
	br, err := netlink.LinkByName(t.Bridge)
	if err != nil {
		if !linuxhost.IsLinkNotFound(err) {
			return nil, fmt.Errorf("bridge %s: %w", t.Bridge, err)
		}
		la := netlink.NewLinkAttrs()
		la.Name = t.Bridge
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("add bridge %s: %w", t.Bridge, err)
		}
		if br, err = netlink.LinkByName(t.Bridge); err != nil {
			return nil, fmt.Errorf("bridge %s: %w", t.Bridge, err)
		}
	}
	if br.Type() != "bridge" {
		return nil, fmt.Errorf("link %s exists and is a %s, not a bridge", t.Bridge, br.Type())
	}
	if err := netlink.AddrReplace(br, &netlink.Addr{IPNet: linuxhost.PrefixNet(t.Gateway)}); err != nil {
		return nil, fmt.Errorf("address %s on %s: %w", t.Gateway, t.Bridge, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("bridge %s up: %w", t.Bridge, err)
	}
	return br, nil
}

func (t Topology) setupNode(n int, br netlink.Link) error {
	ns, err := linuxhost.EnsureNetns(t.Netns(n))
	if err != nil {
		return err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", t.Netns(n), err)
	}
	defer h.Close()

	// A veth pair cannot be repaired in place after a crash (one end may be
	// gone, or in the wrong namespace): recreate it.
	if old, err := netlink.LinkByName(t.Veth(n)); err == nil {
		if err := netlink.LinkDel(old); err != nil {
			return fmt.Errorf("delete stale %s: %w", t.Veth(n), err)
		}
	}
	if old, err := h.LinkByName("eth0"); err == nil {
		if err := h.LinkDel(old); err != nil {
			return fmt.Errorf("delete stale eth0 in %s: %w", t.Netns(n), err)
		}
	}
	la := netlink.NewLinkAttrs()
	la.Name = t.Veth(n)
	la.MasterIndex = br.Attrs().Index
	veth := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", t.Veth(n), err)
	}
	host, err := netlink.LinkByName(t.Veth(n))
	if err != nil {
		return fmt.Errorf("veth %s: %w", t.Veth(n), err)
	}
	if err := netlink.LinkSetMaster(host, br); err != nil {
		return fmt.Errorf("veth %s on %s: %w", t.Veth(n), t.Bridge, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("veth %s up: %w", t.Veth(n), err)
	}

	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo in %s: %w", t.Netns(n), err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up in %s: %w", t.Netns(n), err)
	}
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0 in %s: %w", t.Netns(n), err)
	}
	nodeIP := netip.PrefixFrom(t.NodeIP(n), t.Gateway.Bits())
	if err := h.AddrReplace(eth0, &netlink.Addr{IPNet: linuxhost.PrefixNet(nodeIP)}); err != nil {
		return fmt.Errorf("address %s on eth0: %w", nodeIP, err)
	}
	if err := h.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("eth0 up in %s: %w", t.Netns(n), err)
	}
	gw := net.IP(t.Gateway.Addr().AsSlice())
	for _, dst := range []netip.Prefix{t.PodSupernet, t.ServiceCIDR} {
		r := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: linuxhost.PrefixNet(dst), Gw: gw}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s via %s in %s: %w", dst, gw, t.Netns(n), err)
		}
	}
	r := &netlink.Route{LinkIndex: br.Attrs().Index, Dst: linuxhost.PrefixNet(t.PodCIDR(n)), Gw: net.IP(t.NodeIP(n).AsSlice())}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("route %s via %s: %w", t.PodCIDR(n), t.NodeIP(n), err)
	}
	return nil
}

// TeardownNetwork removes every namespace, link and route the topology can
// have made, whatever the node count was. Processes still inside the node
// namespaces must be gone first (KillNetnsProcs). Missing pieces are fine.
func (t Topology) TeardownNetwork() error {
	var errs []error
	names, err := t.NetnsNames()
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range names {
		if err := linuxhost.DeleteNetns(name); err != nil {
			errs = append(errs, err)
		}
	}
	links, err := linuxhost.Dump(netlink.LinkList)
	if err != nil {
		errs = append(errs, fmt.Errorf("list links: %w", err))
	}
	for _, l := range links {
		name := l.Attrs().Name
		if name == t.Bridge || strings.HasPrefix(name, t.VethPrefix) {
			if err := netlink.LinkDel(l); err != nil && !linuxhost.IsLinkNotFound(err) {
				errs = append(errs, fmt.Errorf("delete link %s: %w", name, err))
			}
		}
	}
	// Routes through the bridge went with it; the blackhole and any pod route
	// left pointing elsewhere are removed explicitly.
	routes, err := linuxhost.Dump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("list routes: %w", err))
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, ok := linuxhost.NetipPrefix(r.Dst)
		if !ok {
			continue
		}
		ours := dst == t.ServiceCIDR.Masked() && r.Type == unix.RTN_BLACKHOLE ||
			t.PodSupernet.Contains(dst.Addr()) && dst.Bits() >= t.PodSupernet.Bits()
		if !ours {
			continue
		}
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", dst, err))
		}
	}
	return errors.Join(errs...)
}

// NetnsNames lists the named namespaces whose name starts with NetnsPrefix
// (the nodes' and, named after their node, the pods').
func (t Topology) NetnsNames() ([]string, error) { return linuxhost.NetnsNames(t.NetnsPrefix) }
