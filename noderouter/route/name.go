package route

import (
	"errors"
	"fmt"
	"strings"
)

// HostSuffix ends a Host that names a function: <name>.<namespace>.fn.
const HostSuffix = ".fn"

// Errors the parsers wrap; callers answer 400 on either.
var (
	// ErrNoFunction: the request names no function.
	ErrNoFunction = errors.New("no function named")
	// ErrMalformed: the name is not <namespace>/<name> of DNS labels.
	ErrMalformed = errors.New("malformed function name")
)

// Ref names a function. Both parts are DNS labels.
type Ref struct {
	Namespace string
	Name      string
}

// String returns "namespace/name", the form used in metrics, logs and the
// ring key.
func (r Ref) String() string { return r.Namespace + "/" + r.Name }

// ParseHeader parses an `x-skipper-function` value: "<namespace>/<name>", or
// "<name>" when defaultNamespace is not empty.
func ParseHeader(v, defaultNamespace string) (Ref, error) {
	if v == "" {
		return Ref{}, ErrNoFunction
	}
	ns, name, ok := strings.Cut(v, "/")
	if !ok {
		if defaultNamespace == "" {
			return Ref{}, fmt.Errorf("%w: %q: want <namespace>/<name> (this router has no default namespace)", ErrMalformed, v)
		}
		ns, name = defaultNamespace, v
	}
	r := Ref{Namespace: ns, Name: name}
	if !IsDNSLabel(r.Namespace) || !IsDNSLabel(r.Name) {
		return Ref{}, fmt.Errorf("%w: %q: namespace and name must be DNS labels", ErrMalformed, v)
	}
	return r, nil
}

// Hosts tells which function a request's Host names. Four forms do:
// <name>.<namespace>.fn, and the names of a Function's own Service (an
// ExternalName Service of the Function's name, naming the router's):
// <name>.<namespace>, <name>.<namespace>.svc and
// <name>.<namespace>.svc.<cluster domain>. Each may carry a numeric :port
// and a trailing dot, in any ASCII case. The zero Hosts knows no cluster
// domain: the last form names nothing. In namespaces named fn or svc the
// short form reads as one of the others: use a longer one.
type Hosts struct {
	svcDomain string // ".svc." + the cluster domain; "" when none
}

// NewHosts returns the Hosts of a cluster whose DNS domain is
// clusterDomain (cluster.local, say; "" for none), a lower-case DNS name
// without a trailing dot.
func NewHosts(clusterDomain string) Hosts {
	if clusterDomain == "" {
		return Hosts{}
	}
	return Hosts{svcDomain: ".svc." + clusterDomain}
}

// Parse returns the function host names. ok is false when host names none
// (another host, an IP); err is set when host has a function's suffix
// (.fn, .svc, .svc.<cluster domain>) without being <name>.<namespace>
// of DNS labels before it. It allocates only to fold an upper-case host.
func (hs Hosts) Parse(host string) (r Ref, ok bool, err error) {
	h := host
	// Only a numeric port is cut off: "echo.default.fn:\xad" is not a
	// function host with a port (FuzzParseHost).
	if i := strings.LastIndexByte(h, ':'); i >= 0 && isDigits(h[i+1:]) {
		h = h[:i]
	}
	h = strings.TrimSuffix(h, ".")
	if hasUpper(h) { // hosts are case-insensitive; names are lower case
		// ASCII only: strings.ToLower folds U+212A KELVIN SIGN to 'k', which
		// made "\u212aecho.default.FN" name default/kecho (FuzzParseHost).
		h = asciiLower(h)
	}
	suffix := ""
	for _, s := range [...]string{HostSuffix, ".svc", hs.svcDomain} {
		if s != "" && strings.HasSuffix(h, s) {
			suffix = s
			break
		}
	}
	name, ns, found := strings.Cut(h[:len(h)-len(suffix)], ".")
	r = Ref{Namespace: ns, Name: name}
	if found && IsDNSLabel(r.Namespace) && IsDNSLabel(r.Name) {
		return r, true, nil
	}
	if suffix == "" {
		return Ref{}, false, nil // not <name>.<namespace>: some other host
	}
	return Ref{}, true, fmt.Errorf("%w: host %q: want <name>.<namespace>%s with DNS labels", ErrMalformed, host, suffix)
}

// IsDNSLabel reports whether s is an RFC 1123 label: 1–63 of [a-z0-9-],
// starting and ending alphanumeric. The router's one label check (names,
// --default-namespace, TLS server names); it allocates nothing.
func IsDNSLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}

// IsDNSName reports whether s is a DNS name of RFC 1123 labels (IsDNSLabel)
// joined by dots, at most 253 bytes, without a trailing dot.
func IsDNSName(s string) bool {
	if len(s) > 253 {
		return false
	}
	for l := range strings.SplitSeq(s, ".") {
		if !IsDNSLabel(l) {
			return false
		}
	}
	return true
}

// isDigits reports whether s is empty or only ASCII digits.
func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
}
