package cluster

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named network namespaces are bind-mounted, as iproute2's
// `ip netns add` does, so `ip netns exec` works on ours.
const netnsDir = "/run/netns"

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
	blackhole := &netlink.Route{Dst: prefixNet(t.ServiceCIDR), Type: unix.RTN_BLACKHOLE}
	if err := netlink.RouteReplace(blackhole); err != nil {
		return fmt.Errorf("blackhole %s: %w", t.ServiceCIDR, err)
	}
	// Pods of one node reach another node's pods through the root namespace:
	// forward only what arrives on the bridge, and only when there is another
	// node to forward to. Node namespaces have no default route, so nothing
	// is forwarded off the machine.
	if nodes > 1 {
		if err := sysctl("net/ipv4/conf/"+t.Bridge+"/forwarding", "1"); err != nil {
			return err
		}
	}
	return nil
}

func (t Topology) ensureBridge() (netlink.Link, error) {
	br, err := netlink.LinkByName(t.Bridge)
	if err != nil {
		if !isNotFound(err) {
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
	if err := netlink.AddrReplace(br, &netlink.Addr{IPNet: prefixNet(t.Gateway)}); err != nil {
		return nil, fmt.Errorf("address %s on %s: %w", t.Gateway, t.Bridge, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("bridge %s up: %w", t.Bridge, err)
	}
	return br, nil
}

func (t Topology) setupNode(n int, br netlink.Link) error {
	ns, err := ensureNetns(t.Netns(n))
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
	if err := h.AddrReplace(eth0, &netlink.Addr{IPNet: prefixNet(nodeIP)}); err != nil {
		return fmt.Errorf("address %s on eth0: %w", nodeIP, err)
	}
	if err := h.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("eth0 up in %s: %w", t.Netns(n), err)
	}
	gw := net.IP(t.Gateway.Addr().AsSlice())
	for _, dst := range []netip.Prefix{t.PodSupernet, t.ServiceCIDR} {
		r := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: prefixNet(dst), Gw: gw}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s via %s in %s: %w", dst, gw, t.Netns(n), err)
		}
	}
	r := &netlink.Route{LinkIndex: br.Attrs().Index, Dst: prefixNet(t.PodCIDR(n)), Gw: net.IP(t.NodeIP(n).AsSlice())}
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
		if err := deleteNetns(name); err != nil {
			errs = append(errs, err)
		}
	}
	links, err := dump(netlink.LinkList)
	if err != nil {
		errs = append(errs, fmt.Errorf("list links: %w", err))
	}
	for _, l := range links {
		name := l.Attrs().Name
		if name == t.Bridge || strings.HasPrefix(name, t.VethPrefix) {
			if err := netlink.LinkDel(l); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("delete link %s: %w", name, err))
			}
		}
	}
	// Routes through the bridge went with it; the blackhole and any pod route
	// left pointing elsewhere are removed explicitly.
	routes, err := dump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("list routes: %w", err))
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, ok := netipPrefix(r.Dst)
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

// NetnsNames lists the named namespaces whose name starts with NetnsPrefix.
func (t Topology) NetnsNames() ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", netnsDir, err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), t.NetnsPrefix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// ensureNetns returns a handle to the named namespace, creating it (or
// replacing a stale file left by a crash mid-creation) as `ip netns add` does.
// The calling goroutine's thread is never left in the new namespace.
func ensureNetns(name string) (netns.NsHandle, error) {
	path := filepath.Join(netnsDir, name)
	if isNsfs(path) {
		h, err := netns.GetFromPath(path)
		if err != nil {
			return netns.None(), fmt.Errorf("open netns %s: %w", name, err)
		}
		return h, nil
	}
	_ = unix.Unmount(path, unix.MNT_DETACH)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return netns.None(), fmt.Errorf("remove stale %s: %w", path, err)
	}

	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return netns.None(), fmt.Errorf("current netns: %w", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	// NewNamed moved this thread into the new namespace (or may have, on
	// error): move it back, and if that fails keep it locked so the runtime
	// retires the thread instead of reusing it in the wrong namespace.
	if serr := netns.Set(orig); serr != nil {
		if err == nil {
			h.Close()
		}
		return netns.None(), fmt.Errorf("return to root netns after creating %s: %w", name, serr)
	}
	runtime.UnlockOSThread()
	if err != nil {
		_ = os.Remove(path)
		return netns.None(), fmt.Errorf("create netns %s: %w", name, err)
	}
	return h, nil
}

func deleteNetns(name string) error {
	path := filepath.Join(netnsDir, name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

func isNsfs(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// InNetns runs fn on a thread switched into the named namespace; whatever fn
// starts (processes it forks) inherits that namespace. The thread returns to
// the root namespace afterwards, or is retired if it cannot.
func InNetns(name string, fn func() error) error {
	target, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", name, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: the goroutine ends and the runtime
			// kills the thread rather than schedule others in this namespace.
			errc <- errors.Join(ferr, fmt.Errorf("leave netns %s: %w", name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func sysctl(key, value string) error {
	if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

func netipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// dump runs a netlink dump again when the kernel interrupted it because the
// table changed underneath (netlink.ErrDumpInterrupted comes with partial
// results), as it does while namespaces and their links are being deleted.
func dump[T any](list func() ([]T, error)) ([]T, error) {
	for try := 1; ; try++ {
		v, err := list()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || try == 5 {
			return v, err
		}
	}
}
