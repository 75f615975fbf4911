package tlsfiles_test

import (
	"context"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"skipper.dev/skipper/proto/skipperv1/tlsfiles"
	"skipper.dev/skipper/proto/skipperv1/tlsfiles/tlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serverName is the name the controllers' certificates carry.
const serverName = "skipper-controller.skipper-system.svc"

// reloads records the errors Options.Reloaded reports.
type reloads struct {
	mu   sync.Mutex
	errs []error
}

func (r *reloads) record(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

func (r *reloads) get() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

// serve runs a gRPC health server on loopback with creds and returns its
// address.
func serve(t *testing.T, creds credentials.TransportCredentials) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

// call makes one health check on a new connection (so a new handshake)
// and returns the serial of the certificate the server presented.
func call(t *testing.T, addr string, creds credentials.TransportCredentials) (*big.Int, error) {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return nil, err
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		t.Fatalf("peer auth info %T, want TLS", p.AuthInfo)
	}
	return info.State.PeerCertificates[0].SerialNumber, nil
}

func mustCall(t *testing.T, addr string, creds credentials.TransportCredentials) *big.Int {
	t.Helper()
	s, err := call(t, addr, creds)
	if err != nil {
		t.Fatalf("call over TLS: %v", err)
	}
	return s
}

func load(t *testing.T, dir string, opts tlsfiles.Options) *tlsfiles.Files {
	t.Helper()
	f, err := tlsfiles.Load(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// A rotated certificate is presented at the next handshake, and a client
// whose ca.crt rotated verifies against the new CA; no restart.
func TestRotation(t *testing.T) {
	ca1 := tlstest.NewCA(t)
	l1 := ca1.Issue(t, serverName)
	srvDir := tlstest.NewDir(t, ca1.Files(l1))
	var srvReloads reloads
	srv := load(t, srvDir.Path, tlsfiles.Options{Cert: true, CA: true, Reloaded: srvReloads.record})
	addr := serve(t, srv.ServerCredentials())
	cliDir := tlstest.NewDir(t, map[string][]byte{tlsfiles.CAFile: ca1.PEM})
	cli := load(t, cliDir.Path, tlsfiles.Options{CA: true}).ClientCredentials(serverName)

	if got := mustCall(t, addr, cli); got.Cmp(l1.Serial) != 0 {
		t.Fatalf("first handshake: serial %v, want %v", got, l1.Serial)
	}

	// Same CA, new leaf.
	l2 := ca1.Issue(t, serverName)
	srvDir.Write(ca1.Files(l2))
	if got := mustCall(t, addr, cli); got.Cmp(l2.Serial) != 0 {
		t.Fatalf("after rotating the leaf: serial %v, want %v", got, l2.Serial)
	}
	if got := srv.Leaf().SerialNumber; got.Cmp(l2.Serial) != 0 {
		t.Errorf("Leaf() serial %v, want %v", got, l2.Serial)
	}

	// New CA: the client's bundle carries both during the switch, as
	// trust-manager or an operator would roll it.
	ca2 := tlstest.NewCA(t)
	cliDir.Write(map[string][]byte{tlsfiles.CAFile: append(append([]byte(nil), ca1.PEM...), ca2.PEM...)})
	l3 := ca2.Issue(t, serverName)
	srvDir.Write(ca2.Files(l3))
	if got := mustCall(t, addr, cli); got.Cmp(l3.Serial) != 0 {
		t.Fatalf("after rotating the CA: serial %v, want %v", got, l3.Serial)
	}
	if got := srvReloads.get(); len(got) != 2 || got[0] != nil || got[1] != nil {
		t.Errorf("server reloads %v, want two successful", got)
	}
}

// Bad files on reload are reported once and the last good set keeps
// serving until good files come back.
func TestBadReloadKeepsLastGood(t *testing.T) {
	ca1 := tlstest.NewCA(t)
	l1 := ca1.Issue(t, serverName)
	other := ca1.Issue(t, serverName)
	srvDir := tlstest.NewDir(t, ca1.Files(l1))
	var rel reloads
	srv := load(t, srvDir.Path, tlsfiles.Options{Cert: true, Reloaded: rel.record})
	addr := serve(t, srv.ServerCredentials())
	cliDir := tlstest.NewDir(t, map[string][]byte{tlsfiles.CAFile: ca1.PEM})
	cli := load(t, cliDir.Path, tlsfiles.Options{CA: true}).ClientCredentials(serverName)

	for _, tc := range []struct {
		name  string
		files map[string][]byte
		want  string
	}{
		{"key of another certificate", map[string][]byte{tlsfiles.CertFile: l1.CertPEM, tlsfiles.KeyFile: other.KeyPEM}, "private key does not match public key"},
		{"garbage certificate", map[string][]byte{tlsfiles.CertFile: []byte("junk"), tlsfiles.KeyFile: l1.KeyPEM}, "failed to find any PEM data in certificate input"},
		{"empty key", map[string][]byte{tlsfiles.CertFile: l1.CertPEM, tlsfiles.KeyFile: nil}, "failed to find any PEM data in key input"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(rel.get())
			srvDir.Write(tc.files)
			for range 2 { // the second handshake reads the same bad content: not reported again
				if got := mustCall(t, addr, cli); got.Cmp(l1.Serial) != 0 {
					t.Fatalf("serial %v, want the last good %v", got, l1.Serial)
				}
			}
			got := rel.get()[before:]
			if len(got) != 1 || got[0] == nil || !strings.Contains(got[0].Error(), tc.want) {
				t.Fatalf("reloads %v, want one error containing %q", got, tc.want)
			}
		})
	}

	l2 := ca1.Issue(t, serverName)
	srvDir.Write(ca1.Files(l2))
	if got := mustCall(t, addr, cli); got.Cmp(l2.Serial) != 0 {
		t.Fatalf("after good files: serial %v, want %v", got, l2.Serial)
	}
	if got := rel.get(); got[len(got)-1] != nil {
		t.Errorf("last reload %v, want success", got[len(got)-1])
	}
}

// A file removed on reload (a Secret volume half torn down) keeps the last
// good set too.
func TestMissingFileOnReloadKeepsLastGood(t *testing.T) {
	ca1 := tlstest.NewCA(t)
	l1 := ca1.Issue(t, serverName)
	dir := t.TempDir()
	for n, b := range ca1.Files(l1) {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var rel reloads
	srv := load(t, dir, tlsfiles.Options{Cert: true, Reloaded: rel.record})
	addr := serve(t, srv.ServerCredentials())
	cli := load(t, dir, tlsfiles.Options{CA: true}).ClientCredentials(serverName)
	if err := os.Remove(filepath.Join(dir, tlsfiles.KeyFile)); err != nil {
		t.Fatal(err)
	}
	if got := mustCall(t, addr, cli); got.Cmp(l1.Serial) != 0 {
		t.Fatalf("serial %v, want the last good %v", got, l1.Serial)
	}
	if got := rel.get(); len(got) != 1 || !strings.Contains(fmt.Sprint(got[0]), "read tls.key") {
		t.Fatalf("reloads %v, want one error reading tls.key", got)
	}
}

// Within Recheck the files are not read again.
func TestRecheck(t *testing.T) {
	ca1 := tlstest.NewCA(t)
	l1 := ca1.Issue(t, serverName)
	srvDir := tlstest.NewDir(t, ca1.Files(l1))
	srv := load(t, srvDir.Path, tlsfiles.Options{Cert: true, Recheck: time.Hour})
	addr := serve(t, srv.ServerCredentials())
	cli := load(t, srvDir.Path, tlsfiles.Options{CA: true}).ClientCredentials(serverName)
	srvDir.Write(ca1.Files(ca1.Issue(t, serverName)))
	if got := mustCall(t, addr, cli); got.Cmp(l1.Serial) != 0 {
		t.Fatalf("serial %v, want %v until the recheck", got, l1.Serial)
	}
}

// What a TLS server and a TLS client refuse.
func TestRefused(t *testing.T) {
	ca1 := tlstest.NewCA(t)
	srvDir := tlstest.NewDir(t, ca1.Files(ca1.Issue(t, serverName)))
	addr := serve(t, load(t, srvDir.Path, tlsfiles.Options{Cert: true}).ServerCredentials())
	good := load(t, srvDir.Path, tlsfiles.Options{CA: true})
	otherCA := tlstest.NewDir(t, map[string][]byte{tlsfiles.CAFile: tlstest.NewCA(t).PEM})

	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
		want  string
	}{
		{"plaintext client", insecure.NewCredentials(), ""},
		{"another CA", load(t, otherCA.Path, tlsfiles.Options{CA: true}).ClientCredentials(serverName), "certificate signed by unknown authority"},
		{"another server name", good.ClientCredentials("skipper-controller.elsewhere.svc"), "certificate is valid for " + serverName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := call(t, addr, tc.creds)
			if status.Code(err) != codes.Unavailable || !strings.Contains(fmt.Sprint(err), tc.want) {
				t.Fatalf("call: %v, want Unavailable containing %q", err, tc.want)
			}
		})
	}
	// And the good client is served.
	mustCall(t, addr, good.ClientCredentials(serverName))
}

// Load fails at start on anything that cannot serve, naming the file.
func TestLoadErrors(t *testing.T) {
	ca1 := tlstest.NewCA(t)
	l1 := ca1.Issue(t, serverName)
	l2 := ca1.Issue(t, serverName)
	for _, tc := range []struct {
		name  string
		files map[string][]byte
		opts  tlsfiles.Options
		want  string
	}{
		{"no certificate", map[string][]byte{tlsfiles.KeyFile: l1.KeyPEM}, tlsfiles.Options{Cert: true}, "read tls.crt"},
		{"no key", map[string][]byte{tlsfiles.CertFile: l1.CertPEM}, tlsfiles.Options{Cert: true}, "read tls.key"},
		{"mismatched key", map[string][]byte{tlsfiles.CertFile: l1.CertPEM, tlsfiles.KeyFile: l2.KeyPEM}, tlsfiles.Options{Cert: true}, "tls.crt and tls.key"},
		{"no CA", map[string][]byte{tlsfiles.CertFile: l1.CertPEM, tlsfiles.KeyFile: l1.KeyPEM}, tlsfiles.Options{Cert: true, CA: true}, "read ca.crt"},
		{"CA not PEM", map[string][]byte{tlsfiles.CAFile: []byte("junk")}, tlsfiles.Options{CA: true}, "ca.crt in"},
		{"nothing asked", map[string][]byte{tlsfiles.CAFile: ca1.PEM}, tlsfiles.Options{}, "nothing to load"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tlstest.NewDir(t, tc.files)
			_, err := tlsfiles.Load(d.Path, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// A client-only directory needs no pair.
	d := tlstest.NewDir(t, map[string][]byte{tlsfiles.CAFile: ca1.PEM})
	if f := load(t, d.Path, tlsfiles.Options{CA: true}); f.Leaf() != nil {
		t.Errorf("Leaf() of a CA-only set: %v, want nil", f.Leaf())
	}
}
