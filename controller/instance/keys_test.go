package instance

import (
	"context"
	"crypto/ed25519"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"skipper.dev/skipper/controller/assign"
	"skipper.dev/skipper/controller/instance/instancetest"
)

// TestAssignKeyRotation: the key file is read again at an assign at most
// once a second; a key added to it verifies from then on, a key dropped
// stops, and a bad file keeps the keys last read.
func TestAssignKeyRotation(t *testing.T) {
	clock := newFakeClock()
	f := newFixtureWith(t, true, func(h *Holder) { h.now = clock.now })
	next, nextPEM := newKey(t)
	assignWith := func(key ed25519.PrivateKey) (int, map[string]any) {
		t.Helper()
		return f.assign(t, instancetest.Encode(t, f.signed(t, key, testUID, echoRequest("default/echo"), time.Minute)))
	}
	write := func(data []byte) {
		t.Helper()
		if err := os.WriteFile(f.key, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name   string
		file   []byte // written first, when not nil
		after  time.Duration
		key    ed25519.PrivateKey
		status int
	}{
		{name: "the old key", key: f.priv, status: 200},
		{name: "the new key, not published", key: next, status: 401},
		{name: "both published, within a second of the last read", file: append(slices.Clip(f.pub), nextPEM...), after: 500 * time.Millisecond, key: next, status: 401},
		{name: "both published, read again", after: 500 * time.Millisecond, key: next, status: 200},
		{name: "both published, the old key", key: f.priv, status: 200},
		{name: "the old key dropped", file: nextPEM, after: time.Second, key: f.priv, status: 401},
		{name: "the old key dropped, the new key", key: next, status: 200},
		{name: "a bad file keeps the keys last read", file: []byte("not a key"), after: time.Second, key: next, status: 200},
		{name: "a missing file keeps them too", file: []byte{}, after: time.Second, key: next, status: 200},
	}
	for _, s := range steps {
		if s.file != nil {
			if len(s.file) == 0 {
				if err := os.Remove(f.key); err != nil {
					t.Fatal(err)
				}
			} else {
				write(s.file)
			}
		}
		clock.advance(s.after)
		status, m := assignWith(s.key)
		if status != s.status {
			t.Fatalf("%s: %d %v, want %d", s.name, status, m, s.status)
		}
		if status == 401 && m["reason"] != assign.ReasonBadToken {
			t.Errorf("%s: reason %v, want bad_token", s.name, m["reason"])
		}
	}
}

// TestKeepKeys: with KeepKeys running, the keys follow the file with no
// assign asking (a key added, then the old one dropped), each within
// keyRecheck/2; it stops with its context.
func TestKeepKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, pem := newKey(t)
		_, nextPEM := newKey(t)
		path := filepath.Join(t.TempDir(), "ed25519.pub")
		write := func(data []byte) {
			t.Helper()
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write(pem)
		h := New(Config{KeyFile: path}, slog.New(slog.DiscardHandler))
		if _, err := h.publicKeys(h.now()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { h.KeepKeys(ctx); close(done) }()
		keys := func() int {
			h.keyMu.Lock()
			defer h.keyMu.Unlock()
			return len(h.keys)
		}
		for _, step := range []struct {
			name string
			file []byte
			want int
		}{
			{"a key added", append(slices.Clip(pem), nextPEM...), 2},
			{"the old key dropped", nextPEM, 1},
		} {
			write(step.file)
			time.Sleep(keyRecheck / 2) // sleep: behaviour (fake clock: half a recheck)
			synctest.Wait()
			if n := keys(); n != step.want {
				t.Errorf("%s: %d keys %s after the file changed, want %d", step.name, n, keyRecheck/2, step.want)
			}
		}
		h.keyMu.Lock()
		last := h.keys[0]
		h.keyMu.Unlock()
		if want, err := assign.ParsePublicKeys(nextPEM); err != nil || !last.Equal(want[0]) {
			t.Errorf("the key kept is not the new one (%v)", err)
		}
		cancel()
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Error("KeepKeys still runs after its context ended")
		}
	})
}

