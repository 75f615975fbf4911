package skipperv1

import (
	"os"
	"path/filepath"
	"testing"
)

func TestTokenFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "token")
	tf := NewTokenFile(p)
	if _, err := tf.GetRequestMetadata(t.Context()); err == nil {
		t.Error("a missing token file: no error")
	}
	if err := os.WriteFile(p, []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	md, err := tf.GetRequestMetadata(t.Context())
	if err != nil || md[HeaderAuthorization] != "Bearer tok-1" {
		t.Errorf("metadata %v, %v", md, err)
	}
	if md, err := NewTokenFile("").GetRequestMetadata(t.Context()); err != nil || len(md) != 0 {
		t.Errorf("no path: %v, %v; want no metadata", md, err)
	}
	if tf.RequireTransportSecurity() {
		t.Error("TLS required")
	}
}
