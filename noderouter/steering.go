package noderouter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"

	"skipper.dev/skipper/bpf"
	"skipper.dev/skipper/internal/tick"
)

// startBPF loads the steering programs as cfg.BPF says and, when they are
// on, marks the router's own dials so they are never steered. With
// --bpf=auto any failure is logged and the router runs without steering
// (mode "failed"): the Service path always works, and the mode metric and
// the log say why steering is off. With --bpf=required it is returned.
func (rt *router) startBPF() error {
	if rt.cfg.BPF == BPFOff {
		rt.m.setBPFMode(bpfModeOff)
		rt.log.Info("bpf steering off", "path", "skipper Service (PreferSameNode)")
		return nil
	}
	s, cg, err := loadSteering(rt.cfg)
	if err != nil {
		if rt.cfg.BPF == BPFRequired {
			return fmt.Errorf("--bpf=required: %w", err)
		}
		rt.m.setBPFMode(bpfModeFailed)
		rt.log.Warn("bpf steering unavailable; running without it, calls take the skipper Service path",
			"reason", steeringFailure(err), "err", err)
		return nil
	}
	rt.steer = s
	rt.m.steering.Store(s)
	rt.m.setBPFMode(bpfModeConnect)
	rt.markDials()
	rt.log.Info("bpf steering on", "vips", rt.cfg.BPFVIPs, "sk_msg", rt.cfg.BPFSkMsg, "router", net.JoinHostPort(rt.cfg.LocalAddress, fmt.Sprint(rt.cfg.LocalPort)),
		"cgroup", cg, "pin_dir", rt.cfg.BPFPinDir, "max_age", rt.cfg.BPFMaxAge.String())
	return nil
}

// steeringFailure classifies a Load error for the log.
func steeringFailure(err error) string {
	switch {
	case errors.Is(err, bpf.ErrNotSupported):
		return "kernel lacks a feature"
	case errors.Is(err, os.ErrPermission):
		return "permission denied (needs CAP_BPF and CAP_NET_ADMIN, write access to --bpf-pin-dir)"
	default:
		return "load failed"
	}
}

// loadSteering loads and configures the programs, heartbeating once so they
// steer as soon as this returns.
// It returns the cgroup it attached to.
func loadSteering(cfg Config) (*bpf.Steering, string, error) {
	cg, err := resolveCgroup(cfg.BPFCgroup, bpf.Cgroup2Mount, isCgroup2)
	if err != nil {
		return nil, "", err
	}
	routerAddr, err := netip.ParseAddr(cfg.LocalAddress) // validated
	if err != nil {
		return nil, "", fmt.Errorf("--local-address: %w", err)
	}
	vips := make([]netip.AddrPort, 0, len(cfg.BPFVIPs))
	for _, v := range cfg.BPFVIPs {
		ap, err := netip.ParseAddrPort(v) // validated
		if err != nil {
			return nil, "", fmt.Errorf("--bpf-vips: %w", err)
		}
		vips = append(vips, ap)
	}
	// With no --bpf-vips the set starts empty (nothing steered) and follows
	// --bpf-service (run starts the watch).
	s, err := bpf.Load(bpf.Options{Cgroup: cg, PinDir: cfg.BPFPinDir, MaxAge: cfg.BPFMaxAge, Redirect: cfg.BPFSkMsg})
	if err != nil {
		return nil, cg, err
	}
	err = errors.Join(s.SetVIPs(vips), s.SetRouter(netip.AddrPortFrom(routerAddr, uint16(cfg.LocalPort))), s.Heartbeat())
	if err != nil {
		s.Close()
		return nil, cg, err
	}
	return s, cg, nil
}

// resolveCgroup turns --bpf-cgroup into the directory to attach to (see
// Config.BPFCgroup). mount finds the cgroup2 mount; isCG2 reports whether a
// directory is on a cgroup2 filesystem.
func resolveCgroup(flag string, mount func() (string, error), isCG2 func(string) bool) (string, error) {
	if filepath.IsAbs(flag) {
		switch {
		case isCG2(flag):
			return flag, nil
		case isCG2(filepath.Join(flag, "unified")):
			return filepath.Join(flag, "unified"), nil // hybrid host: cgroup2 is the unified hierarchy
		default:
			return "", fmt.Errorf("--bpf-cgroup %s: neither it nor %s is a cgroup2 directory", flag, filepath.Join(flag, "unified"))
		}
	}
	m, err := mount()
	if err != nil {
		return "", fmt.Errorf("find the cgroup2 mount for --bpf-cgroup: %w", err)
	}
	dir := filepath.Join(m, flag)
	if !isCG2(dir) {
		return "", fmt.Errorf("--bpf-cgroup %q: %s is not a cgroup2 directory", flag, dir)
	}
	return dir, nil
}

// isCgroup2 reports whether dir is a directory on a cgroup2 filesystem.
func isCgroup2(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// followVIPs keeps the steered VIPs equal to --bpf-service's ClusterIP:port
// pairs until ctx ends.
func (rt *router) followVIPs(ctx context.Context, cs kubernetes.Interface) error {
	return watchServiceVIPs(ctx, cs, rt.cfg.ControllerNamespace, rt.cfg.BPFService, rt.log, func(vips []netip.AddrPort) {
		if err := rt.steer.SetVIPs(vips); err != nil {
			rt.log.Warn("bpf: set VIPs from Service", "vips", fmt.Sprint(vips), "err", err)
		}
	})
}

// markDials sets bpf.DefaultSkipMark on the router's own sockets (to
// instances and to controllers), so the programs never rewrite them. Called
// before serving, while nothing dials yet.
func (rt *router) markDials() {
	rt.proxy.MarkDials(bpf.DefaultSkipMark, bpf.MarkControl(bpf.DefaultSkipMark))
	rt.cp.dialer = &net.Dialer{Control: bpf.MarkControl(bpf.DefaultSkipMark)}
}

// heartbeat refreshes the liveness entry every quarter of BPFMaxAge until
// ctx ends. A failed heartbeat is logged; if they keep failing, steering
// fails open after BPFMaxAge, which is the point.
func (rt *router) heartbeat(ctx context.Context) {
	tick.Every(ctx, rt.cfg.BPFMaxAge/4, func(time.Time) {
		if err := rt.steer.Heartbeat(); err != nil {
			rt.log.Warn("bpf liveness heartbeat", "err", err)
		}
	})
}

// withdrawBPF marks the router not live, so new calls fail open to the
// Service at once while in-flight ones drain. Called once the heartbeat
// loop has stopped.
func (rt *router) withdrawBPF() {
	if err := rt.steer.Withdraw(); err != nil {
		rt.log.Warn("bpf withdraw; calls fail open after --bpf-max-age instead", "err", err)
		return
	}
	rt.log.Info("bpf steering withdrawn; calls fail open to the skipper Service")
}

// closeBPF releases the programs; pinned links stay, failing open, for the
// next router to adopt (bpf-cleanup removes them on uninstall).
func (rt *router) closeBPF() {
	rt.m.steering.Store(nil)
	if err := rt.steer.Close(); err != nil {
		rt.log.Warn("bpf close", "err", err)
	}
	rt.steer = nil
}
