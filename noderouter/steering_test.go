package noderouter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"skipper.dev/skipper/bpf"
	"skipper.dev/skipper/noderouter/internal/routertest"
	"skipper.dev/skipper/noderouter/localaddr"
)

// The BPF test re-executes this test binary as a caller: forked from a
// thread inside the test's network namespace (so it shares the router's
// local address and has no route to the VIP: an unsteered connect fails at
// once with ENETUNREACH) and cloned into the test cgroup.
const steerChildEnv = "SKIPPER_ROUTERTEST_CALLER"

var testVIP = netip.MustParseAddrPort("198.19.0.10:80")

type callResult struct {
	Status int    `json:",omitempty"`
	Err    string `json:",omitempty"`
}

func steerChild() int {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var r callResult
	resp, err := c.Get("http://" + os.Getenv("DIAL") + "/")
	if err != nil {
		r.Err = err.Error()
	} else {
		resp.Body.Close()
		r.Status = resp.StatusCode
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

// testNetns is a fresh network namespace; do runs f on a thread inside it.
type testNetns struct {
	ns, orig netns.NsHandle
	h        *netlink.Handle
}

func newTestNetns(t *testing.T) *testNetns {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		runtime.UnlockOSThread()
		orig.Close()
		t.Fatalf("new netns: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatalf("restore netns: %v", err) // the thread stays locked and dies with the goroutine
	}
	runtime.UnlockOSThread()
	n := &testNetns{ns: ns, orig: orig}
	t.Cleanup(func() { ns.Close(); orig.Close() })
	if n.h, err = netlink.NewHandleAt(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.h.Close)
	return n
}

func (n *testNetns) do(t *testing.T, f func()) {
	t.Helper()
	runtime.LockOSThread()
	if err := netns.Set(n.ns); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("enter test netns: %v", err)
	}
	f()
	if err := netns.Set(n.orig); err != nil {
		t.Fatalf("leave test netns: %v", err) // the thread stays locked and dies with the goroutine
	}
	runtime.UnlockOSThread()
}

// testCgroup creates a cgroup under the cgroup2 mount (never the root
// itself) and a pin directory on bpffs, both removed in Cleanup.
func testCgroup(t *testing.T) (cgroup, pinDir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN for namespaces and cgroups)")
	}
	if err := bpf.Probe(); errors.Is(err, bpf.ErrNotSupported) {
		t.Skipf("kernel lacks BPF steering support: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	root, err := bpf.Cgroup2Mount()
	if errors.Is(err, bpf.ErrNotSupported) {
		t.Skipf("no cgroup2 hierarchy: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "skipper-routertest-" + hex.EncodeToString(b[:])
	cgroup, pinDir = filepath.Join(root, name), filepath.Join("/sys/fs/bpf", name)
	if err := os.Mkdir(cgroup, 0o755); err != nil {
		t.Fatalf("create test cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(cgroup); err != nil {
			t.Errorf("remove test cgroup: %v", err)
		}
	})
	if err := bpf.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bpf.Cleanup(pinDir); err != nil {
			t.Errorf("cleanup pins: %v", err)
		}
	})
	return cgroup, pinDir
}

// call runs a caller process in n and cgroup, dialling dst.
func call(t *testing.T, n *testNetns, cgroup string, dst netip.AddrPort) callResult {
	t.Helper()
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), steerChildEnv+"=1", "DIAL="+dst.String())
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	cmd.Stderr = os.Stderr
	var out []byte
	n.do(t, func() { out, err = cmd.Output() }) // forked from a thread in n: the child starts in n
	if err != nil {
		t.Fatalf("caller: %v", err)
	}
	var r callResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("caller output %q: %v", out, err)
	}
	return r
}

func bpfTestConfig(t *testing.T) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.NodeName, cfg.PodName = "node1", "router-x"
	cfg.ControllerAddresses = []string{"127.0.0.1:1"} // never asked: the calls name no function
	cfg.DrainDelay = 0
	cfg.ShutdownTimeout = 5 * time.Second
	cfg.BPFVIPs = []string{testVIP.String()}
	cfg.BPFMaxAge = 400 * time.Millisecond
	cfg.LocalAddressInterval = 50 * time.Millisecond
	return cfg
}

