package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// certValidity is how long the per-run certificates live: runs are short,
// but a long-lived dev cluster must not expire under a developer.
const certValidity = 30 * 24 * time.Hour

// CertSpec describes one leaf certificate.
type CertSpec struct {
	// Name is the file stem: <Name>.crt and <Name>.key.
	Name string
	CN   string
	Org  []string
	DNS  []string
	IPs  []net.IP
	// Server marks a serving certificate; otherwise it is a client one.
	Server bool
}

// CA is a certificate authority held in memory.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA makes a self-signed CA valid from now.
func NewCA(cn string, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ca key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("ca cert: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("ca cert: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Issue signs a leaf certificate for spec with a fresh ECDSA P-256 key.
func (ca *CA) Issue(spec CertSpec, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("%s key: %w", spec.Name, err)
	}
	usage := x509.ExtKeyUsageClientAuth
	if spec.Server {
		usage = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: spec.CN, Organization: spec.Org},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     spec.DNS,
		IPAddresses:  spec.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("%s cert: %w", spec.Name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("%s cert: %w", spec.Name, err)
	}
	return cert, key, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}

// PKI is the set of files one run generates under Dir.
type PKI struct {
	Dir string
	// Server is the API server URL written into every kubeconfig.
	Server string
}

// Path returns the absolute path of a file in the PKI directory.
func (p PKI) Path(name string) string { return filepath.Join(p.Dir, name) }

// Kubeconfig is the path of the kubeconfig for the named identity.
func (p PKI) Kubeconfig(name string) string { return p.Path(name + ".kubeconfig") }

// ClientSpecs are the client identities of the cluster for nodes 1..nodes.
func ClientSpecs(nodes int) []CertSpec {
	specs := []CertSpec{
		{Name: "admin", CN: "skipper-admin", Org: []string{"system:masters"}},
		{Name: "kube-controller-manager", CN: "system:kube-controller-manager"},
		{Name: "kube-scheduler", CN: "system:kube-scheduler"},
		// Every node's kube-proxy; the default RBAC binds it to system:node-proxier.
		{Name: "kube-proxy", CN: "system:kube-proxy"},
		// The API server's identity towards kubelets (logs, exec, port-forward).
		{Name: "apiserver-kubelet-client", CN: "kube-apiserver-kubelet-client", Org: []string{"system:masters"}},
	}
	for n := 1; n <= nodes; n++ {
		node := NodeName(n)
		specs = append(specs, CertSpec{Name: node, CN: "system:node:" + node, Org: []string{"system:nodes"}})
	}
	return specs
}

// APIServerSpec is the API server's serving certificate.
func APIServerSpec(t Topology) CertSpec {
	svc := t.ServiceCIDR.Masked().Addr().Next() // the kubernetes Service's ClusterIP
	return CertSpec{
		Name:   "apiserver",
		CN:     "kube-apiserver",
		Server: true,
		DNS: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local", "localhost"},
		IPs: []net.IP{net.IP(t.Gateway.Addr().AsSlice()), net.IP(svc.AsSlice()), net.IPv4(127, 0, 0, 1)},
	}
}

// Generate writes a fresh CA, the API server's serving certificate, one
// client certificate and kubeconfig per identity, and the service-account
// signing key pair (sa.key, sa.pub). It overwrites whatever is there.
func (p PKI) Generate(t Topology, nodes int, now time.Time) error {
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return fmt.Errorf("pki dir: %w", err)
	}
	ca, err := NewCA("skipper-local-ca", now)
	if err != nil {
		return err
	}
	if err := writeCert(p.Path("ca.crt"), ca.Cert); err != nil {
		return err
	}
	if err := writeKey(p.Path("ca.key"), ca.Key); err != nil {
		return err
	}
	for _, spec := range append([]CertSpec{APIServerSpec(t)}, ClientSpecs(nodes)...) {
		cert, key, err := ca.Issue(spec, now)
		if err != nil {
			return err
		}
		if err := writeCert(p.Path(spec.Name+".crt"), cert); err != nil {
			return err
		}
		if err := writeKey(p.Path(spec.Name+".key"), key); err != nil {
			return err
		}
		if spec.Server {
			continue
		}
		if err := p.writeKubeconfig(spec.Name); err != nil {
			return err
		}
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("service-account key: %w", err)
	}
	if err := writeKey(p.Path("sa.key"), saKey); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return fmt.Errorf("service-account public key: %w", err)
	}
	return writePEM(p.Path("sa.pub"), "PUBLIC KEY", pub, 0o644)
}

func (p PKI) writeKubeconfig(name string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["skipper"] = &clientcmdapi.Cluster{Server: p.Server, CertificateAuthority: p.Path("ca.crt")}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificate: p.Path(name + ".crt"), ClientKey: p.Path(name + ".key")}
	cfg.Contexts["skipper"] = &clientcmdapi.Context{Cluster: "skipper", AuthInfo: name}
	cfg.CurrentContext = "skipper"
	if err := clientcmd.WriteToFile(*cfg, p.Kubeconfig(name)); err != nil {
		return fmt.Errorf("kubeconfig %s: %w", name, err)
	}
	return nil
}

func writeCert(path string, cert *x509.Certificate) error {
	return writePEM(path, "CERTIFICATE", cert.Raw, 0o644)
}

func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("marshal key %s: %w", path, err)
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
