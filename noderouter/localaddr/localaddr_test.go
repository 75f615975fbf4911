//go:build linux

package localaddr

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	"skipper.dev/skipper/internal/poll"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPlan(t *testing.T) {
	tests := []struct {
		name      string
		o         Observed
		want      Actions
		wantWhere Where
	}{
		{name: "nothing yet", want: Actions{CreateDummy: true, SetDummyUp: true, AddDummyAddr: true}, wantWhere: WhereDummy},
		{name: "dummy complete", o: Observed{DummyExists: true, DummyUp: true, DummyHasAddr: true}, wantWhere: WhereDummy},
		{name: "dummy down", o: Observed{DummyExists: true, DummyHasAddr: true}, want: Actions{SetDummyUp: true}, wantWhere: WhereDummy},
		{name: "dummy lost its address", o: Observed{DummyExists: true, DummyUp: true}, want: Actions{AddDummyAddr: true}, wantWhere: WhereDummy},
		{name: "leftover on lo removed once the dummy has it", o: Observed{DummyExists: true, DummyUp: true, DummyHasAddr: true, LoUp: true, LoHasAddr: true},
			want: Actions{RemoveLoAddr: true}, wantWhere: WhereDummy},
		{name: "unsupported: add to lo", o: Observed{DummyUnsupported: true, LoUp: true}, want: Actions{AddLoAddr: true}, wantWhere: WhereLoopback},
		{name: "unsupported: lo down too", o: Observed{DummyUnsupported: true}, want: Actions{SetLoUp: true, AddLoAddr: true}, wantWhere: WhereLoopback},
		{name: "unsupported: complete", o: Observed{DummyUnsupported: true, LoUp: true, LoHasAddr: true}, wantWhere: WhereLoopback},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, where := Plan(tt.o)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
			if where != tt.wantWhere {
				t.Errorf("where = %q, want %q", where, tt.wantWhere)
			}
		})
	}
}

// freshNetns returns a netlink handle in a new network namespace, closed
// (and the namespace gone) in Cleanup. The root namespace is never touched.
func freshNetns(t *testing.T) *netlink.Handle {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_ADMIN for a network namespace, CAP_NET_ADMIN for links)")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // unshares this thread into the new namespace
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("new netns: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		// Left locked, the thread exits with the goroutine instead of
		// serving others in the wrong namespace.
		t.Fatalf("restore netns: %v", err)
	}
	runtime.UnlockOSThread()
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// state lists, in the handle's namespace, the links named skipper0 and the
// wanted address's label on each link.
func state(t *testing.T, h *netlink.Handle, addr netip.Addr) (dummy bool, labels map[string]string) {
	t.Helper()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	labels = map[string]string{}
	for _, l := range links {
		if l.Attrs().Name == DummyLink {
			dummy = true
		}
		addrs, err := h.AddrList(l, unix.AF_INET)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if ip, _ := netip.AddrFromSlice(a.IP); ip.Unmap() == addr {
				labels[l.Attrs().Name] = a.Label
			}
		}
	}
	return dummy, labels
}

func TestEnsureRemove(t *testing.T) {
	h := freshNetns(t)
	addr := netip.MustParseAddr("169.254.20.20")
	m := &Manager{Addr: addr, Handle: h}

	where, a, err := m.Ensure()
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if a.None() {
		t.Error("first Ensure changed nothing")
	}
	dummy, labels := state(t, h, addr)
	switch where {
	case WhereDummy:
		if !dummy || labels[DummyLink] == "" {
			t.Errorf("on dummy: link %v, labels %v", dummy, labels)
		}
	case WhereLoopback:
		// CONFIG_DUMMY off (this CI machine): the fallback.
		if dummy || labels["lo"] != LoopbackLabel {
			t.Errorf("on lo: dummy link %v, labels %v; want only lo with %q", dummy, labels, LoopbackLabel)
		}
		lo, err := h.LinkByName("lo")
		if err != nil {
			t.Fatal(err)
		}
		if lo.Attrs().Flags&net.FlagUp == 0 {
			t.Error("lo is down")
		}
	default:
		t.Fatalf("where = %q", where)
	}
	t.Logf("address on %s", where)

	where2, a2, err := m.Ensure()
	if err != nil || where2 != where || !a2.None() {
		t.Errorf("second Ensure = %q, %+v, %v; want %q, no changes, nil", where2, a2, err, where)
	}

	// Someone removes the address: the next Ensure restores it.
	if where == WhereLoopback {
		lo, _ := h.LinkByName("lo")
		a, _ := m.addr(LoopbackLabel)
		if err := h.AddrDel(lo, a); err != nil {
			t.Fatal(err)
		}
		if _, a3, err := m.Ensure(); err != nil || a3 != (Actions{AddLoAddr: true}) {
			t.Errorf("restore = %+v, %v", a3, err)
		}
	}

	if err := m.Remove(); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if dummy, labels := state(t, h, addr); dummy || len(labels) != 0 {
		t.Errorf("after Remove: dummy link %v, address on %v", dummy, labels)
	}
	if err := m.Remove(); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

func TestEnsureRejectsIPv6(t *testing.T) {
	_, _, err := (&Manager{Addr: netip.MustParseAddr("fd00::1")}).Ensure()
	if err == nil || errors.Is(err, unix.EPERM) {
		t.Fatalf("err = %v, want not IPv4", err)
	}
}

// TestRunRestores checks that the reconcile loop puts back an address
// someone removed, and ends with its context.
func TestRunRestores(t *testing.T) {
	h := freshNetns(t)
	addr := netip.MustParseAddr("169.254.20.20")
	m := &Manager{Addr: addr, Handle: h}
	if _, _, err := m.Ensure(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Remove() })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx, 10*time.Millisecond, slog.New(slog.DiscardHandler)) }()
	defer func() { cancel(); <-done }()

	if err := (&Manager{Addr: addr, Handle: h}).Remove(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, 10*time.Millisecond, "the address restored", func(context.Context) error {
		if _, labels := state(t, h, addr); len(labels) != 1 {
			return fmt.Errorf("labels %v", labels)
		}
		return nil
	})
}
