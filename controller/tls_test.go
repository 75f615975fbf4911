package controller

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"skipper.dev/skipper/internal/poll"
	skipperv1 "skipper.dev/skipper/proto/skipperv1"
	"skipper.dev/skipper/proto/skipperv1/tlsfiles"
	"skipper.dev/skipper/proto/skipperv1/tlsfiles/tlstest"
)

// testTransport is what a test's client dials a replica with: TLS
// verified against cfg's ca.crt when cfg has --tls-dir, plaintext
// otherwise.
func testTransport(t *testing.T, cfg Config) credentials.TransportCredentials {
	t.Helper()
	if cfg.TLSDir == "" {
		return insecure.NewCredentials()
	}
	f, err := tlsfiles.Load(cfg.TLSDir, tlsfiles.Options{CA: true})
	if err != nil {
		t.Fatal(err)
	}
	return f.ClientCredentials(cfg.tlsServerName())
}

// The default name replicas' certificates carry: the controller Service.
const testServerName = "skipper-controller." + systemNS + ".svc"

// Two replicas with --tls-dir: a router's call to the one that does not
// own the function is forwarded over TLS and answered by the owner; a
// plaintext client is refused; a rotated certificate is served at the
// next handshake.
func TestForwardsOverTLS(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t)
	ca := tlstest.NewCA(t)
	l1 := ca.Issue(t, testServerName)
	dir := tlstest.NewDir(t, ca.Files(l1))
	withTLS := func(c *Config) { c.TLSDir = dir.Path }
	a, name := forwardingPair(t, e, withTLS)

	var p peer.Peer
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := a.client.GetInstance(ctx, &skipperv1.GetInstanceRequest{Function: &skipperv1.FunctionRef{Namespace: "default", Name: name}}, grpc.Peer(&p))
	if err != nil {
		t.Fatalf("GetInstance via A over TLS: %v", err)
	}
	if resp.GetOwner() != "ctl-b" {
		t.Errorf("owner %q, want ctl-b (forwarded over TLS)", resp.GetOwner())
	}
	if got := peerSerial(t, &p); got != l1.Serial.String() {
		t.Errorf("A presented serial %s, want %s", got, l1.Serial)
	}

	plain, err := grpc.NewClient("passthrough:///"+a.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	_, err = skipperv1.NewControllerClient(plain).GetInstance(ctx, &skipperv1.GetInstanceRequest{Function: &skipperv1.FunctionRef{Namespace: "default", Name: name}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext GetInstance: %v, want Unavailable", err)
	}

	l2 := ca.Issue(t, testServerName)
	dir.Write(ca.Files(l2))
	// Rechecks are a second apart: poll new connections until A serves l2.
	poll.Until(t, pollTimeout, pollInterval, "A serving the rotated certificate", func(context.Context) error {
		cc, err := grpc.NewClient("passthrough:///"+a.addr, grpc.WithTransportCredentials(testTransport(t, Config{TLSDir: dir.Path, ControllerService: "skipper-controller", PodNamespace: systemNS})))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		var p peer.Peer
		if _, err := skipperv1.NewControllerClient(cc).GetState(ctx, &skipperv1.GetStateRequest{}, grpc.Peer(&p)); err != nil {
			t.Fatalf("GetState over TLS: %v", err)
		}
		if got := peerSerial(t, &p); got != l2.Serial.String() {
			return fmt.Errorf("certificate serial %s, want %s", got, l2.Serial)
		}
		return nil
	})
	_, ma := httpGetBody(t, a.httpAddr, "/metrics")
	for _, want := range []string{`skipper_controller_tls_reloads_total{result="ok"} 1`, `skipper_controller_tls_reloads_total{result="error"} 0`} {
		if !strings.Contains(ma, want) {
			t.Errorf("A's metrics lack %q:\n%s", want, grepLines(ma, "tls_reloads"))
		}
	}
}

func peerSerial(t *testing.T, p *peer.Peer) string {
	t.Helper()
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		t.Fatalf("peer auth %T, want TLS", p.AuthInfo)
	}
	return info.State.PeerCertificates[0].SerialNumber.String()
}

// A --tls-dir that cannot serve stops the replica at start with the
// reason.
func TestTLSStartErrors(t *testing.T) {
	t.Parallel()
	ca := tlstest.NewCA(t)
	good := ca.Files(ca.Issue(t, testServerName))
	noKey := ca.Files(ca.Issue(t, testServerName))
	delete(noKey, tlsfiles.KeyFile)
	noCA := ca.Files(ca.Issue(t, testServerName))
	delete(noCA, tlsfiles.CAFile)
	for _, tc := range []struct {
		name   string
		files  map[string][]byte
		modify func(*Config)
		want   string
	}{
		{"no key", noKey, nil, "--tls-dir: tls: read tls.key"},
		{"no CA", noCA, nil, "--tls-dir: tls: read ca.crt"},
		{"another name", ca.Files(ca.Issue(t, "other.example.svc")), nil, "tls.crt must name the controllers as --tls-server-name says"},
		{"another server name", good, func(c *Config) { c.TLSServerName = "ctl.elsewhere.svc" }, "valid for " + testServerName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t)
			cfg := validConfig()
			cfg.PodNamespace = systemNS
			cfg.TLSDir = tlstest.NewDir(t, tc.files).Path
			if tc.modify != nil {
				tc.modify(&cfg)
			}
			log := slog.New(slog.NewTextHandler(t.Output(), nil))
			err := serve(t.Context(), cfg, log, clients{core: e.core, dyn: e.dyn}, listen(t), listen(t))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("serve: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
