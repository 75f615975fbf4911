// Package bpf steers calls to the skipper Service's VIPs, in the kernel, to
// the router on the caller's own node, and never black-holes them when that
// router is gone.
//
// # Programs (steer.c)
//
//   - cgroup/connect4, cgroup/connect6: a TCP connect whose destination
//     (IPv4, or IPv4-mapped IPv6) ip:port is in the vips map is rewritten to
//     the router address in config, but only while the liveness entry is
//     fresher than config's max age. Otherwise the connect is left alone and
//     kube-proxy (the Service's PreferSameNode path) takes it: fail open.
//   - cgroup/getpeername4, cgroup/getpeername6: a steered socket reports the
//     VIP as its peer, so callers cannot tell they were steered.
//   - sockops: when a steered connection is established, the caller's local
//     ip:port is recorded against the VIP it aimed at (an LRU map), so the
//     router can look up the original VIP of a connection it accepted.
//   - per-CPU counters: rewrites, fail-opens, and connects skipped because the
//     socket was the router's own.
//
// # Invariants
//
//   - Fail open: a zero, stale or future liveness timestamp, an unset router
//     address or a missing config means no rewrite. Liveness is
//     bpf_ktime_get_ns, i.e. CLOCK_MONOTONIC, written by Heartbeat.
//   - Only TCP, only destinations in vips; UDP and every other address and
//     port pass untouched.
//   - The router's own sockets are never rewritten: sockets carrying SO_MARK
//     equal to Options.SkipMark (DefaultSkipMark) are skipped. The router
//     dials with MarkControl. A mark (rather than a pid or cgroup id) is
//     chosen because it is independent of PID and cgroup namespaces, survives
//     router restarts without map updates, and costs one setsockopt per dial.
//   - The programs act on sockets whose cgroup is Options.Cgroup or below it.
//     Load refuses anything that is not a cgroup2 directory; callers choose the
//     cgroup (the host's cgroup2 root for the DaemonSet, found with
//     Cgroup2Mount, or a node's own cgroup in the local cluster).
//   - With Options.PinDir, maps and links are pinned on bpffs, so steering
//     outlives the process: a restarted router calls Load with the same
//     PinDir and adopts them (links are updated in place, without a gap;
//     VIPs, router and counters carry over; incompatible maps from another
//     version are replaced; a link pinned for another cgroup is detached and
//     replaced). Close never detaches pinned links; Cleanup does.
//   - The map layouts in steer.c are the contract with this package; the Go
//     types are generated from them by bpf2go (gen.go). Addresses and ports
//     are stored in network byte order.
//
// # Driving it
//
//	if err := bpf.Probe(); errors.Is(err, bpf.ErrNotSupported) { /* run without BPF */ }
//	s, err := bpf.Load(bpf.Options{Cgroup: cg, PinDir: "/sys/fs/bpf/skipper"})
//	defer s.Close()
//	s.SetVIPs([]netip.AddrPort{serviceVIP})    // on every Service change
//	s.SetRouter(netip.MustParseAddrPort("169.254.20.20:80"))
//	for range ticker.C { s.Heartbeat() }        // several times per MaxAge
//	s.Withdraw()                                // on a deliberate shutdown
//	c, _ := s.Counters()                        // for metrics
//	vip, ok, _ := s.OriginalDestination(callerAddrPort) // accepted conn's remote
//
// On uninstall, Cleanup(pinDir) detaches the links (even from a process still
// holding them) and removes every pin. EnsureBPFFS mounts bpffs if needed.
//
// Capabilities: Load, the map methods, Close and Cleanup need exactly CAP_BPF
// and CAP_NET_ADMIN (checked with every other capability dropped), plus
// write access to PinDir and read access to the cgroup directory. Mounting
// bpffs (EnsureBPFFS) needs CAP_SYS_ADMIN; deployments mount it from the
// host instead. The router's SO_MARK needs CAP_NET_ADMIN, which it already
// has. Kernel: cgroup2; bpf_link for cgroups (5.7) to pin; getpeername hooks
// (5.8); socket storage from sock_addr and sockops programs. Probe reports
// the first missing feature as a *NotSupportedError (errors.Is
// ErrNotSupported); a permission error is returned as is.
//
// Files by job: loader.go probes, loads and attaches (Load, Probe, Close,
// MarkControl); maps.go writes and reads the maps and removes pins (SetVIPs,
// SetRouter, Heartbeat, Counters, OriginalDestination, Cleanup); mounts.go
// checks and finds the filesystems (the cgroup2 mount, bpffs).
//
// Regenerate with `go generate ./bpf` (needs clang-14 and llvm-strip-14);
// the outputs are committed and must reproduce byte for byte.
package bpf
