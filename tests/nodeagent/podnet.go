package nodeagent

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"syscall"

	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/tests/linuxhost"
)

// podBridge is the bridge in the node's network namespace whose ports are
// the pods' veths (kubenet's cbr0); it holds the pod CIDR's first address,
// the pods' default gateway (the address IPAM never hands out).
const podBridge = "cbr0"

// podNet wires pods into the node as the CNI bridge plugin does: each pod
// gets a named network namespace <Prefix><pod UID> whose eth0 is one end of
// a veth pair, the other end a port of podBridge in the agent's (the node's)
// namespace, with the pod's IP and a default route via the gateway. All
// methods act on the calling process's network namespace as the node's.
type podNet struct {
	CIDR   netip.Prefix
	Prefix string
}

func (n podNet) gateway() netip.Prefix {
	return netip.PrefixFrom(n.CIDR.Masked().Addr().Next(), n.CIDR.Bits())
}

// Netns is the pod's network namespace name.
func (n podNet) Netns(uid types.UID) string { return n.Prefix + string(uid) }

// VethName is the node end of the pod's veth pair in the node's namespace
// (15 bytes at most).
func VethName(uid types.UID) string {
	h := fnv.New32a()
	h.Write([]byte(uid))
	return fmt.Sprintf("veth%08x", h.Sum32())
}

// bridgeMAC is fixed so the gateway's MAC never changes under the pods (a
// bridge without a set address takes its lowest port's, which moves as pods
// come and go and leaves stale neighbour entries behind).
func (n podNet) bridgeMAC() net.HardwareAddr {
	a := n.gateway().Addr().As4()
	return net.HardwareAddr{0x02, 0x53, a[0], a[1], a[2], a[3]}
}

// SetupNode makes (or repairs) the bridge with the gateway address, turns
// on forwarding and, where br_netfilter is loaded, iptables on bridged
// traffic: a pod reaching a Service backend on the same bridge gets its
// reply un-NATed by kube-proxy's rules.
func (n podNet) SetupNode() error {
	br, err := netlink.LinkByName(podBridge)
	if err != nil {
		if !linuxhost.IsLinkNotFound(err) {
			return fmt.Errorf("bridge %s: %w", podBridge, err)
		}
		la := netlink.NewLinkAttrs()
		la.Name = podBridge
		la.HardwareAddr = n.bridgeMAC()
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("add bridge %s: %w", podBridge, err)
		}
		if br, err = netlink.LinkByName(podBridge); err != nil {
			return fmt.Errorf("bridge %s: %w", podBridge, err)
		}
	}
	if br.Type() != "bridge" {
		return fmt.Errorf("link %s exists and is a %s, not a bridge", podBridge, br.Type())
	}
	if err := netlink.LinkSetHardwareAddr(br, n.bridgeMAC()); err != nil {
		return fmt.Errorf("bridge %s address: %w", podBridge, err)
	}
	if err := netlink.AddrReplace(br, &netlink.Addr{IPNet: linuxhost.PrefixNet(n.gateway())}); err != nil {
		return fmt.Errorf("address %s on %s: %w", n.gateway(), podBridge, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("bridge %s up: %w", podBridge, err)
	}
	if err := linuxhost.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	const callIptables = "net/bridge/bridge-nf-call-iptables"
	if _, err := os.Stat("/proc/sys/" + callIptables); err == nil {
		return linuxhost.Sysctl(callIptables, "1")
	}
	return nil
}