// TestKeyReadOutOfOrder: KeepKeys reads the file outside keyMu, so its
// read can land after a later one; the older copy must not bring back a
// key the later read saw dropped, and a later read that failed must not
// hide what an older one found.
func TestKeyReadOutOfOrder(t *testing.T) {
	_, pem := newKey(t)
	_, nextPEM := newKey(t)
	both := append(slices.Clip(pem), nextPEM...)
	t0 := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type read struct {
		name  string
		began time.Time
		file  []byte // nil: the read failed
		want  int
	}
	for _, tc := range []struct {
		name  string
		reads []read
	}{
		{"an older read lands late", []read{
			{"both keys", at(0), both, 2},
			{"the old key dropped", at(2), nextPEM, 1},
			{"an older read of both, late", at(1), both, 1},
			{"a newer read of both", at(3), both, 2},
		}},
		{"a later failed read hides nothing", []read{
			{"one key", at(0), pem, 1},
			{"a failed read", at(2), nil, 1},
			{"an older read that found a key added", at(1), both, 2},
		}},
		{"the first load takes any read", []read{
			{"a failed read first", at(5), nil, 0},
			{"an older read that found the file", at(1), pem, 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := New(Config{}, slog.New(slog.DiscardHandler))
			h.keyMu.Lock()
			defer h.keyMu.Unlock()
			for _, r := range tc.reads {
				var err error
				if r.file == nil {
					err = os.ErrNotExist
				}
				h.applyKeysLocked(r.began, r.file, err)
				if len(h.keys) != r.want {
					t.Errorf("%s: %d keys kept, want %d", r.name, len(h.keys), r.want)
				}
			}
		})
	}
}

// TestAssignReadTimedUnderLock: an assign that finds its keys stale reads
// the file under keyMu and times the read then, not when it asked: a
// KeepKeys read that began while it waited for the lock (and saw a key
// the file has dropped since) lands after it and is dropped.
func TestAssignReadTimedUnderLock(t *testing.T) {
	_, pem := newKey(t)
	_, nextPEM := newKey(t)
	path := filepath.Join(t.TempDir(), "ed25519.pub")
	if err := os.WriteFile(path, append(slices.Clip(pem), nextPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	h := New(Config{KeyFile: path}, slog.New(slog.DiscardHandler))
	t0 := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	clock := t0
	h.now = func() time.Time { return clock }
	if keys, err := h.publicKeys(h.now()); err != nil || len(keys) != 2 {
		t.Fatalf("first load: %d keys, %v", len(keys), err)
	}
	asked := t0.Add(2 * keyRecheck) // the assign's own time, the keys stale by then
	kept := t0.Add(2*keyRecheck + time.Millisecond)
	if err := os.WriteFile(path, nextPEM, 0o644); err != nil { // the old key dropped
		t.Fatal(err)
	}
	clock = kept.Add(time.Millisecond) // the assign holds the lock now
	if keys, err := h.publicKeys(asked); err != nil || len(keys) != 1 {
		t.Fatalf("the assign's read: %d keys, %v; want 1", len(keys), err)
	}
	h.keyMu.Lock()
	h.applyKeysLocked(kept, append(slices.Clip(pem), nextPEM...), nil) // KeepKeys' copy, read before the drop
	n := len(h.keys)
	h.keyMu.Unlock()
	if n != 1 {
		t.Errorf("a KeepKeys read that began before the assign's brought back the dropped key: %d keys", n)
	}
}

// TestLoadKeys: LoadKeys returns the error of a key file not there yet;
// once it loaded the keys, an assign verifies with them even with the
// file gone.
func TestLoadKeys(t *testing.T) {
	f := newFixture(t, false)
	if err := f.h.LoadKeys(); err == nil {
		t.Fatal("LoadKeys without a key file: no error")
	}
	f.writeKey(t)
	if err := f.h.LoadKeys(); err != nil {
		t.Fatalf("LoadKeys: %v", err)
	}
	if err := os.Remove(f.key); err != nil {
		t.Fatal(err)
	}
	if status, m := f.assign(t, f.body(t, echoRequest("default/echo"))); status != http.StatusOK {
		t.Errorf("assign after LoadKeys, the file gone: %d %v, want 200", status, m)
	}
}
