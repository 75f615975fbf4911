package assign

import (
	"crypto/ed25519"
	"strings"
	"testing"
	"time"
)

// fuzzKey is the key FuzzVerify's seed tokens are signed with, fixed so the
// committed corpus stays valid.
var fuzzKey = ed25519.NewKeyFromSeed([]byte("skipper-fuzz-verify-seed-32bytes"))

// fuzzNow is the time the seed tokens are valid at.
var fuzzNow = time.Unix(1_800_000_000, 0)

// FuzzVerify feeds Verify arbitrary tokens, audiences and times: it never
// panics, and it accepts only a token signed by the key — here, one of the
// tokens the test itself signed, character for character (the encoding is
// canonical, so a signed token has no second spelling) — for its audience,
// before its expiry.
func FuzzVerify(f *testing.F) {
	claims := []Claims{
		{Audience: "uid-1", Function: "default/echo", IssuedAt: fuzzNow.Unix(), Expiry: fuzzNow.Add(time.Minute).Unix()},
		{Audience: "", Function: "", IssuedAt: 0, Expiry: 1<<63 - 1},
		{Audience: "uid-1", Function: "default/echo", IssuedAt: fuzzNow.Unix(), Expiry: fuzzNow.Add(time.Minute).Unix(),
			ID: "AAAAAAAAAAAAAAAAAAAAAAAAAA", Digest: RequestDigest(Request{Function: "default/echo"})},
	}
	signed := map[string]Claims{}
	for _, c := range claims {
		for _, format := range Formats {
			tok, err := Sign(format, fuzzKey, c)
			if err != nil {
				f.Fatal(err)
			}
			signed[tok] = c
			f.Add(tok, c.Audience, fuzzNow.Unix())
			// Respellings of it: a line break, the spare bits of the last
			// character.
			f.Add(tok[:len(tok)-2]+"\n"+tok[len(tok)-2:], c.Audience, fuzzNow.Unix())
			f.Add(tok[:len(tok)-1]+string(tok[len(tok)-1]^1), c.Audience, fuzzNow.Unix())
		}
	}
	_, other, _ := ed25519.GenerateKey(nil)
	forged, _ := Sign(FormatV1, other, claims[0])
	f.Add(forged, "uid-1", fuzzNow.Unix())
	f.Add("v1..", "", int64(0))
	f.Add("v1.e30."+strings.Repeat("A", 86), "", int64(0))

	keys := []ed25519.PublicKey{fuzzKey.Public().(ed25519.PublicKey)}
	f.Fuzz(func(t *testing.T, token, audience string, now int64) {
		c, err := Verify(keys, token, audience, time.Unix(now, 0))
		if err != nil {
			return
		}
		want, ok := signed[token]
		if !ok {
			t.Fatalf("Verify accepted %q, a token the key never signed", token)
		}
		if c != want || c.Audience != audience || now >= c.Expiry {
			t.Fatalf("Verify accepted %q with claims %+v for audience %q at %d", token, c, audience, now)
		}
	})
}