// Flush removes every pod namespace and veth a previous agent run left,
// killing what still runs in them (their processes normally die with the
// agent).
func (n podNet) Flush(log *slog.Logger) error {
	var errs []error
	names, err := linuxhost.NetnsNames(n.Prefix)
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range names {
		pids, err := linuxhost.NetnsPids(linuxhost.NetnsPath(name))
		if err != nil {
			errs = append(errs, err)
		}
		for _, pid := range pids {
			log.Info("killing leftover process in pod netns", "netns", name, "pid", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		errs = append(errs, linuxhost.DeleteNetns(name))
	}
	br, err := netlink.LinkByName(podBridge)
	if linuxhost.IsLinkNotFound(err) {
		return errors.Join(errs...)
	}
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("bridge %s: %w", podBridge, err))...)
	}
	links, err := linuxhost.Dump(netlink.LinkList)
	if err != nil {
		errs = append(errs, fmt.Errorf("list links: %w", err))
	}
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			if err := netlink.LinkDel(l); err != nil && !linuxhost.IsLinkNotFound(err) {
				errs = append(errs, fmt.Errorf("delete stale %s: %w", l.Attrs().Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Add creates (or recreates) the pod's namespace and veth pair with ip on
// eth0 and returns the namespace's name.
func (n podNet) Add(uid types.UID, ip netip.Addr) (string, error) {
	if !n.CIDR.Contains(ip) {
		return "", fmt.Errorf("pod IP %s outside the pod CIDR %s", ip, n.CIDR)
	}
	br, err := netlink.LinkByName(podBridge)
	if err != nil {
		return "", fmt.Errorf("bridge %s: %w", podBridge, err)
	}
	name := n.Netns(uid)
	ns, err := linuxhost.EnsureNetns(name)
	if err != nil {
		return "", err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return "", fmt.Errorf("netlink in %s: %w", name, err)
	}
	defer h.Close()

	// A half-made pair (a crash between steps) is recreated, not repaired.
	veth := VethName(uid)
	if old, err := netlink.LinkByName(veth); err == nil {
		if err := netlink.LinkDel(old); err != nil {
			return "", fmt.Errorf("delete stale %s: %w", veth, err)
		}
	}
	if old, err := h.LinkByName("eth0"); err == nil {
		if err := h.LinkDel(old); err != nil {
			return "", fmt.Errorf("delete stale eth0 in %s: %w", name, err)
		}
	}
	la := netlink.NewLinkAttrs()
	la.Name = veth
	la.MasterIndex = br.Attrs().Index
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		return "", fmt.Errorf("add veth %s: %w", veth, err)
	}
	host, err := netlink.LinkByName(veth)
	if err != nil {
		return "", fmt.Errorf("veth %s: %w", veth, err)
	}
	// Hairpin: a pod calling a Service whose chosen backend is the pod
	// itself gets its DNATed packet bridged back out of the port it came in
	// by (br_netfilter bridges, rather than routes, a DNAT to the same
	// bridge), as kubenet and the CNI bridge plugin's hairpinMode allow.
	if err := netlink.LinkSetHairpin(host, true); err != nil {
		return "", fmt.Errorf("veth %s hairpin: %w", veth, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return "", fmt.Errorf("veth %s up: %w", veth, err)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return "", fmt.Errorf("lo in %s: %w", name, err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return "", fmt.Errorf("lo up in %s: %w", name, err)
	}
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return "", fmt.Errorf("eth0 in %s: %w", name, err)
	}
	addr := netip.PrefixFrom(ip, n.CIDR.Bits())
	if err := h.AddrReplace(eth0, &netlink.Addr{IPNet: linuxhost.PrefixNet(addr)}); err != nil {
		return "", fmt.Errorf("address %s on eth0 in %s: %w", addr, name, err)
	}
	if err := h.LinkSetUp(eth0); err != nil {
		return "", fmt.Errorf("eth0 up in %s: %w", name, err)
	}
	gw := net.IP(n.gateway().Addr().AsSlice())
	if err := h.RouteReplace(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw}); err != nil {
		return "", fmt.Errorf("default route via %s in %s: %w", gw, name, err)
	}
	return name, nil
}

// Del removes the pod's veth pair and namespace; missing ones are fine. Its
// processes must be gone.
func (n podNet) Del(uid types.UID) error {
	var errs []error
	if l, err := netlink.LinkByName(VethName(uid)); err == nil {
		if err := netlink.LinkDel(l); err != nil && !linuxhost.IsLinkNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s: %w", l.Attrs().Name, err))
		}
	}
	return errors.Join(append(errs, linuxhost.DeleteNetns(n.Netns(uid)))...)
}
