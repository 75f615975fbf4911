//go:build linux

package bpf

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// The privileged tests re-exec this test binary as a dialing child: cloned
// into a fresh network namespace (only lo, so a connect that is not steered
// fails at once with ENETUNREACH) and, when the test says so, into the test
// cgroup. The child plays both caller and router: it listens on routerAddr in
// its namespace and dials the destination it is given.
const (
	childEnv   = "SKIPPER_BPFTEST_CHILD"
	routerAddr = "127.0.0.1:18080"
)

var (
	vip        = netip.MustParseAddrPort("198.19.0.10:80")
	vipOtherPt = netip.MustParseAddrPort("198.19.0.10:81")
	router     = netip.MustParseAddrPort(routerAddr)
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	goleak.VerifyTestMain(m)
}

// dialResult is what the child reports on stdout.
type dialResult struct {
	Err           string `json:",omitempty"`
	Peer          string `json:",omitempty"` // getpeername of the dialled socket
	AcceptedFrom  string `json:",omitempty"` // the router's view of the caller
	AcceptedLocal string `json:",omitempty"` // the router's own address
	Exchanged     string `json:",omitempty"` // what each side read, with EXCHANGE set
}

func child() int {
	r := dial(os.Getenv("DIAL"), os.Getenv("FAMILY") == "6", os.Getenv("UDP") != "", os.Getenv("MARK"))
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

func dial(dst string, v6, udp bool, mark string) dialResult {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return dialResult{Err: "lo: " + err.Error()}
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return dialResult{Err: "lo up: " + err.Error()}
	}
	ln, err := net.Listen("tcp4", routerAddr)
	if err != nil {
		return dialResult{Err: "listen: " + err.Error()}
	}
	defer ln.Close()

	ap := netip.MustParseAddrPort(dst)
	family, sa := unix.AF_INET, unix.Sockaddr(&unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())})
	if v6 {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Addr: netip.AddrFrom16(ap.Addr().As16()).As16(), Port: int(ap.Port())}
	}
	typ, proto := unix.SOCK_STREAM, unix.IPPROTO_TCP
	if udp {
		typ, proto = unix.SOCK_DGRAM, unix.IPPROTO_UDP
	}
	fd, err := unix.Socket(family, typ, proto)
	if err != nil {
		return dialResult{Err: "socket: " + err.Error()}
	}
	defer unix.Close(fd)
	if mark != "" {
		m, _ := strconv.ParseUint(mark, 0, 32)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(m)); err != nil {
			return dialResult{Err: "SO_MARK: " + err.Error()}
		}
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 2})
	if err := unix.Connect(fd, sa); err != nil {
		return dialResult{Err: "connect: " + err.Error()}
	}
	var r dialResult
	peer, err := unix.Getpeername(fd)
	if err != nil {
		return dialResult{Err: "getpeername: " + err.Error()}
	}
	r.Peer = sockaddrString(peer)
	if udp {
		return r
	}
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(2 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		return dialResult{Err: "accept: " + err.Error()}
	}
	defer c.Close()
	r.AcceptedFrom, r.AcceptedLocal = c.RemoteAddr().String(), c.LocalAddr().String()
	if os.Getenv("EXCHANGE") != "" {
		// A request and a response, as a caller and the router exchange
		// them; with Redirect both travel socket to socket.
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})
		if _, err := unix.Write(fd, []byte("ping")); err != nil {
			return dialResult{Err: "caller write: " + err.Error()}
		}
		req := make([]byte, 4)
		if _, err := io.ReadFull(c, req); err != nil {
			return dialResult{Err: "router read: " + err.Error()}
		}
		if _, err := c.Write([]byte("pong")); err != nil {
			return dialResult{Err: "router write: " + err.Error()}
		}
		resp := make([]byte, 4)
		n, err := unix.Read(fd, resp)
		if err != nil {
			return dialResult{Err: "caller read: " + err.Error()}
		}
		r.Exchanged = string(req) + "/" + string(resp[:n])
	}
	return r
}

func sockaddrString(sa unix.Sockaddr) string {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port)).String()
	}
	return fmt.Sprint(sa)
}

// env is a test cgroup and bpffs pin directory, removed in Cleanup.
type env struct {
	cgroup string
	pinDir string
}

