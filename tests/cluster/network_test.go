package cluster

import (
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"skipper.dev/skipper/tests/linuxhost"
)

// testTopology never collides with a running cluster's names or routes.
func testTopology() Topology {
	return Topology{
		Bridge:       "sktest-br0",
		Gateway:      netip.MustParsePrefix("203.0.113.1/24"),
		NodeHostBase: 10,
		PodSupernet:  netip.MustParsePrefix("198.18.0.0/16"),
		ServiceCIDR:  netip.MustParsePrefix("198.19.254.0/24"),
		NetnsPrefix:  "sktest-node",
		VethPrefix:   "sktest-veth",
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, links and routes")
	}
}

// TestNetworkSetupTeardown builds a two-node network twice (re-runs must be
// safe), checks addresses, routes and traffic, and tears it down twice.
func TestNetworkSetupTeardown(t *testing.T) {
	requireRoot(t)
	top := testTopology()
	const nodes = 2
	// The root namespace's pod routes (198.18.<N>.0/24) would replace a
	// running cluster's.
	if _, err := netlink.LinkByName("skipper-br0"); err == nil {
		t.Skip("a local cluster runs (skipper-br0 exists): its pod routes would clash with this test's")
	}
	t.Cleanup(func() {
		if err := top.TeardownNetwork(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	for round := 0; round < 2; round++ { // the second round proves re-runs are safe
		if err := top.SetupNetwork(nodes); err != nil {
			t.Fatalf("round %d: setup: %v", round, err)
		}
	}
	checkNode(t, top, 1)
	checkNode(t, top, 2)

	// Traffic: a listener on the gateway answers a dial from node 1's netns,
	// and node 1 reaches node 2 through the forwarding bridge.
	ln, err := net.Listen("tcp4", top.Gateway.Addr().String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	err = linuxhost.InNetns(top.Netns(1), func() error {
		c, err := net.DialTimeout("tcp4", ln.Addr().String(), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 2)
		_, err = c.Read(buf)
		return err
	})
	if err != nil {
		t.Errorf("dial gateway from node 1: %v", err)
	}

	if err := top.TeardownNetwork(); err != nil {
		t.Fatalf("teardown: %v", err)
	}
	if err := top.TeardownNetwork(); err != nil {
		t.Fatalf("second teardown: %v", err)
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "sktest-") {
			t.Errorf("link %s left behind", l.Attrs().Name)
		}
	}
	if names, _ := top.NetnsNames(); len(names) > 0 {
		t.Errorf("netns left behind: %v", names)
	}
	routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
	for _, r := range routes {
		if r.Dst != nil && (top.PodSupernet.Contains(netip.MustParseAddr(r.Dst.IP.String())) ||
			r.Dst.String() == top.ServiceCIDR.String()) {
			t.Errorf("route %s left behind", r.Dst)
		}
	}
}

func checkNode(t *testing.T, top Topology, n int) {
	t.Helper()
	ns, err := netns.GetFromName(top.Netns(n))
	if err != nil {
		t.Fatalf("netns %s: %v", top.Netns(n), err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatalf("eth0 in %s: %v", top.Netns(n), err)
	}
	addrs, _ := h.AddrList(eth0, netlink.FAMILY_V4)
	var got []string
	for _, a := range addrs {
		got = append(got, a.IPNet.String())
	}
	want := top.NodeIP(n).String() + "/24"
	if !slices.Contains(got, want) {
		t.Errorf("node %d eth0 addresses %v, want %s", n, got, want)
	}
	routes, _ := h.RouteList(nil, netlink.FAMILY_V4)
	for _, r := range routes {
		if r.Dst == nil {
			t.Errorf("node %d has a default route via %s: nothing may leave the machine", n, r.Gw)
		}
	}
	if _, err := os.Stat(linuxhost.NetnsPath(top.Netns(n))); err != nil {
		t.Errorf("netns file: %v", err)
	}
	rs, err := netlink.RouteGet(net.IP(top.PodCIDR(n).Addr().Next().AsSlice()))
	if err != nil || len(rs) == 0 || !rs[0].Gw.Equal(net.IP(top.NodeIP(n).AsSlice())) {
		t.Errorf("root route to node %d pods: %v %v", n, rs, err)
	}
	if rs, err := netlink.RouteGet(net.IP(top.ServiceCIDR.Addr().Next().AsSlice())); err == nil {
		t.Errorf("service address routed (%v), want blackholed", rs)
	} else if !strings.Contains(err.Error(), "invalid argument") && err != unix.EINVAL {
		t.Logf("service route lookup: %v", err)
	}
}
