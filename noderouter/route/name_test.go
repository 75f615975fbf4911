package route

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseHeader(t *testing.T) {
	tests := []struct {
		name    string
		v       string
		defNS   string
		want    Ref
		wantErr error
	}{
		{"namespaced", "default/echo", "", Ref{"default", "echo"}, nil},
		{"namespaced with default", "team-a/fn-1", "default", Ref{"team-a", "fn-1"}, nil},
		{"bare with default", "echo", "default", Ref{"default", "echo"}, nil},
		{"bare without default", "echo", "", Ref{}, ErrMalformed},
		{"empty", "", "default", Ref{}, ErrNoFunction},
		{"empty name", "default/", "", Ref{}, ErrMalformed},
		{"empty namespace", "/echo", "", Ref{}, ErrMalformed},
		{"two slashes", "a/b/c", "", Ref{}, ErrMalformed},
		{"upper case", "Default/echo", "", Ref{}, ErrMalformed},
		{"dot", "default/echo.v1", "", Ref{}, ErrMalformed},
		{"leading dash", "default/-echo", "", Ref{}, ErrMalformed},
		{"trailing dash", "default/echo-", "", Ref{}, ErrMalformed},
		{"63 chars", "default/" + repeat('a', 63), "", Ref{"default", repeat('a', 63)}, nil},
		{"64 chars", "default/" + repeat('a', 64), "", Ref{}, ErrMalformed},
		{"space", "default/ echo", "", Ref{}, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseHeader(tt.v, tt.defNS)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ref (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseHost(t *testing.T) {
	tests := []struct {
		name    string
		host    string
		want    Ref
		wantOK  bool
		wantErr error
	}{
		{"plain", "echo.default.fn", Ref{"default", "echo"}, true, nil},
		{"port", "echo.default.fn:8380", Ref{"default", "echo"}, true, nil},
		{"trailing dot", "echo.default.fn.", Ref{"default", "echo"}, true, nil},
		{"upper case", "Echo.Default.FN", Ref{"default", "echo"}, true, nil},
		{"not a function", "example.com", Ref{}, false, nil},
		{"ip", "198.51.100.11:8380", Ref{}, false, nil},
		{"ipv6", "[::1]:8380", Ref{}, false, nil},
		{"empty", "", Ref{}, false, nil},
		{"just suffix", ".fn", Ref{}, true, ErrMalformed},
		{"fn", "fn", Ref{}, false, nil},
		{"no namespace", "echo.fn", Ref{}, true, ErrMalformed},
		{"extra label", "a.echo.default.fn", Ref{}, true, ErrMalformed},
		{"bad label", "ec_ho.default.fn", Ref{}, true, ErrMalformed},
		{"kelvin sign is not k", "\u212aecho.default.FN", Ref{}, true, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := ParseHost(tt.host)
			if !errors.Is(err, tt.wantErr) || ok != tt.wantOK {
				t.Fatalf("ok, err = %v, %v; want %v, %v", ok, err, tt.wantOK, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ref (-want +got):\n%s", diff)
			}
		})
	}
}

func repeat(c byte, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = c
	}
	return string(b)
}

// FuzzParse checks that every accepted name round-trips through both forms
// and that nothing panics.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"default/echo", "echo", "echo.default.fn", "echo.default.fn:80", "a/b/c", "", "/", ".fn", "[::1]:80", "Echo.Default.FN.", "x-" + repeat('a', 62)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if r, err := ParseHeader(s, "default"); err == nil {
			if !IsDNSLabel(r.Namespace) || !IsDNSLabel(r.Name) {
				t.Fatalf("ParseHeader(%q) accepted %+v", s, r)
			}
			back, ok, err := ParseHost(r.Name + "." + r.Namespace + ".fn")
			if err != nil || !ok || back != r {
				t.Fatalf("host round trip of %+v: %+v %v %v", r, back, ok, err)
			}
		}
		if r, ok, err := ParseHost(s); ok && err == nil {
			back, err := ParseHeader(r.String(), "")
			if err != nil || back != r {
				t.Fatalf("header round trip of %+v from %q: %+v %v", r, s, back, err)
			}
		} else if !ok && err != nil {
			t.Fatalf("ParseHost(%q): error %v without ok", s, err)
		}
	})
}

func BenchmarkParseHeader(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseHeader("default/echo", ""); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzParseHost checks ParseHost on its own: it never panics, reports an
// error only for hosts ending in .fn, accepts only ASCII lower-case DNS
// labels, and gives the same answer whatever the ASCII case, a port or a
// trailing dot.
func FuzzParseHost(f *testing.F) {
	for _, s := range []string{
		"echo.default.fn", "echo.default.fn:8380", "echo.default.fn.", "echo.default.fn.:80",
		"Echo.Default.FN", "ECHO.DEFAULT.FN:1", "example.com", "198.51.100.11:8380", "[::1]:8380",
		"[fe80::1%25eth0]:80", "", ".fn", "fn", "echo.fn", "a.echo.default.fn", "ec_ho.default.fn",
		"echo.default.fn:", ":", "echo..fn", "-a.b.fn", "a-.b.fn", repeat('a', 63) + ".b.fn",
		repeat('a', 64) + ".b.fn", "\u212aecho.default.FN", "echo.default.\u212an",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		r, ok, err := ParseHost(host)
		if !ok {
			if err != nil || r != (Ref{}) {
				t.Fatalf("ParseHost(%q) = %+v, %v, %v: not a function host, yet a ref or an error", host, r, ok, err)
			}
			return
		}
		if err != nil {
			if r != (Ref{}) {
				t.Fatalf("ParseHost(%q) returned %+v with error %v", host, r, err)
			}
			return
		}
		if !IsDNSLabel(r.Namespace) || !IsDNSLabel(r.Name) {
			t.Fatalf("ParseHost(%q) accepted %+v", host, r)
		}
		for i := 0; i < len(host); i++ {
			if host[i] >= 0x80 {
				t.Fatalf("ParseHost(%q) accepted a non-ASCII host as %+v", host, r)
			}
		}
		for _, v := range []string{asciiUpper(host), r.Name + "." + r.Namespace + ".fn", r.Name + "." + r.Namespace + ".fn.:443"} {
			got, ok, err := ParseHost(v)
			if got != r || !ok || err != nil {
				t.Fatalf("ParseHost(%q) = %+v, %v, %v; ParseHost(%q) = %+v", v, got, ok, err, host, r)
			}
		}
	})
}

func asciiUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}