func newEnv(t *testing.T) env {
	t.Helper()
	if err := Probe(); errors.Is(err, ErrNotSupported) {
		t.Skipf("kernel lacks BPF steering support: %v", err)
	} else if err != nil {
		t.Fatalf("probe (these tests need root: CAP_BPF, CAP_SYS_ADMIN, CAP_NET_ADMIN): %v", err)
	}
	root, err := Cgroup2Mount()
	if errors.Is(err, ErrNotSupported) {
		t.Skipf("no cgroup2 hierarchy: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "skipper-bpftest-" + hex.EncodeToString(b[:])
	e := env{cgroup: filepath.Join(root, name), pinDir: filepath.Join("/sys/fs/bpf", name)}
	if e.cgroup == root {
		t.Fatal("refusing to use the root cgroup")
	}
	if err := os.Mkdir(e.cgroup, 0o755); err != nil {
		t.Fatalf("create test cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := os.Remove(e.cgroup); err != nil {
			t.Errorf("remove test cgroup: %v", err)
		}
	})
	if err := EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Cleanup(e.pinDir); err != nil {
			t.Errorf("cleanup pins: %v", err)
		}
	})
	return e
}

func (e env) load(t *testing.T, pinned bool, maxAge time.Duration) *Steering {
	t.Helper()
	opts := Options{Cgroup: e.cgroup, MaxAge: maxAge}
	if pinned {
		opts.PinDir = e.pinDir
	}
	s, err := Load(opts)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

type dialOpts struct {
	dst     netip.AddrPort
	v6      bool
	outside bool   // leave the child in the test's own cgroup
	mark    uint32 // SO_MARK on the dialling socket
	udp     bool
	// exchange: after the connect, caller and router exchange a request
	// and a response.
	exchange bool
}

// runChild dials from a fresh netns, in the test cgroup unless o.outside.
func (e env) runChild(t *testing.T, o dialOpts) dialResult {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "DIAL="+o.dst.String())
	if o.v6 {
		cmd.Env = append(cmd.Env, "FAMILY=6")
	}
	if o.udp {
		cmd.Env = append(cmd.Env, "UDP=1")
	}
	if o.exchange {
		cmd.Env = append(cmd.Env, "EXCHANGE=1")
	}
	if o.mark != 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("MARK=%d", o.mark))
	}
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if !o.outside {
		cg, err := os.Open(e.cgroup)
		if err != nil {
			t.Fatal(err)
		}
		defer cg.Close()
		attr.UseCgroupFD, attr.CgroupFD = true, int(cg.Fd())
	}
	cmd.SysProcAttr = attr
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	var r dialResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("child output %q: %v", out, err)
	}
	return r
}

// steered checks that a dial reached the router and looked like the VIP.
func steered(t *testing.T, s *Steering, r dialResult, wantPeer string) {
	t.Helper()
	if r.Err != "" {
		t.Fatalf("dial not steered: %s", r.Err)
	}
	if r.Peer != wantPeer {
		t.Errorf("getpeername = %s, want %s", r.Peer, wantPeer)
	}
	if r.AcceptedLocal != routerAddr {
		t.Errorf("router accepted on %s, want %s", r.AcceptedLocal, routerAddr)
	}
	if s == nil {
		return
	}
	got, ok, err := s.OriginalDestination(netip.MustParseAddrPort(r.AcceptedFrom))
	if err != nil || !ok || got != vip {
		t.Errorf("OriginalDestination(%s) = %v, %v, %v; want %v", r.AcceptedFrom, got, ok, err, vip)
	}
}

func untouched(t *testing.T, r dialResult) {
	t.Helper()
	want := "connect: " + unix.ENETUNREACH.Error()
	if r.Err != want {
		t.Fatalf("dial = %+v, want untouched (%q)", r, want)
	}
}

