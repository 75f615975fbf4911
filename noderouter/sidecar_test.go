package noderouter

import (
	"testing"

	"skipper.dev/skipper/internal/poll"
)

// TestSidecarMode: a sidecar router routes like a DaemonSet one and says
// so in its Hello.
func TestSidecarMode(t *testing.T) {
	t.Parallel()
	fake := startFakeController(t)
	fake.handle("default/echo", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	h := startRouter(t, fake, func(c *Config) {
		c.Mode = ModeSidecar
		c.Listen, c.AdminListen, c.LocalAddress, c.BPF = SidecarListen, SidecarAdminListen, "", BPFOff
	})
	if r := h.call(t, "default/echo"); r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	poll.Until(t, pollTimeout, pollInterval, "a hello", fake.holds(func(f *fakeController) error { return poll.Unmet(len(f.hellos) > 0, "%d hellos", len(f.hellos)) }))
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if m := fake.hellos[0].GetRouter().GetMode(); m != ModeSidecar {
		t.Errorf("hello mode = %q, want %q", m, ModeSidecar)
	}
}
