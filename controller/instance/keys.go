package instance

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"os"
	"time"

	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/internal/tick"
)

// keyRecheck is how old the keys an assign verifies with may be: a
// rotated key (added, or dropped) is seen within a second of the kubelet
// writing it, with no restart. KeepKeys reads the file twice as often, so
// an assign reads it only before the file first loads or when KeepKeys
// is not running (or falls behind). KeepKeys reads the file outside
// keyMu, so an assign never waits for its read.
const keyRecheck = time.Second

// LoadKeys reads the key file now unless the keys were read less than a
// second ago, as an assign does, and returns the error of a file that has
// not loaded yet. A runtime calls it before it listens, so that its first
// claim reads no file; a file not there yet is read at the first assign.
func (h *Holder) LoadKeys() error {
	_, err := h.publicKeys(h.now())
	return err
}

// publicKeys returns the keys that verify assign tokens: every PEM block
// of the key file (two while a key rotates). The file is read again when
// the last read is keyRecheck old; when it is missing or bad, the keys
// last read keep verifying, and the error is logged once. Before the
// file first loads, its error is returned.
func (h *Holder) publicKeys(now time.Time) ([]ed25519.PublicKey, error) {
	h.keyMu.Lock()
	defer h.keyMu.Unlock()
	if h.keys != nil && now.Sub(h.keyReadAt) < keyRecheck {
		return h.keys, nil
	}
	return h.loadKeysLocked()
}

// KeepKeys reads the key file every keyRecheck/2 until ctx ends, so that
// an assign verifies with keys at most that old and reads no file on its
// way: the read (open, stat, read, close) showed as about 0.1 ms of a
// cold call's instance time in perf (docs/benchmarks.md).
func (h *Holder) KeepKeys(ctx context.Context) {
	tick.After(ctx, keyRecheck/2, func(time.Time) {
		began := h.now()
		data, err := os.ReadFile(h.cfg.KeyFile)
		h.keyMu.Lock()
		_, _ = h.applyKeysLocked(began, data, err)
		h.keyMu.Unlock()
	})
}

// loadKeysLocked reads the key file (publicKeys says what is kept when
// it is missing or bad); keyMu is held. The read is timed here, under the
// lock, not when its caller asked: a KeepKeys read that began while the
// caller waited for the lock is older than this one.
func (h *Holder) loadKeysLocked() ([]ed25519.PublicKey, error) {
	began := h.now()
	data, err := os.ReadFile(h.cfg.KeyFile)
	return h.applyKeysLocked(began, data, err)
}

// applyKeysLocked takes the key file as a read that began at began found
// it (data, or err); keyMu is held. KeepKeys reads outside the lock, so
// its read may land after a later one: a read that began before the one
// the keys were taken from is dropped, so an older copy cannot bring back
// a key a later read saw dropped (a later read that failed drops nothing:
// it told nothing of the keys). This orders reads by h.now, which is
// monotonic outside tests.
func (h *Holder) applyKeysLocked(began time.Time, data []byte, err error) ([]ed25519.PublicKey, error) {
	if h.keys != nil && began.Before(h.keyLoadedAt) {
		return h.keys, nil
	}
	if began.After(h.keyReadAt) {
		h.keyReadAt = began
	}
	if err == nil && h.keys != nil && bytes.Equal(data, h.keyRaw) {
		h.keyLoadedAt = began
		return h.keys, nil
	}
	var keys []ed25519.PublicKey
	if err == nil {
		keys, err = assign.ParsePublicKeys(data)
	}
	if err != nil {
		err = fmt.Errorf("assign key %s: %w", h.cfg.KeyFile, err)
		if h.keys == nil {
			return nil, err
		}
		if err.Error() != h.keyErr {
			h.keyErr = err.Error()
			h.log.Warn("assign key file unreadable, keeping the keys last read", "path", h.cfg.KeyFile, "keys", len(h.keys), "err", err)
		}
		return h.keys, nil
	}
	if h.keys != nil {
		h.log.Info("assign keys changed", "path", h.cfg.KeyFile, "keys", len(keys))
	}
	h.keys, h.keyRaw, h.keyErr, h.keyLoadedAt = keys, data, "", began
	return keys, nil
}