func counters(t *testing.T, s *Steering) Counters {
	t.Helper()
	c, err := s.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func setup(t *testing.T, s *Steering) {
	t.Helper()
	if err := s.SetVIPs([]netip.AddrPort{vip}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRouter(router); err != nil {
		t.Fatal(err)
	}
	if err := s.Heartbeat(); err != nil {
		t.Fatal(err)
	}
}

func TestSteering(t *testing.T) {
	e := newEnv(t)
	s := e.load(t, false, time.Minute)
	setup(t, s)

	mono := func() uint64 {
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		return uint64(ts.Nano())
	}
	// Steps run in order against one loaded Steering; each may change its
	// state first, and names the counter deltas it expects.
	steps := []struct {
		name    string
		before  func(t *testing.T)
		dial    dialOpts
		steered string // expected getpeername; "" = untouched
		want    Counters
	}{
		{name: "v4 VIP steered", dial: dialOpts{dst: vip}, steered: vip.String(), want: Counters{Rewrites: 1}},
		{name: "v4-mapped VIP steered", dial: dialOpts{dst: vip, v6: true}, steered: "[::ffff:198.19.0.10]:80", want: Counters{Rewrites: 1}},
		{name: "unmatched port untouched", dial: dialOpts{dst: vipOtherPt}},
		{name: "unmatched v4-mapped port untouched", dial: dialOpts{dst: vipOtherPt, v6: true}},
		{name: "UDP to the VIP untouched", dial: dialOpts{dst: vip, udp: true}},
		{name: "UDP to the v4-mapped VIP untouched", dial: dialOpts{dst: vip, v6: true, udp: true}},
		{name: "outside the cgroup untouched", dial: dialOpts{dst: vip, outside: true}},
		{name: "router's own marked socket untouched", dial: dialOpts{dst: vip, mark: DefaultSkipMark}, want: Counters{OwnSkips: 1}},
		{name: "other marks still steered", dial: dialOpts{dst: vip, mark: 7}, steered: vip.String(), want: Counters{Rewrites: 1}},
		{
			name:   "stale liveness fails open",
			before: func(t *testing.T) { mustNil(t, s.setLiveness(mono()-uint64(2*time.Minute))) },
			dial:   dialOpts{dst: vip},
			want:   Counters{FailOpens: 1},
		},
		{
			name: "stale liveness fails open v4-mapped",
			dial: dialOpts{dst: vip, v6: true},
			want: Counters{FailOpens: 1},
		},
		{
			name:    "fresh heartbeat steers again",
			before:  func(t *testing.T) { mustNil(t, s.Heartbeat()) },
			dial:    dialOpts{dst: vip},
			steered: vip.String(),
			want:    Counters{Rewrites: 1},
		},
		{
			name:   "future liveness fails open",
			before: func(t *testing.T) { mustNil(t, s.setLiveness(mono()+uint64(time.Hour))) },
			dial:   dialOpts{dst: vip},
			want:   Counters{FailOpens: 1},
		},
		{
			name:   "withdrawn router fails open",
			before: func(t *testing.T) { mustNil(t, s.Heartbeat()); mustNil(t, s.Withdraw()) },
			dial:   dialOpts{dst: vip},
			want:   Counters{FailOpens: 1},
		},
		{
			name:   "router unset: nothing rewritten or counted",
			before: func(t *testing.T) { mustNil(t, s.Heartbeat()); mustNil(t, s.SetRouter(netip.AddrPort{})) },
			dial:   dialOpts{dst: vip},
		},
		{
			name: "VIP removed by SetVIPs untouched",
			before: func(t *testing.T) {
				mustNil(t, s.SetRouter(router))
				mustNil(t, s.SetVIPs([]netip.AddrPort{vipOtherPt}))
			},
			dial: dialOpts{dst: vip},
		},
		{name: "VIP added by SetVIPs steered", dial: dialOpts{dst: vipOtherPt}, steered: vipOtherPt.String(), want: Counters{Rewrites: 1}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.before != nil {
				st.before(t)
			}
			c0 := counters(t, s)
			r := e.runChild(t, st.dial)
			if st.steered == "" {
				untouched(t, r)
			} else {
				check := s
				if st.dial.dst != vip {
					check = nil // OriginalDestination checked against vip only
				}
				steered(t, check, r, st.steered)
			}
			c1 := counters(t, s)
			got := Counters{Rewrites: c1.Rewrites - c0.Rewrites, FailOpens: c1.FailOpens - c0.FailOpens, OwnSkips: c1.OwnSkips - c0.OwnSkips}
			if diff := cmp.Diff(st.want, got); diff != "" {
				t.Errorf("counter deltas (-want +got):\n%s", diff)
			}
		})
	}
}

func mustNil(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// cgroupLinks returns the IDs of links attached to the cgroup with id cgID.
func cgroupLinks(t *testing.T, cgID uint64) []link.ID {
	t.Helper()
	var ids []link.ID
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil {
			continue
		}
		if cg := info.Cgroup(); cg != nil && cg.CgroupId == cgID {
			ids = append(ids, it.ID)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestPinnedAdoptionAndCleanup(t *testing.T) {
	e := newEnv(t)
	cgID, err := cgroupID(e.cgroup)
	mustNil(t, err)

	first := e.load(t, true, time.Minute)
	setup(t, first)
	before := cgroupLinks(t, cgID)
	if len(before) != len(attachments) {
		t.Fatalf("links on test cgroup = %v, want %d", before, len(attachments))
	}
	mustNil(t, first.Close())

	// The loader is gone; the pinned links and maps keep steering.
	t.Run("pinned links survive Close", func(t *testing.T) {
		if got := cgroupLinks(t, cgID); !cmp.Equal(before, got) {
			t.Fatalf("links after Close = %v, want %v", got, before)
		}
		steered(t, nil, e.runChild(t, dialOpts{dst: vip}), vip.String())
	})

	second := e.load(t, true, time.Minute)
	t.Run("second Load adopts links and maps", func(t *testing.T) {
		if got := cgroupLinks(t, cgID); !cmp.Equal(before, got) {
			t.Errorf("links after adoption = %v, want the same links %v", got, before)
		}
		// No SetVIPs/SetRouter/Heartbeat: the state came with the maps.
		steered(t, second, e.runChild(t, dialOpts{dst: vip}), vip.String())
		if c := counters(t, second); c.Rewrites != 2 {
			t.Errorf("rewrites = %d, want 2 (counted by both processes)", c.Rewrites)
		}
	})
	mustNil(t, second.Close())

	t.Run("Cleanup leaves nothing", func(t *testing.T) {
		mustNil(t, Cleanup(e.pinDir))
		if _, err := os.Stat(e.pinDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin dir after Cleanup: %v", err)
		}
		if got := cgroupLinks(t, cgID); len(got) != 0 {
			t.Errorf("links on test cgroup after Cleanup = %v", got)
		}
		untouched(t, e.runChild(t, dialOpts{dst: vip}))
		mustNil(t, Cleanup(e.pinDir)) // idempotent
	})
}

func TestCleanupDetachesLinksStillHeld(t *testing.T) {
	e := newEnv(t)
	cgID, err := cgroupID(e.cgroup)
	mustNil(t, err)
	s := e.load(t, true, time.Minute) // still open: a running router
	setup(t, s)
	mustNil(t, Cleanup(e.pinDir))
	if got := cgroupLinks(t, cgID); len(got) != 0 {
		t.Errorf("links on test cgroup after Cleanup = %v", got)
	}
	untouched(t, e.runChild(t, dialOpts{dst: vip}))
}

func TestPinnedLinkOnOtherCgroupReplaced(t *testing.T) {
	a, b := newEnv(t), newEnv(t)
	b.pinDir = a.pinDir
	aID, err := cgroupID(a.cgroup)
	mustNil(t, err)

	first := a.load(t, true, time.Minute)
	setup(t, first)
	mustNil(t, first.Close())

	second := b.load(t, true, time.Minute)
	if got := cgroupLinks(t, aID); len(got) != 0 {
		t.Errorf("links left on the old cgroup = %v", got)
	}
	untouched(t, a.runChild(t, dialOpts{dst: vip}))
	steered(t, second, b.runChild(t, dialOpts{dst: vip}), vip.String())
}

func TestLoadRejectsBadOptions(t *testing.T) {
	if _, err := Load(Options{}); err == nil {
		t.Error("Load without Cgroup succeeded")
	}
	if _, err := Load(Options{Cgroup: t.TempDir()}); err == nil {
		t.Error("Load on a non-cgroup2 directory succeeded")
	}
}

func TestAddr4RoundTrip(t *testing.T) {
	for _, s := range []string{"198.19.0.10:80", "169.254.20.20:8380", "[::ffff:1.2.3.4]:65535"} {
		ap := netip.MustParseAddrPort(s)
		k, err := toAddr4(ap)
		mustNil(t, err)
		want := netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if got := fromAddr4(k); got != want {
			t.Errorf("round trip %s = %s", s, got)
		}
	}
	// Network byte order in memory on bpfel: 198.19.0.10:80 is c6 13 00 0a / 00 50.
	k, _ := toAddr4(vip)
	if k.Ip != 0x0a0013c6 || k.Port != 0x5000 {
		t.Errorf("encoding = %#x/%#x", k.Ip, k.Port)
	}
	if _, err := toAddr4(netip.MustParseAddrPort("[2001:db8::1]:80")); err == nil {
		t.Error("IPv6 VIP accepted")
	}
}

func TestIncompatiblePinnedMapsReplaced(t *testing.T) {
	e := newEnv(t)
	mustNil(t, os.MkdirAll(e.pinDir, 0o700))
	// A "vips" map from some other version of steer.c.
	old, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{
		Name: "vips", Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1, Pinning: ebpf.PinByName,
	}, ebpf.MapOptions{PinPath: e.pinDir})
	mustNil(t, err)
	mustNil(t, old.Close())

	s := e.load(t, true, time.Minute)
	setup(t, s)
	steered(t, s, e.runChild(t, dialOpts{dst: vip}), vip.String())
}

func TestPinDirMustBeOnBPFFS(t *testing.T) {
	e := newEnv(t)
	_, err := Load(Options{Cgroup: e.cgroup, PinDir: t.TempDir()})
	if err == nil {
		t.Fatal("Load with a pin dir outside bpffs succeeded")
	}
}

// A heartbeat keeps steering on for MaxAge of the kernel's clock, then the
// connects fail open on their own: Heartbeat writes the clock bpf_ktime_get_ns
// reads, in the same unit.
func TestHeartbeatExpires(t *testing.T) {
	e := newEnv(t)
	const maxAge = 2 * time.Second
	s := e.load(t, false, maxAge)
	setup(t, s) // heartbeats
	steered(t, s, e.runChild(t, dialOpts{dst: vip}), vip.String())
	time.Sleep(maxAge + 100*time.Millisecond) // sleep: behaviour (the heartbeat ages out on the kernel's clock)
	c0 := counters(t, s)
	untouched(t, e.runChild(t, dialOpts{dst: vip}))
	if c1 := counters(t, s); c1.FailOpens != c0.FailOpens+1 {
		t.Errorf("fail-opens %d -> %d, want +1", c0.FailOpens, c1.FailOpens)
	}
}

// With Redirect, a steered caller and the router exchange payload socket to
// socket (sk_msg on the sockhash both joined); the bytes arrive intact and
// the redirect counter moves. Without it, nothing is redirected.
func TestRedirect(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("redirect=%v", on), func(t *testing.T) {
			e := newEnv(t)
			s, err := Load(Options{Cgroup: e.cgroup, MaxAge: time.Minute, Redirect: on})
			if errors.Is(err, ErrNotSupported) {
				t.Skipf("kernel lacks sk_msg redirect: %v", err)
			}
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			t.Cleanup(func() { s.Close() })
			setup(t, s)
			for _, v6 := range []bool{false, true} {
				dst := vip
				if v6 {
					dst = netip.AddrPortFrom(netip.AddrFrom16(vip.Addr().As16()), vip.Port())
				}
				before := counters(t, s)
				r := e.runChild(t, dialOpts{dst: dst, v6: v6, exchange: true})
				steered(t, s, r, dst.String())
				if r.Exchanged != "ping/pong" {
					t.Errorf("v6=%v: exchanged %q, want ping/pong", v6, r.Exchanged)
				}
				got := counters(t, s).Redirects - before.Redirects
				switch {
				case on && got < 2:
					t.Errorf("v6=%v: %d redirects, want ≥ 2 (request and response)", v6, got)
				case !on && got != 0:
					t.Errorf("v6=%v: %d redirects with Redirect off", v6, got)
				}
			}
		})
	}
}
