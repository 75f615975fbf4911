//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Counter indexes; they mirror enum counter in steer.c.
const (
	counterRewrite  = 0
	counterFailOpen = 1
	counterSkipOwn  = 2
	counterRedirect = 3
	counterMax      = 4
)

// Counters are the per-CPU counters of steer.c summed over CPUs. They are
// cumulative since the maps were created (they survive adoption).
type Counters struct {
	Rewrites  uint64 // connects rewritten to the router
	FailOpens uint64 // VIP connects left alone because the router was not live
	OwnSkips  uint64 // VIP connects left alone because the socket had SkipMark
	Redirects uint64 // sendmsg payloads redirected to the peer socket (Options.Redirect)
}

// linkPin is the bpffs name a link is pinned under; map pins use the map's
// own name, which never starts with "link_".
func linkPin(dir, name string) string { return filepath.Join(dir, "link_"+name) }

// Cleanup removes everything Load pinned under pinDir and detaches the pinned
// links, even from processes still holding them: the uninstall path. A missing
// pinDir is not an error.
func Cleanup(pinDir string) error {
	entries, err := os.ReadDir(pinDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("bpf cleanup: %w", err)
	}
	var errs []error
	for _, e := range entries {
		path := filepath.Join(pinDir, e.Name())
		if strings.HasPrefix(e.Name(), "link_") {
			if l, err := link.LoadPinnedLink(path, nil); err == nil {
				if err := detach(l); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
					errs = append(errs, fmt.Errorf("detach %s: %w", path, err))
				}
				l.Close()
			}
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(pinDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bpf cleanup %s: %w", pinDir, err)
	}
	return nil
}

func removeMapPins(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "link_") {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// SetVIPs makes the steered destinations exactly vips (IPv4 or v4-mapped
// addresses, TCP ports). Connects to anything else are never touched.
func (s *Steering) SetVIPs(vips []netip.AddrPort) error {
	if len(vips) > maxVIPs {
		return fmt.Errorf("bpf steering: %d VIPs, at most %d", len(vips), maxVIPs)
	}
	want := make(map[steerAddr4]bool, len(vips))
	for _, v := range vips {
		k, err := toAddr4(v)
		if err != nil {
			return fmt.Errorf("bpf steering: VIP: %w", err)
		}
		want[k] = true
	}
	var (
		k     steerAddr4
		v     uint8
		stale []steerAddr4
	)
	it := s.objs.Vips.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("bpf steering: list VIPs: %w", err)
	}
	for _, k := range stale {
		if err := s.objs.Vips.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("bpf steering: delete VIP: %w", err)
		}
	}
	for k := range want {
		if err := s.objs.Vips.Put(k, uint8(1)); err != nil {
			return fmt.Errorf("bpf steering: add VIP: %w", err)
		}
	}
	return nil
}

// SetRouter sets where steered connects go: the node-local router's IPv4
// address and port. The zero AddrPort turns rewriting off.
func (s *Steering) SetRouter(addr netip.AddrPort) error {
	var r steerAddr4
	if addr.IsValid() {
		var err error
		if r, err = toAddr4(addr); err != nil {
			return fmt.Errorf("bpf steering: router: %w", err)
		}
	}
	return s.writeConfig(func(c *steerSteerConfig) { c.Router = r })
}

// Heartbeat marks the router live as of now; steering stays on for MaxAge.
func (s *Steering) Heartbeat() error {
	var ts unix.Timespec
	// bpf_ktime_get_ns is CLOCK_MONOTONIC.
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return fmt.Errorf("bpf steering: clock: %w", err)
	}
	return s.setLiveness(uint64(ts.Nano()))
}

// Withdraw marks the router not live: connects fail open at once instead of
// after MaxAge. For a router shutting down on purpose.
func (s *Steering) Withdraw() error { return s.setLiveness(0) }

func (s *Steering) setLiveness(monoNs uint64) error {
	if err := s.objs.Liveness.Put(uint32(0), monoNs); err != nil {
		return fmt.Errorf("bpf steering: liveness: %w", err)
	}
	return nil
}

// Counters sums the per-CPU counters.
func (s *Steering) Counters() (Counters, error) {
	var sums [counterMax]uint64
	for i := range sums {
		var per []uint64
		if err := s.objs.Counters.Lookup(uint32(i), &per); err != nil {
			return Counters{}, fmt.Errorf("bpf steering: counters: %w", err)
		}
		for _, v := range per {
			sums[i] += v
		}
	}
	return Counters{Rewrites: sums[counterRewrite], FailOpens: sums[counterFailOpen], OwnSkips: sums[counterSkipOwn],
		Redirects: sums[counterRedirect]}, nil
}

// OriginalDestination returns the VIP a steered connection aimed at, given
// the caller's address as the router sees it (the accepted connection's
// remote address). ok is false for connections that were not steered (or
// whose entry aged out of the LRU). The key is the caller's ip:port alone,
// without its network namespace: unique for pod IPs, not for loopback
// callers in different namespaces.
func (s *Steering) OriginalDestination(caller netip.AddrPort) (vip netip.AddrPort, ok bool, err error) {
	k, err := toAddr4(caller)
	if err != nil {
		return netip.AddrPort{}, false, err
	}
	var v steerAddr4
	if err := s.objs.OrigDst.Lookup(k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return netip.AddrPort{}, false, nil
		}
		return netip.AddrPort{}, false, fmt.Errorf("bpf steering: original destination: %w", err)
	}
	return fromAddr4(v), true, nil
}
func (s *Steering) writeConfig(edit func(*steerSteerConfig)) error {
	var c steerSteerConfig
	if err := s.objs.Config.Lookup(uint32(0), &c); err != nil {
		return fmt.Errorf("bpf steering: read config: %w", err)
	}
	edit(&c)
	if err := s.objs.Config.Put(uint32(0), &c); err != nil {
		return fmt.Errorf("bpf steering: write config: %w", err)
	}
	return nil
}

// toAddr4 encodes ap in the map layout: address and port in network byte
// order (bpfel: the uint32/uint16 hold the big-endian bytes).
func toAddr4(ap netip.AddrPort) (steerAddr4, error) {
	a := ap.Addr().Unmap()
	if !a.Is4() {
		return steerAddr4{}, fmt.Errorf("%v is not IPv4", ap)
	}
	b := a.As4()
	p := ap.Port()
	return steerAddr4{
		Ip:   uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24,
		Port: p>>8 | p<<8,
	}, nil
}

func fromAddr4(k steerAddr4) netip.AddrPort {
	a := netip.AddrFrom4([4]byte{byte(k.Ip), byte(k.Ip >> 8), byte(k.Ip >> 16), byte(k.Ip >> 24)})
	return netip.AddrPortFrom(a, k.Port>>8|k.Port<<8)
}
