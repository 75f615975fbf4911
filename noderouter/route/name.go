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

// ParseHost parses a Host header of the form <name>.<namespace>.fn, with an
// optional :port and trailing dot. ok is false when host does not end in
// ".fn" (it names no function); err is set when it does but is malformed.
func ParseHost(host string) (r Ref, ok bool, err error) {
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
	if len(h) < len(HostSuffix) || !strings.EqualFold(h[len(h)-len(HostSuffix):], HostSuffix) {
		return Ref{}, false, nil
	}
	h = h[:len(h)-len(HostSuffix)]
	name, ns, found := strings.Cut(h, ".")
	r = Ref{Namespace: ns, Name: name}
	if !found || !IsDNSLabel(r.Namespace) || !IsDNSLabel(r.Name) {
		return Ref{}, true, fmt.Errorf("%w: host %q: want <name>.<namespace>.fn with DNS labels", ErrMalformed, host)
	}
	return r, true, nil
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
