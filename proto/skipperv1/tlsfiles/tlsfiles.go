package tlsfiles

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
)

// The file names in a directory, as cert-manager writes a Certificate's
// Secret (kubernetes.io/tls with ca.crt).
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// Options say what a directory must hold and how it is re-read.
type Options struct {
	// Cert requires tls.crt and tls.key (a server's own pair). False:
	// they are not read.
	Cert bool
	// CA requires ca.crt (a client verifying servers). False: it is not
	// read.
	CA bool
	// Recheck is the shortest time between two reads of the files, at
	// handshakes. Zero: every handshake reads them.
	Recheck time.Duration
	// Reloaded, when set, is called after every read whose content
	// differs from the last read's: err is nil when the new set was
	// installed, the reason it was not otherwise (the last good set
	// stays). It is called under a lock: it must not block.
	Reloaded func(err error)
}

// Files is the current good set read from a directory. Its methods are
// safe for concurrent use.
type Files struct {
	dir  string
	opts Options

	cur atomic.Pointer[set]

	mu      sync.Mutex // serialises reads
	checked time.Time  // last read
	seen    []byte     // raw content of the last read, good or bad
}

// set is one parsed generation of the files.
type set struct {
	cert *tls.Certificate // nil unless Options.Cert
	pool *x509.CertPool   // nil unless Options.CA
}

// Load reads dir as opts require and returns an error naming the file at
// fault when it cannot serve.
func Load(dir string, opts Options) (*Files, error) {
	if !opts.Cert && !opts.CA {
		return nil, errors.New("tlsfiles: nothing to load (neither Cert nor CA)")
	}
	f := &Files{dir: dir, opts: opts}
	raw, s, err := f.read()
	if err != nil {
		return nil, err
	}
	f.cur.Store(s)
	f.seen, f.checked = raw, time.Now()
	return f, nil
}

// Leaf returns the current certificate's leaf, nil without Options.Cert.
func (f *Files) Leaf() *x509.Certificate {
	if c := f.cur.Load().cert; c != nil {
		return c.Leaf
	}
	return nil
}

// current returns the set to use now, reading the files again first when
// Recheck has passed.
func (f *Files) current() *set {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.checked) < f.opts.Recheck {
		return f.cur.Load()
	}
	f.checked = time.Now()
	raw, s, err := f.read()
	if bytes.Equal(raw, f.seen) {
		return f.cur.Load() // unchanged, or the same bad content: reported already
	}
	f.seen = raw
	if err == nil {
		f.cur.Store(s)
	}
	if f.opts.Reloaded != nil {
		f.opts.Reloaded(err)
	}
	return f.cur.Load()
}

// read reads and parses the files, once more when the first read does not
// parse (it may have straddled the kubelet's swap of the directory). raw
// is what was read, for comparison; it is nil when a file could not be
// read at all.
func (f *Files) read() (raw []byte, s *set, err error) {
	raw, s, err = f.readOnce()
	if err != nil {
		raw, s, err = f.readOnce()
	}
	return raw, s, err
}

func (f *Files) readOnce() ([]byte, *set, error) {
	var names []string
	if f.opts.Cert {
		names = append(names, CertFile, KeyFile)
	}
	if f.opts.CA {
		names = append(names, CAFile)
	}
	content := map[string][]byte{}
	var raw []byte
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(f.dir, n))
		if err != nil {
			return nil, nil, fmt.Errorf("tls: read %s: %w", n, err)
		}
		content[n] = b
		raw = append(append(raw, b...), 0)
	}
	s := &set{}
	if f.opts.Cert {
		c, err := tls.X509KeyPair(content[CertFile], content[KeyFile])
		if err != nil {
			return raw, nil, fmt.Errorf("tls: %s and %s in %s: %w", CertFile, KeyFile, f.dir, err)
		}
		s.cert = &c // Leaf is set by X509KeyPair
	}
	if f.opts.CA {
		s.pool = x509.NewCertPool()
		if !s.pool.AppendCertsFromPEM(content[CAFile]) {
			return raw, nil, fmt.Errorf("tls: %s in %s: no PEM certificate", CAFile, f.dir)
		}
	}
	return raw, s, nil
}

// ServerCredentials serves the current certificate at every handshake
// (Options.Cert is required). Callers are not asked for certificates.
func (f *Files) ServerCredentials() credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if c := f.current().cert; c != nil {
				return c, nil
			}
			return nil, errors.New("tlsfiles: loaded without a certificate")
		},
	})
}

// ClientCredentials verifies servers against the current ca.crt
// (Options.CA is required) and serverName, which every server's
// certificate must carry whatever address is dialled.
func (f *Files) ClientCredentials(serverName string) credentials.TransportCredentials {
	return &clientCreds{f: f, serverName: serverName}
}

// clientCreds builds a fresh TLS configuration for each handshake, so a
// rotated ca.crt applies to the next connection.
type clientCreds struct {
	f          *Files
	serverName string
}

var _ credentials.TransportCredentials = (*clientCreds)(nil)

func (c *clientCreds) tls() credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    c.f.current().pool,
		ServerName: c.serverName,
	})
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.tls().ClientHandshake(ctx, authority, conn)
}

func (c *clientCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("tlsfiles: client credentials cannot serve")
}

func (c *clientCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", ServerName: c.serverName}
}

func (c *clientCreds) Clone() credentials.TransportCredentials {
	cc := *c
	return &cc
}

// OverrideServerName implements credentials.TransportCredentials
// (deprecated there; grpc.WithAuthority is the way).
func (c *clientCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}
