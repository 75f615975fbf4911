package instancetest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"skipper.dev/skipper/controller/assign"
)

// Key is an assign key pair for one test.
type Key struct {
	Priv ed25519.PrivateKey
	// Format is the token format Sign writes; empty: assign.FormatJWS.
	Format string
	// PEM is the public key, as the key file holds it.
	PEM []byte
	// Path is the key file, in the test's temporary directory; Write
	// writes it.
	Path string
}

// NewKey makes a key pair; its file is not written yet.
func NewKey(t testing.TB) *Key {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := assign.MarshalPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return &Key{Priv: priv, PEM: pem, Path: filepath.Join(t.TempDir(), "ed25519.pub")}
}

// Write writes the public key to Path.
func (k *Key) Write(t testing.TB) {
	t.Helper()
	if err := os.WriteFile(k.Path, k.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Sign returns r with a token in k.Format for the pod with UID aud signed
// by k at now, valid for exp.
func (k *Key) Sign(t testing.TB, aud string, r assign.Request, now time.Time, exp time.Duration) assign.Request {
	t.Helper()
	format := k.Format
	if format == "" {
		format = assign.FormatJWS
	}
	tok, err := assign.SignRequest(format, k.Priv, aud, r, now, exp)
	if err != nil {
		t.Fatal(err)
	}
	r.Token = tok
	return r
}

// Encode is r as JSON, an assign's body.
func Encode(t testing.TB, r assign.Request) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Assign posts body to assign.Path of the server at base with c and
// returns the answer's status and JSON body.
func Assign(t testing.TB, c *http.Client, base, body string) (int, map[string]any) {
	t.Helper()
	resp, err := c.Post(base+assign.Path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return resp.StatusCode, m
}
