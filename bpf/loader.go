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
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Defaults for Options fields left zero.
const (
	// DefaultMaxAge is how long a heartbeat keeps steering on. The router
	// should heartbeat several times per MaxAge.
	DefaultMaxAge = 3 * time.Second
	// DefaultSkipMark is the SO_MARK that exempts a socket from steering.
	DefaultSkipMark uint32 = 0x5c1d0001
	// maxVIPs is the capacity of the vips map in steer.c.
	maxVIPs = 256
)

// Counter indexes; they mirror enum counter in steer.c.
const (
	counterRewrite  = 0
	counterFailOpen = 1
	counterSkipOwn  = 2
	counterRedirect = 3
	counterMax      = 4
)

// ErrNotSupported is matched (errors.Is) by every error Load returns because
// the running kernel lacks a feature the programs need. Callers branch on it
// to run without BPF (the fail-open path through the Service).
var ErrNotSupported = ebpf.ErrNotSupported

// NotSupportedError names the missing kernel feature. It unwraps to an error
// matching ErrNotSupported.
type NotSupportedError struct {
	Feature string
	Err     error
}

func (e *NotSupportedError) Error() string {
	return fmt.Sprintf("bpf steering: kernel lacks %s: %v", e.Feature, e.Err)
}

func (e *NotSupportedError) Unwrap() error { return e.Err }

// Options configure Load. The zero value of each optional field is replaced
// by the stated default.
type Options struct {
	// Cgroup is the cgroup2 directory the programs attach to; they act on
	// every socket of every process in it and its descendants. Required.
	Cgroup string
	// PinDir is a directory on bpffs (created if missing) where maps and links
	// are pinned, so steering outlives the process and the next Load adopts
	// it. Empty: nothing is pinned and Close detaches.
	PinDir string
	// MaxAge is how stale the liveness entry may be before connects fail
	// open. Default DefaultMaxAge.
	MaxAge time.Duration
	// SkipMark is the SO_MARK of sockets never rewritten (the router's own;
	// see MarkControl). Default DefaultSkipMark.
	SkipMark uint32
	// Redirect turns on the sk_msg fast path: payload between a steered
	// caller's socket and the router's socket accepted from it skips the
	// TCP/IP stack (sockhash + sk_msg). Off: every byte takes the stack.
	Redirect bool
}

// Steering is a loaded and attached set of steering programs. SetVIPs,
// SetRouter, Heartbeat and Withdraw belong to one goroutine (the router's BPF
// loop: SetVIPs and SetRouter read, modify and write maps); Counters and
// OriginalDestination may be called from any goroutine at any time.
type Steering struct {
	objs   steerObjects
	links  []link.Link
	pinDir string
	opts   Options
	// msgAttached: steer_redirect is attached to the socks map (Redirect).
	msgAttached bool
}

// Counters are the per-CPU counters of steer.c summed over CPUs. They are
// cumulative since the maps were created (they survive adoption).
type Counters struct {
	Rewrites  uint64 // connects rewritten to the router
	FailOpens uint64 // VIP connects left alone because the router was not live
	OwnSkips  uint64 // VIP connects left alone because the socket had SkipMark
	Redirects uint64 // sendmsg payloads redirected to the peer socket (Options.Redirect)
}

type attachment struct {
	name   string
	attach ebpf.AttachType
	prog   func(*steerObjects) *ebpf.Program
}

var attachments = []attachment{
	{"connect4", ebpf.AttachCGroupInet4Connect, func(o *steerObjects) *ebpf.Program { return o.SteerConnect4 }},
	{"connect6", ebpf.AttachCGroupInet6Connect, func(o *steerObjects) *ebpf.Program { return o.SteerConnect6 }},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, func(o *steerObjects) *ebpf.Program { return o.SteerGetpeername4 }},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername, func(o *steerObjects) *ebpf.Program { return o.SteerGetpeername6 }},
	{"sockops", ebpf.AttachCGroupSockOps, func(o *steerObjects) *ebpf.Program { return o.SteerSockops }},
}

// linkPin is the bpffs name a link is pinned under; map pins use the map's
// own name, which never starts with "link_".
func linkPin(dir, name string) string { return filepath.Join(dir, "link_"+name) }

