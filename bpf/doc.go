// Package bpf steers calls to the skipper Service's VIPs, in the kernel, to
// the router on the caller's own node, and never black-holes them when that
// router is gone. docs/architecture.md ("BPF steering") gives the reasons,
// the kernel features and the capabilities.
//
// Programs (steer.c), on Options.Cgroup and below: cgroup/connect4 and 6
// rewrite a TCP connect to an ip:port of the vips map to config's router
// address while the liveness entry is fresh; getpeername4 and 6 report the
// VIP as a steered socket's peer; sockops records an established steered
// connection's local ip:port against its VIP (OriginalDestination); per-CPU
// counters count rewrites, fail-opens and the router's own connects.
//
// Invariants:
//   - Fail open: a zero, stale or future liveness timestamp (CLOCK_MONOTONIC,
//     written by Heartbeat), an unset router or no config means no rewrite.
//   - Only TCP to the vips is touched, and never a socket marked
//     Options.SkipMark (the router dials with MarkControl).
//   - With Options.PinDir, maps and links are pinned on bpffs and a later
//     Load adopts them without a gap; Close never detaches pinned links,
//     Cleanup does.
//   - The map layouts in steer.c are the contract; the Go types are
//     bpf2go's (gen.go); addresses and ports in network byte order.
//
// Driving it:
//
//	if err := bpf.Probe(); errors.Is(err, bpf.ErrNotSupported) { /* run without BPF */ }
//	s, err := bpf.Load(bpf.Options{Cgroup: cg, PinDir: "/sys/fs/bpf/skipper"})
//	defer s.Close()
//	s.SetVIPs(vips); s.SetRouter(routerAddr)   // and on every change
//	for range ticker.C { s.Heartbeat() }        // several times per MaxAge
//	s.Withdraw()                                // on a deliberate shutdown
//	vip, ok, _ := s.OriginalDestination(remote) // an accepted connection's VIP
//
// Files by job: loader.go probes, loads and attaches; maps.go writes and
// reads the maps and removes pins; mounts.go finds cgroup2 and bpffs.
//
// Regenerate with `go generate ./bpf` (clang-14, llvm-strip-14); the
// committed outputs must reproduce byte for byte.
package bpf
