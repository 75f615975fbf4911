package instance

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"log/slog"
	"time"

	"skipper.dev/skipper/controller/assign"
)

// NewWarmUp returns a throwaway Holder for cfg that verifies assign
// tokens with a key pair of its own, and the private key that signs
// them. It never reads cfg.KeyFile and logs nothing. A fresh Go process
// pays for much of its code's first run (the edwards25519 tables, the PEM
// and PKIX parsers, encoding/json's codecs: about 1.2 ms for a first
// assign against 80 µs for the second, docs/benchmarks.md); a runtime
// serves an assign signed with the key, and its own handlers, once on
// this Holder before its pod is ready, so that its first claim pays none
// of it. Making the key parses it as the key file is parsed.
func NewWarmUp(cfg Config) (*Holder, ed25519.PrivateKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("warm-up key: %w", err)
	}
	pem, err := assign.MarshalPublicKey(pub)
	if err != nil {
		return nil, nil, fmt.Errorf("warm-up key: %w", err)
	}
	keys, err := assign.ParsePublicKeys(pem)
	if err != nil {
		return nil, nil, fmt.Errorf("warm-up key: %w", err)
	}
	cfg.KeyFile = "" // its keys are set below: never the real file
	h := New(cfg, slog.New(slog.DiscardHandler))
	h.keys, h.keyRaw, h.keyReadAt = keys, pem, time.Now()
	return h, priv, nil
}