// Probe reports whether the running kernel has every feature the steering
// programs need, as a *NotSupportedError naming the first one missing.
func Probe() error {
	type probe struct {
		feature string
		check   func() error
	}
	probes := []probe{
		{"cgroup sock_addr programs", func() error { return features.HaveProgramType(ebpf.CGroupSockAddr) }},
		{"sockops programs", func() error { return features.HaveProgramType(ebpf.SockOps) }},
		{"hash maps", func() error { return features.HaveMapType(ebpf.Hash) }},
		{"LRU hash maps", func() error { return features.HaveMapType(ebpf.LRUHash) }},
		{"per-CPU array maps", func() error { return features.HaveMapType(ebpf.PerCPUArray) }},
		{"socket storage maps", func() error { return features.HaveMapType(ebpf.SkStorage) }},
		{"bpf_sk_storage_get in sock_addr programs", func() error {
			return features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnSkStorageGet)
		}},
		{"bpf_sk_storage_get in sockops programs", func() error {
			return features.HaveProgramHelper(ebpf.SockOps, asm.FnSkStorageGet)
		}},
		{"bpf_ktime_get_ns in sock_addr programs", func() error {
			return features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnKtimeGetNs)
		}},
	}
	for _, p := range probes {
		if err := p.check(); err != nil {
			if errors.Is(err, ebpf.ErrNotSupported) {
				return &NotSupportedError{Feature: p.feature, Err: err}
			}
			return fmt.Errorf("probe %s: %w", p.feature, err)
		}
	}
	return nil
}

// flagRedirect mirrors STEER_F_REDIRECT in steer.c.
const flagRedirect = 1

// probeRedirect reports whether the kernel has what Options.Redirect needs.
func probeRedirect() error {
	for _, p := range []struct {
		feature string
		check   func() error
	}{
		{"sockhash maps", func() error { return features.HaveMapType(ebpf.SockHash) }},
		{"sk_msg programs", func() error { return features.HaveProgramType(ebpf.SkMsg) }},
		{"bpf_sock_hash_update in sockops programs", func() error {
			return features.HaveProgramHelper(ebpf.SockOps, asm.FnSockHashUpdate)
		}},
	} {
		if err := p.check(); err != nil {
			if errors.Is(err, ebpf.ErrNotSupported) {
				return &NotSupportedError{Feature: p.feature, Err: err}
			}
			return fmt.Errorf("probe %s: %w", p.feature, err)
		}
	}
	return nil
}

// Load loads the programs, attaches them to opts.Cgroup and, with a PinDir,
// pins maps and links there. Pins left by an earlier process are adopted:
// its maps (VIPs, router, liveness, counters) are reused when compatible and
// replaced when not; its links keep the cgroup steered throughout and are
// updated in place to the programs just loaded. A pinned link on another
// cgroup is replaced.
func Load(opts Options) (*Steering, error) {
	if opts.Cgroup == "" {
		return nil, errors.New("bpf steering: Options.Cgroup is required")
	}
	if opts.MaxAge == 0 {
		opts.MaxAge = DefaultMaxAge
	}
	if opts.MaxAge < 0 {
		return nil, fmt.Errorf("bpf steering: negative MaxAge %v", opts.MaxAge)
	}
	if opts.SkipMark == 0 {
		opts.SkipMark = DefaultSkipMark
	}
	cgID, err := cgroupID(opts.Cgroup)
	if err != nil {
		return nil, err
	}
	if err := Probe(); err != nil {
		return nil, err
	}
	if opts.Redirect {
		if err := probeRedirect(); err != nil {
			return nil, err
		}
	}
	if opts.PinDir != "" {
		if err := os.MkdirAll(opts.PinDir, 0o700); err != nil {
			return nil, fmt.Errorf("bpf steering: pin dir: %w", err)
		}
		if err := requireFS(opts.PinDir, unix.BPF_FS_MAGIC, "bpffs"); err != nil {
			return nil, err
		}
	}

	s := &Steering{pinDir: opts.PinDir, opts: opts}
	if err := s.loadObjects(); err != nil {
		return nil, err
	}
	if err := s.writeConfig(func(c *steerSteerConfig) {
		c.MaxAgeNs = uint64(opts.MaxAge.Nanoseconds())
		c.SkipMark = opts.SkipMark
		c.Flags &^= flagRedirect
		if opts.Redirect {
			c.Flags |= flagRedirect
		}
	}); err != nil {
		s.objs.Close()
		return nil, err
	}
	if opts.Redirect {
		// The verdict program lives as long as the socks map (pinned or
		// held by the sockops program); attaching again replaces it.
		err := link.RawAttachProgram(link.RawAttachProgramOptions{
			Target: s.objs.Socks.FD(), Program: s.objs.SteerRedirect, Attach: ebpf.AttachSkMsgVerdict,
		})
		if err != nil {
			s.objs.Close()
			if errors.Is(err, ebpf.ErrNotSupported) {
				return nil, &NotSupportedError{Feature: "sk_msg verdict programs on a sockhash", Err: err}
			}
			return nil, fmt.Errorf("bpf steering: attach sk_msg: %w", err)
		}
		s.msgAttached = true
	}
	for _, a := range attachments {
		l, err := s.attach(a, cgID)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("bpf steering: attach %s to %s: %w", a.name, opts.Cgroup, err)
		}
		s.links = append(s.links, l)
	}
	return s, nil
}