// metricValue returns the value of the series name{labels...} in rt's
// registry, and whether it exists.
func metricValue(t *testing.T, rt *router, name string, labels ...string) (float64, bool) {
	t.Helper()
	mfs, err := rt.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue series
				}
			}
			if got["node"] != rt.cfg.NodeName {
				t.Errorf("%s lacks node=%q: %v", name, rt.cfg.NodeName, got)
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestBPFSteersVIPToLocalAddress runs the router's real start-up path for
// --local-address and --bpf=required against a test cgroup in a fresh
// network namespace: a caller in the cgroup dialling the VIP reaches the
// router's local listener (400: the call names no function), the rewrite is
// counted, and after shutdown (Withdraw) the same call fails open.
func TestBPFSteersVIPToLocalAddress(t *testing.T) {
	// Not parallel: it enters network namespaces and attaches BPF programs to
	// a cgroup, kernel state the process shares.
	for _, skMsg := range []bool{false, true} {
		t.Run(fmt.Sprintf("sk_msg=%v", skMsg), func(t *testing.T) { testBPFSteersVIPToLocalAddress(t, skMsg) })
	}
}

// testBPFSteersVIPToLocalAddress runs the router's real BPF set-up, with
// and without the sk_msg fast path loaded.
func testBPFSteersVIPToLocalAddress(t *testing.T, skMsg bool) {
	cgroup, pinDir := testCgroup(t)
	n := newTestNetns(t)
	cfg := bpfTestConfig(t)
	cfg.BPF, cfg.BPFCgroup, cfg.BPFPinDir, cfg.BPFSkMsg = BPFRequired, cgroup, pinDir, skMsg
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}

	rt := newRouter(cfg, slog.New(slog.DiscardHandler))
	rt.localAddr = &localaddr.Manager{Addr: netip.MustParseAddr(cfg.LocalAddress), Handle: n.h}
	if _, _, err := rt.localAddr.Ensure(); err != nil {
		t.Fatal(err)
	}
	var err error
	n.do(t, func() { rt.local, err = net.Listen("tcp4", net.JoinHostPort(cfg.LocalAddress, "80")) })
	if err != nil {
		t.Fatalf("listen on the local address in the test netns: %v", err)
	}
	if err := rt.startBPF(); err != nil {
		t.Fatal(err)
	}
	if v, _ := metricValue(t, rt, "skipper_noderouter_bpf_mode", "mode", bpfModeConnect); v != 1 {
		t.Errorf("bpf_mode{mode=connect} = %v, want 1", v)
	}
	// The router's own dials, to instances and to controllers, carry the
	// skip mark.
	target := routertest.Listen(t)
	defer target.Close()
	if rt.cp.dialer == nil {
		t.Fatal("controller dialer not set")
	}
	for what, dial := range map[string]func(context.Context, string, string) (net.Conn, error){
		"instances": rt.proxy.DialInstance, "controllers": rt.cp.dialer.DialContext} {
		if got := dialMark(t, dial, target.Addr().String()); got != bpf.DefaultSkipMark {
			t.Errorf("dials to %s carry SO_MARK %#x, want %#x", what, got, bpf.DefaultSkipMark)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.run(ctx, routertest.Listen(t), routertest.Listen(t), nil) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("router run: %v", err)
			}
		}
	}
	t.Cleanup(stop)

	// Outlive several max-ages: the heartbeat loop keeps steering on.
	time.Sleep(2 * cfg.BPFMaxAge) // sleep: behaviour (outlive max-ages on the kernel's clock)
	r := call(t, n, cgroup, testVIP)
	if r.Status != http.StatusBadRequest {
		t.Fatalf("call to the VIP = %+v, want 400 from the router's local listener", r)
	}
	if v, ok := metricValue(t, rt, "skipper_noderouter_bpf_rewrites_total"); !ok || v != 1 {
		t.Errorf("bpf_rewrites_total = %v (present %v), want 1", v, ok)
	}
	// The router here is this test process, outside the test cgroup, so
	// its accepted socket never joins the sockhash: with --bpf-sk-msg the
	// caller's payload finds no peer and takes the stack, and the call
	// above still had to succeed. The redirect itself, with both ends in
	// the cgroup, is bpf.TestRedirect's.
	if v, ok := metricValue(t, rt, "skipper_noderouter_bpf_redirects_total"); !ok || v != 0 {
		t.Errorf("bpf_redirects_total = %v (present %v), want 0", v, ok)
	}
	// Another port on the VIP address is not steered.
	if r := call(t, n, cgroup, netip.AddrPortFrom(testVIP.Addr(), 81)); !strings.Contains(r.Err, "network is unreachable") {
		t.Errorf("call to an unmatched port = %+v, want untouched (network is unreachable)", r)
	}

	stop()
	// Withdrawn on shutdown: the pinned programs stay but fail open at once.
	if r := call(t, n, cgroup, testVIP); !strings.Contains(r.Err, "network is unreachable") {
		t.Errorf("call after shutdown = %+v, want failed open (network is unreachable: kube-proxy's job)", r)
	}
	if rt.steer != nil {
		t.Error("steering not closed")
	}
}

