package noderouter

import (
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"skipper.dev/skipper/controller/flagenv"
	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/proto/skipperv1/tlsfiles"
	"skipper.dev/skipper/proto/skipperv1/tlsfiles/tlstest"
)

// The default name controllers' certificates carry: the controller Service.
const testServerName = "skipper-controller.skipper-system.svc"

// withControllerTLS loads --controller-tls-dir before the router runs, as
// Run does.
func withControllerTLS(t *testing.T) func(*router) {
	return func(rt *router) {
		if err := rt.loadControllerTLS(); err != nil {
			t.Fatal(err)
		}
	}
}

// A router with --controller-tls-dir talks to a TLS controller (its cold
// start and its stream); one without, or with another CA, gets nothing
// from it.
func TestControllersOverTLS(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	srvFiles, err := tlsfiles.Load(tlstest.NewDir(t, ca.Files(ca.Issue(t, testServerName))).Path, tlsfiles.Options{Cert: true})
	if err != nil {
		t.Fatal(err)
	}
	fake := startFakeController(t, grpc.Creds(srvFiles.ServerCredentials()))
	fake.handle("default/echo", fixed(1, inst("uid-1", startEcho(t, "uid-1"))))
	caOnly := map[string][]byte{tlsfiles.CAFile: ca.PEM}

	h := startRouter(t, fake, func(c *Config) { c.ControllerTLSDir = tlstest.NewDir(t, caOnly).Path }, withControllerTLS(t))
	if r := h.call(t, "default/echo"); r.status != 200 {
		t.Fatalf("cold call through a TLS controller: %d %s", r.status, r.body)
	}
	poll.Until(t, pollTimeout, pollInterval, "a Hello over TLS", fake.holds(func(f *fakeController) error { return poll.Unmet(len(f.hellos) > 0, "%d hellos", len(f.hellos)) }))
	for _, res := range []string{tlsReloadOK, tlsReloadError} {
		if v, ok := metricValue(t, h.rt, "skipper_noderouter_tls_reloads_total", "result", res); !ok || v != 0 {
			t.Errorf("tls_reloads_total{result=%q} = %v, %v; want 0, present", res, v, ok)
		}
	}

	calls := len(fake.getCalls())
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		prep   []func(*router)
	}{
		{"plaintext", nil, nil},
		{"another CA", func(c *Config) {
			c.ControllerTLSDir = tlstest.NewDir(t, map[string][]byte{tlsfiles.CAFile: tlstest.NewCA(t).PEM}).Path
		}, []func(*router){withControllerTLS(t)}},
		{"another server name", func(c *Config) {
			c.ControllerTLSDir, c.ControllerTLSServerName = tlstest.NewDir(t, caOnly).Path, "skipper-controller.elsewhere.svc"
		}, []func(*router){withControllerTLS(t)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startRouter(t, fake, func(c *Config) {
				c.ColdStartTimeout = 300 * time.Millisecond
				if tc.mutate != nil {
					tc.mutate(c)
				}
			}, tc.prep...)
			if r := h.call(t, "default/echo"); r.status != 503 {
				t.Fatalf("call: %d %s, want 503", r.status, r.body)
			}
			if got := len(fake.getCalls()); got != calls {
				t.Errorf("the controller answered %d GetInstance calls, want none", got-calls)
			}
		})
	}
}

// A --controller-tls-dir that cannot be used stops the router at start.
func TestRunControllerTLSDirBad(t *testing.T) {
	t.Parallel()
	dir := tlstest.NewDir(t, map[string][]byte{tlsfiles.CAFile: []byte("not PEM")}).Path
	err := Run(t.Context(), []string{"--node-name=n1", "--pod-name=r1", "--controller-addresses=127.0.0.1:1", "--controller-tls-dir=" + dir}, flagenv.Map(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--controller-tls-dir: tls: ca.crt in "+dir+": no PEM certificate") {
		t.Fatalf("Run: %v", err)
	}
}