func (s *Steering) loadObjects() error {
	spec, err := loadSteer()
	if err != nil {
		return fmt.Errorf("bpf steering: load spec: %w", err)
	}
	if s.pinDir == "" {
		for _, m := range spec.Maps {
			m.Pinning = ebpf.PinNone
		}
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: s.pinDir}}
	err = spec.LoadAndAssign(&s.objs, opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		// Pins from another version of steer.c: start over with fresh maps.
		// Links still pointing at the old programs are updated by attach.
		if rerr := removeMapPins(s.pinDir); rerr != nil {
			return fmt.Errorf("bpf steering: replace incompatible maps: %w", rerr)
		}
		err = spec.LoadAndAssign(&s.objs, opts)
	}
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			return &NotSupportedError{Feature: "loading the steering programs", Err: err}
		}
		return fmt.Errorf("bpf steering: load objects: %w", err)
	}
	return nil
}

// attach returns a link of a.prog on the cgroup, adopting a compatible
// pinned link (updated to the new program without a gap) or replacing it.
func (s *Steering) attach(a attachment, cgID uint64) (link.Link, error) {
	prog := a.prog(&s.objs)
	if s.pinDir != "" {
		path := linkPin(s.pinDir, a.name)
		l, err := link.LoadPinnedLink(path, nil)
		switch {
		case err == nil:
			if compatible(l, a.attach, cgID) && l.Update(prog) == nil {
				return l, nil
			}
			// Wrong cgroup or not updatable: replace it. Detach, not just
			// unpin, so it cannot linger in another process's hands.
			_ = l.Unpin()
			_ = detach(l)
			l.Close()
		case errors.Is(err, fs.ErrNotExist):
		default:
			// Not a link (or unreadable): remove so the new pin can go there.
			if rerr := os.Remove(path); rerr != nil {
				return nil, fmt.Errorf("replace pin %s: %w (after %v)", path, rerr, err)
			}
		}
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: s.opts.Cgroup, Attach: a.attach, Program: prog})
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			return nil, &NotSupportedError{Feature: "cgroup attach type " + a.attach.String(), Err: err}
		}
		return nil, err
	}
	if s.pinDir != "" {
		if err := l.Pin(linkPin(s.pinDir, a.name)); err != nil {
			l.Close()
			if errors.Is(err, ebpf.ErrNotSupported) {
				return nil, &NotSupportedError{Feature: "bpf_link for cgroups (pinnable links)", Err: err}
			}
			return nil, fmt.Errorf("pin: %w", err)
		}
	}
	return l, nil
}

func compatible(l link.Link, attach ebpf.AttachType, cgID uint64) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	cg := info.Cgroup()
	return cg != nil && cg.CgroupId == cgID && ebpf.AttachType(cg.AttachType) == attach
}

func detach(l link.Link) error {
	if d, ok := l.(interface{ Detach() error }); ok {
		return d.Detach()
	}
	return nil
}

// Close releases this process's hold on the programs. With a PinDir the
// pinned links keep steering the cgroup (and the maps keep their state);
// without one the programs are detached.
func (s *Steering) Close() error {
	var errs []error
	if s.msgAttached && s.pinDir == "" {
		errs = append(errs, link.RawDetachProgram(link.RawDetachProgramOptions{
			Target: s.objs.Socks.FD(), Program: s.objs.SteerRedirect, Attach: ebpf.AttachSkMsgVerdict,
		}))
		s.msgAttached = false
	}
	for _, l := range s.links {
		errs = append(errs, l.Close())
	}
	s.links = nil
	errs = append(errs, s.objs.Close())
	return errors.Join(errs...)
}

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

// MarkControl returns a net.Dialer.Control that sets SO_MARK to mark, so the
// socket is never steered. The router dials with it (needs CAP_NET_ADMIN or
// CAP_NET_RAW).
func MarkControl(mark uint32) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("set SO_MARK: %w", serr)
		}
		return nil
	}
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

// cgroupID is the id the kernel reports for a cgroup2 directory: its inode.
func cgroupID(dir string) (uint64, error) {
	if err := requireFS(dir, unix.CGROUP2_SUPER_MAGIC, "cgroup2"); err != nil {
		return 0, err
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("bpf steering: cgroup %s: %w", dir, err)
	}
	return st.Ino, nil
}

func requireFS(path string, magic int64, name string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("bpf steering: %s: %w", path, err)
	}
	if int64(st.Type) != magic {
		return fmt.Errorf("bpf steering: %s is not on %s", path, name)
	}
	return nil
}

// Cgroup2Mount returns the mount point of the first cgroup2 hierarchy in
// the mount table (the unified hierarchy on hybrid hosts).
func Cgroup2Mount() (string, error) {
	ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup2"))
	if err != nil {
		return "", fmt.Errorf("bpf steering: read mounts: %w", err)
	}
	if len(ms) == 0 {
		return "", &NotSupportedError{Feature: "a mounted cgroup2 hierarchy", Err: ErrNotSupported}
	}
	return ms[0].Mountpoint, nil
}

// EnsureBPFFS mounts bpffs at dir unless one is mounted there already.
func EnsureBPFFS(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if requireFS(dir, unix.BPF_FS_MAGIC, "bpffs") == nil {
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return nil
}
