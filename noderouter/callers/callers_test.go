package callers

import (
	"fmt"
	"net/netip"
	"testing"
)

func TestPolicyAllows(t *testing.T) {
	p := NewPolicy([]string{"team-a"}, []string{"team-b/web", "team-bb/x"})
	tests := []struct {
		id   Identity
		want bool
	}{
		{Identity{Namespace: "team-a", ServiceAccount: "anything"}, true},
		{Identity{Namespace: "team-a"}, true},
		{Identity{Namespace: "team-b", ServiceAccount: "web"}, true},
		{Identity{Namespace: "team-b", ServiceAccount: "we"}, false},
		{Identity{Namespace: "team-b", ServiceAccount: "webx"}, false},
		{Identity{Namespace: "team-bb", ServiceAccount: "web"}, false},
		{Identity{Namespace: "team-b"}, false},
		{Identity{Namespace: "team", ServiceAccount: "b/web"}, false},
		{Identity{}, false},
	}
	for _, tt := range tests {
		if got := p.Allows(tt.id); got != tt.want {
			t.Errorf("Allows(%+v) = %v, want %v", tt.id, got, tt.want)
		}
	}
	var none *Policy
	if !none.Allows(Identity{}) {
		t.Error("a nil policy refuses a caller")
	}
	if NewPolicy(nil, []string{}) != nil {
		t.Error("empty lists give a policy")
	}
	if !p.Equal(NewPolicy([]string{"team-a"}, []string{"team-b/web", "team-bb/x"})) || p.Equal(nil) || !none.Equal(nil) ||
		p.Equal(NewPolicy([]string{"team-a"}, nil)) {
		t.Error("Equal")
	}
	if n := testing.AllocsPerRun(100, func() { p.Allows(Identity{Namespace: "team-bb", ServiceAccount: "x"}) }); n != 0 {
		t.Errorf("Allows allocates %v", n)
	}
}

func TestIndex(t *testing.T) {
	ip := netip.MustParseAddr
	a := Identity{Namespace: "ns", ServiceAccount: "a", Pod: "ns/a"}
	b := Identity{Namespace: "ns", ServiceAccount: "b", Pod: "ns/b"}
	var x Index
	if _, ok := x.Lookup(ip("10.0.0.1")); ok {
		t.Fatal("the zero index knows an IP")
	}
	x.Set("uid-a", a, []netip.Addr{ip("10.0.0.1"), ip("fd00::1")})
	if got, ok := x.Lookup(ip("::ffff:10.0.0.1")); !ok || got != a {
		t.Errorf("v4-mapped lookup = %+v %v", got, ok)
	}
	if got, ok := x.Lookup(ip("fd00::1")); !ok || got != a {
		t.Errorf("v6 lookup = %+v %v", got, ok)
	}
	// The pod's IP changes (a restart in place does not, but an update may
	// add or drop one).
	x.Set("uid-a", a, []netip.Addr{ip("10.0.0.2")})
	if _, ok := x.Lookup(ip("10.0.0.1")); ok {
		t.Error("an IP the pod gave up is still indexed")
	}
	// The IP is reused by a new pod before the old one's delete arrives:
	// the delete must not take it from the new pod.
	x.Set("uid-b", b, []netip.Addr{ip("10.0.0.2")})
	x.Delete("uid-a")
	if got, ok := x.Lookup(ip("10.0.0.2")); !ok || got != b {
		t.Errorf("after the old pod's delete, 10.0.0.2 = %+v %v, want b", got, ok)
	}
	// A pod that loses its IPs (it stopped) leaves.
	x.Set("uid-b", b, nil)
	if x.Len() != 0 {
		t.Errorf("%d IPs left, want 0", x.Len())
	}
	x.Set("uid-b", b, []netip.Addr{ip("10.0.0.3")})
	if n := testing.AllocsPerRun(100, func() { x.Lookup(ip("10.0.0.3")) }); n != 0 {
		t.Errorf("Lookup allocates %v", n)
	}
}

// BenchmarkCallerCheck is the caller check's work per request on the warm
// path: the caller's lookup in an index of 10,000 pods and the policy's
// decision (3 namespaces, 3 ServiceAccounts, the caller's last), run from
// every P at once as the event loops do.
func BenchmarkCallerCheck(b *testing.B) {
	var x Index
	for i := range 10000 {
		ip := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		x.Set(fmt.Sprintf("uid-%d", i), NewIdentity("other", "default", fmt.Sprintf("p-%d", i)), []netip.Addr{ip})
	}
	caller := netip.MustParseAddr("10.2.0.1")
	x.Set("uid-caller", NewIdentity("default", "bench", "bench"), []netip.Addr{caller})
	p := NewPolicy([]string{"team-a", "team-b", "team-c"}, []string{"team-d/web", "team-e/batch", "default/bench"})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id, ok := x.Lookup(caller)
			if !ok || !p.Allows(id) {
				b.Fatal("refused")
			}
		}
	})
}
