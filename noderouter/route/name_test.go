package route

import (
	"errors"
	"strings"
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
		{"a Service's short name", "echo.default", Ref{"default", "echo"}, true, nil},
		{"a Service's name", "echo.default.svc", Ref{"default", "echo"}, true, nil},
		{"a Service's full name", "echo.default.svc.cluster.local:80", Ref{"default", "echo"}, true, nil},
		{"a Service's full name, upper case, dot", "ECHO.default.SVC.cluster.local.", Ref{"default", "echo"}, true, nil},
		{"another cluster domain", "echo.default.svc.other.example", Ref{}, false, nil},
		{"three labels", "www.example.com", Ref{}, false, nil},
		{"not labels", "ec_ho.default", Ref{}, false, nil},
		{"a pod's name under a Service", "a.echo.default.svc", Ref{}, true, ErrMalformed},
		{"svc alone", ".svc", Ref{}, true, ErrMalformed},
		{"a namespace's svc", "default.svc.cluster.local", Ref{}, true, ErrMalformed},
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
			got, ok, err := testHosts.Parse(tt.host)
			if !errors.Is(err, tt.wantErr) || ok != tt.wantOK {
				t.Fatalf("ok, err = %v, %v; want %v, %v", ok, err, tt.wantOK, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ref (-want +got):\n%s", diff)
			}
		})
	}
}

// testHosts are the Hosts of a cluster with the usual domain.
var testHosts = NewHosts("cluster.local")

func TestZeroHostsKnowNoClusterDomain(t *testing.T) {
	t.Parallel()
	if r, ok, err := (Hosts{}).Parse("echo.default.svc.cluster.local"); ok || err != nil {
		t.Errorf("zero Hosts: %+v %v %v, want no function", r, ok, err)
	}
	if r, ok, err := (Hosts{}).Parse("echo.default.svc"); !ok || err != nil || r != (Ref{"default", "echo"}) {
		t.Errorf("zero Hosts: %+v %v %v, want default/echo", r, ok, err)
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
	for _, s := range []string{"default/echo", "echo", "echo.default.fn", "echo.default.fn:80", "echo.default.svc.cluster.local", "a/b/c", "", "/", ".fn", "[::1]:80", "Echo.Default.FN.", "x-" + repeat('a', 62)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if r, err := ParseHeader(s, "default"); err == nil {
			if !IsDNSLabel(r.Namespace) || !IsDNSLabel(r.Name) {
				t.Fatalf("ParseHeader(%q) accepted %+v", s, r)
			}
			back, ok, err := testHosts.Parse(r.Name + "." + r.Namespace + ".fn")
			if err != nil || !ok || back != r {
				t.Fatalf("host round trip of %+v: %+v %v %v", r, back, ok, err)
			}
		}
		if r, ok, err := testHosts.Parse(s); ok && err == nil {
			back, err := ParseHeader(r.String(), "")
			if err != nil || back != r {
				t.Fatalf("header round trip of %+v from %q: %+v %v", r, s, back, err)
			}
		} else if !ok && err != nil {
			t.Fatalf("Parse(%q): error %v without ok", s, err)
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

// FuzzParseHost checks Hosts.Parse on its own: it never panics, reports an
// error only for hosts with a function's suffix, accepts only ASCII
// lower-case DNS labels, and gives the same answer whatever the ASCII
// case, a port, a trailing dot or which of the four forms.
func FuzzParseHost(f *testing.F) {
	for _, s := range []string{
		"echo.default.fn", "echo.default.fn:8380", "echo.default.fn.", "echo.default.fn.:80",
		"Echo.Default.FN", "ECHO.DEFAULT.FN:1", "example.com", "198.51.100.11:8380", "[::1]:8380",
		"[fe80::1%25eth0]:80", "", ".fn", "fn", "echo.fn", "a.echo.default.fn", "ec_ho.default.fn",
		"echo.default.fn:", ":", "echo..fn", "echo.default", "echo.default.svc", "echo.default.svc.cluster.local:80", "a.b.svc", ".svc", "x.svc.cluster.local", "-a.b.fn", "a-.b.fn", repeat('a', 63) + ".b.fn",
		repeat('a', 64) + ".b.fn", "\u212aecho.default.FN", "echo.default.\u212an",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		r, ok, err := testHosts.Parse(host)
		if !ok {
			if err != nil || r != (Ref{}) {
				t.Fatalf("Parse(%q) = %+v, %v, %v: not a function host, yet a ref or an error", host, r, ok, err)
			}
			return
		}
		if err != nil {
			if r != (Ref{}) {
				t.Fatalf("Parse(%q) returned %+v with error %v", host, r, err)
			}
			h := strings.TrimSuffix(asciiLowerPort(host), ".")
			if !strings.HasSuffix(h, ".fn") && !strings.HasSuffix(h, ".svc") && !strings.HasSuffix(h, ".svc.cluster.local") {
				t.Fatalf("Parse(%q): error %v for a host without a function's suffix", host, err)
			}
			return
		}
		if !IsDNSLabel(r.Namespace) || !IsDNSLabel(r.Name) {
			t.Fatalf("Parse(%q) accepted %+v", host, r)
		}
		for i := 0; i < len(host); i++ {
			if host[i] >= 0x80 {
				t.Fatalf("Parse(%q) accepted a non-ASCII host as %+v", host, r)
			}
		}
		short := r.Name + "." + r.Namespace
		forms := []string{asciiUpper(host), short + ".fn", short + ".fn.:443", short + ".svc", short + ".svc.cluster.local."}
		if r.Namespace != "fn" && r.Namespace != "svc" { // the short form would end in a suffix
			forms = append(forms, short)
		}
		for _, v := range forms {
			got, ok, err := testHosts.Parse(v)
			if got != r || !ok || err != nil {
				t.Fatalf("Parse(%q) = %+v, %v, %v; Parse(%q) = %+v", v, got, ok, err, host, r)
			}
		}
	})
}

// asciiLowerPort is s in ASCII lower case without a numeric :port.
func asciiLowerPort(s string) string {
	if i := strings.LastIndexByte(s, ':'); i >= 0 && isDigits(s[i+1:]) {
		s = s[:i]
	}
	return asciiLower(s)
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
