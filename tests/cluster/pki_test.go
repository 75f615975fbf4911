package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/tools/clientcmd"
)

func TestPKIGenerate(t *testing.T) {
	dir := t.TempDir()
	p := PKI{Dir: dir, Server: "https://198.51.100.1:6443"}
	now := time.Now()
	if err := p.Generate(DefaultTopology(), 2, now); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(readCert(t, p.Path("ca.crt")))

	t.Run("apiserver serves every SAN", func(t *testing.T) {
		cert := readCert(t, p.Path("apiserver.crt"))
		for _, name := range []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local", "198.51.100.1", "198.19.0.1", "127.0.0.1"} {
			_, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, CurrentTime: now,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			if err != nil {
				t.Errorf("verify for %s: %v", name, err)
			}
		}
		if _, err := tls.LoadX509KeyPair(p.Path("apiserver.crt"), p.Path("apiserver.key")); err != nil {
			t.Errorf("key pair: %v", err)
		}
	})

	tests := []struct {
		name    string
		file    string
		wantCN  string
		wantOrg []string
	}{
		{"admin", "admin", "skipper-admin", []string{"system:masters"}},
		{"controller manager", "kube-controller-manager", "system:kube-controller-manager", nil},
		{"scheduler", "kube-scheduler", "system:kube-scheduler", nil},
		{"kube-proxy", "kube-proxy", "system:kube-proxy", nil},
		{"node 1", "node1", "system:node:node1", []string{"system:nodes"}},
		{"node 2", "node2", "system:node:node2", []string{"system:nodes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cert := readCert(t, p.Path(tt.file+".crt"))
			if diff := cmp.Diff(tt.wantCN, cert.Subject.CommonName); diff != "" {
				t.Errorf("CN (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantOrg, cert.Subject.Organization); diff != "" {
				t.Errorf("O (-want +got):\n%s", diff)
			}
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("verify client cert: %v", err)
			}
			cfg, err := clientcmd.BuildConfigFromFlags("", p.Kubeconfig(tt.file))
			if err != nil {
				t.Fatalf("kubeconfig: %v", err)
			}
			if cfg.Host != p.Server || cfg.CertFile != p.Path(tt.file+".crt") {
				t.Errorf("kubeconfig host %q cert %q", cfg.Host, cfg.CertFile)
			}
		})
	}

	t.Run("service-account keys", func(t *testing.T) {
		data, err := os.ReadFile(p.Path("sa.pub"))
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(data)
		if block == nil || block.Type != "PUBLIC KEY" {
			t.Fatalf("sa.pub is not a PEM public key")
		}
		if _, err := x509.ParsePKIXPublicKey(block.Bytes); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(p.Path("sa.key"))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("sa.key mode %v, want 0600", st.Mode().Perm())
		}
	})
}

func TestAPIServerSpecIPs(t *testing.T) {
	got := APIServerSpec(DefaultTopology()).IPs
	want := []net.IP{net.ParseIP("198.51.100.1").To4(), net.ParseIP("198.19.0.1").To4(), net.IPv4(127, 0, 0, 1)}
	for i := range want {
		if !got[i].Equal(want[i]) {
			t.Errorf("IP %d = %s, want %s", i, got[i], want[i])
		}
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
