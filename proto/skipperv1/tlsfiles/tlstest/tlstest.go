package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"skipper.dev/skipper/proto/skipperv1/tlsfiles"
)

// validity is how long the certificates live around now.
const validity = time.Hour

// CA is a certificate authority for one test.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate, as ca.crt holds it.
	PEM []byte
}

// NewCA makes a self-signed CA.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "skipper test CA"},
		NotBefore:             time.Now().Add(-validity),
		NotAfter:              time.Now().Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	cert, der := create(t, tmpl, tmpl, key, key)
	return &CA{Cert: cert, key: key, PEM: pemBlock("CERTIFICATE", der)}
}

// Leaf is a serving certificate and its key, in PEM.
type Leaf struct {
	Serial  *big.Int
	CertPEM []byte
	KeyPEM  []byte
}

// Issue signs a serving certificate for dnsNames with a fresh key.
func (c *CA) Issue(t testing.TB, dnsNames ...string) Leaf {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: dnsNames[0]},
		DNSNames:     dnsNames,
		NotBefore:    time.Now().Add(-validity),
		NotAfter:     time.Now().Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	_, der := create(t, tmpl, c.Cert, key, c.key)
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Leaf{Serial: tmpl.SerialNumber, CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("EC PRIVATE KEY", kb)}
}

// Files are the three files of a cert-manager Secret holding l.
func (c *CA) Files(l Leaf) map[string][]byte {
	return map[string][]byte{tlsfiles.CertFile: l.CertPEM, tlsfiles.KeyFile: l.KeyPEM, tlsfiles.CAFile: c.PEM}
}

// Dir is a directory laid out as the kubelet writes a Secret volume.
type Dir struct {
	t    testing.TB
	Path string
	gen  int
}

// NewDir makes a Secret-volume directory holding files.
func NewDir(t testing.TB, files map[string][]byte) *Dir {
	t.Helper()
	d := &Dir{t: t, Path: t.TempDir()}
	d.Write(files)
	return d
}

// Write swaps in a new generation holding files, as the kubelet does:
// the new files go to a directory of their own, and ..data is renamed to
// point at it. A name not in files keeps its link, which then dangles.
func (d *Dir) Write(files map[string][]byte) {
	d.t.Helper()
	d.gen++
	gen := fmt.Sprintf("..gen_%d", d.gen)
	if err := os.Mkdir(filepath.Join(d.Path, gen), 0o755); err != nil {
		d.t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(d.Path, gen, name), b, 0o600); err != nil {
			d.t.Fatal(err)
		}
		link := filepath.Join(d.Path, name)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				d.t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(d.Path, "..data_tmp")
	if err := os.Symlink(gen, tmp); err != nil {
		d.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.Path, "..data")); err != nil {
		d.t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func create(t testing.TB, tmpl, parent *x509.Certificate, key, signer *ecdsa.PrivateKey) (*x509.Certificate, []byte) {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, der
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
