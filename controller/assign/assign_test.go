package assign

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestSignVerify(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	otherPub, _, _ := ed25519.GenerateKey(nil)
	now := time.Unix(1_800_000_000, 0)
	tok, err := Sign(priv, Claims{Audience: "uid-1", Function: "default/echo", IssuedAt: now.Unix(), Expiry: now.Add(time.Minute).Unix()})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		key      ed25519.PublicKey
		token    string
		audience string
		now      time.Time
		want     error
	}{
		{name: "valid", key: pub, token: tok, audience: "uid-1", now: now},
		{name: "other pod", key: pub, token: tok, audience: "uid-2", now: now, want: ErrAudience},
		{name: "expired", key: pub, token: tok, audience: "uid-1", now: now.Add(time.Minute), want: ErrExpired},
		{name: "other key", key: otherPub, token: tok, audience: "uid-1", now: now, want: ErrSignature},
		{name: "tampered", key: pub, token: strings.Replace(tok, "v1.e", "v1.f", 1), audience: "uid-1", now: now, want: ErrSignature},
		{name: "no prefix", key: pub, token: "x" + tok, audience: "uid-1", now: now, want: ErrMalformed},
		{name: "no signature", key: pub, token: "v1.abc", audience: "uid-1", now: now, want: ErrMalformed},
		{name: "empty", key: pub, token: "", audience: "uid-1", now: now, want: ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Verify(tt.key, tt.token, tt.audience, tt.now)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Verify() error = %v, want %v", err, tt.want)
			}
			if tt.want == nil && c.Function != "default/echo" {
				t.Fatalf("claims function = %q", c.Function)
			}
		})
	}
}

func TestKeyPEMRoundTrip(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	pubPEM, err := MarshalPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	gotPub, err := ParsePublicKey(pubPEM)
	if err != nil || !gotPub.Equal(pub) {
		t.Fatalf("public key round trip: %v", err)
	}
	privPEM, err := MarshalPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	gotPriv, err := ParsePrivateKey(privPEM)
	if err != nil || !gotPriv.Equal(priv) {
		t.Fatalf("private key round trip: %v", err)
	}
	if _, err := ParsePublicKey(privPEM); err == nil {
		t.Fatal("ParsePublicKey accepted a private key")
	}
}