// TestBPFAutoDegrades checks that --bpf=auto runs without steering, and
// says so, when the programs cannot load (here: the pin dir is not on bpffs,
// or, without root, the missing privileges), while --bpf=required fails.
func TestBPFAutoDegrades(t *testing.T) {
	// Not parallel: as root it makes a cgroup and loads BPF programs, kernel
	// state the process shares.
	cfg := bpfTestConfig(t)
	cfg.BPF, cfg.BPFPinDir = BPFAuto, t.TempDir()
	if os.Geteuid() == 0 {
		cfg.BPFCgroup, _ = testCgroup(t)
	} else {
		cfg.BPFCgroup = t.TempDir()
	}
	rt := newRouter(cfg, slog.New(slog.DiscardHandler))
	if err := rt.startBPF(); err != nil {
		t.Fatalf("--bpf=auto start: %v", err)
	}
	if rt.steer != nil {
		t.Fatal("steering loaded with the pin dir off bpffs")
	}
	for mode, want := range map[string]float64{bpfModeOff: 0, bpfModeConnect: 0, bpfModeFailed: 1} {
		if v, ok := metricValue(t, rt, "skipper_noderouter_bpf_mode", "mode", mode); !ok || v != want {
			t.Errorf("bpf_mode{mode=%s} = %v (present %v), want %v", mode, v, ok, want)
		}
	}
	for _, name := range []string{"skipper_noderouter_bpf_rewrites_total", "skipper_noderouter_bpf_fail_opens_total", "skipper_noderouter_bpf_redirects_total"} {
		if v, ok := metricValue(t, rt, name); !ok || v != 0 {
			t.Errorf("%s = %v (present %v), want 0", name, v, ok)
		}
	}
	// It still serves, without marking its dials (SO_MARK needs
	// CAP_NET_ADMIN, which a degraded router may lack).
	target := routertest.Listen(t)
	defer target.Close()
	if got := dialMark(t, rt.proxy.DialInstance, target.Addr().String()); got != 0 || rt.cp.dialer != nil {
		t.Errorf("degraded router marks its dials: SO_MARK %#x, controller dialer %v", got, rt.cp.dialer)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.run(ctx, routertest.Listen(t), routertest.Listen(t), nil) }()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("router run: %v", err)
	}

	cfg.BPF = BPFRequired
	err := newRouter(cfg, slog.New(slog.DiscardHandler)).startBPF()
	if err == nil || !strings.Contains(err.Error(), "--bpf=required") {
		t.Fatalf("--bpf=required start = %v, want an error", err)
	}
	if os.Geteuid() == 0 && !strings.Contains(err.Error(), "bpffs") {
		t.Errorf("--bpf=required error %q does not name bpffs", err)
	}
}

// TestCleanup checks bpf-cleanup's removal in a fresh network namespace.
func TestCleanupRemovesAddress(t *testing.T) {
	// Not parallel: it enters a network namespace (the thread's).
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_ADMIN for a network namespace, CAP_NET_ADMIN for links)")
	}
	n := newTestNetns(t)
	addr := netip.MustParseAddr("169.254.20.20")
	m := &localaddr.Manager{Addr: addr, Handle: n.h}
	if _, _, err := m.Ensure(); err != nil {
		t.Fatal(err)
	}
	pinDir := filepath.Join(t.TempDir(), "missing") // a missing pin dir is not an error
	if err := cleanup(CleanupConfig{BPFPinDir: pinDir, LocalAddress: addr.String()}, &localaddr.Manager{Handle: n.h}); err != nil {
		t.Fatal(err)
	}
	if _, a, err := m.Ensure(); err != nil || a.None() {
		t.Errorf("Ensure after cleanup = %+v, %v: want the address re-added", a, err)
	}
	if err := m.Remove(); err != nil {
		t.Fatal(err)
	}
}

// dialMark dials addr with dial and returns the socket's SO_MARK.
func dialMark(t *testing.T, dial func(context.Context, string, string) (net.Conn, error), addr string) uint32 {
	t.Helper()
	c, err := dial(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var mark int
	var serr error
	if err := raw.Control(func(fd uintptr) { mark, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return uint32(mark)
}
