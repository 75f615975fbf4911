//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
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
