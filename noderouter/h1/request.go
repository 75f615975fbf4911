package h1

import (
	"bufio"
	"bytes"
	"fmt"
)

// DefaultMaxHead is the head size limit callers use when they have no
// other: net/http's DefaultMaxHeaderBytes (1 MiB) is far more than a
// function call needs; 64 KiB is nginx's large_client_header_buffers order.
const DefaultMaxHead = 64 << 10

// Request is a parsed request head. Read fills it from a connection; the
// same Request is reused for every request on it, so that reading heads
// allocates nothing once warm. Its byte slices alias its buffer and are
// valid until the next Read.
type Request struct {
	Header
	method, target span
	// path is the origin-form target to send upstream: the target itself,
	// or an absolute-form target's path and query (may be empty or start
	// with '?': a "/" goes before it).
	path span
	// host is the authority of an absolute-form target (then Host is
	// ignored, as in net/http), else the Host field's value.
	host     span
	absolute bool
	minor    byte
	framing  Framing
	close    bool
}

// Read reads and validates the next request head from br, at most max
// bytes of it (request line, fields and the blank line), and decides its
// body framing and whether the connection may carry another request. The
// body, if any, is next in br: read it with Body.Reset(br, r.Framing()).
//
// It returns io.EOF, unwrapped, when br ends before the first byte (the
// caller closed an idle connection), and an error wrapping one of the
// package's sentinels otherwise (see Status).
func (r *Request) Read(br *bufio.Reader, max int) error {
	*r = Request{Header: r.Header}
	if err := r.readHead(br, max, r.parseLine); err != nil {
		return err
	}
	return r.check()
}

// parseLine parses the request line r.buf[:end] as net/http's readRequest
// does: method SP target SP version, split at the first two spaces; the
// method a token; the target as url.ParseRequestURI accepts it, narrowed
// (see parseTarget); the version HTTP/1.x. CONNECT is refused.
func (r *Request) parseLine(end int) error {
	line := r.buf[:end]
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 < 0 {
		return malformed("request line", line)
	}
	sp2 := bytes.IndexByte(line[sp1+1:], ' ')
	if sp2 < 0 {
		return malformed("request line", line)
	}
	sp2 += sp1 + 1
	r.method = span{0, int32(sp1)}
	r.target = span{int32(sp1 + 1), int32(sp2)}
	if !isToken(r.Method()) {
		return malformed("method", line)
	}
	minor, err := parseVersion(line[sp2+1:])
	if err != nil {
		return err
	}
	r.minor = minor
	if string(r.Method()) == "CONNECT" {
		return wrapf(ErrUnsupportedMethod, "method", r.Method())
	}
	return r.parseTarget()
}

// parseVersion parses "HTTP/x.y" as net/http's ParseHTTPVersion and
// returns y; a major version other than 1 is ErrUnsupportedVersion (the
// net/http server answers 505, but accepts "PRI * HTTP/2.0" for handlers
// to take over; see IsH2Preface).
func parseVersion(v []byte) (byte, error) {
	if len(v) != len("HTTP/1.1") || string(v[:5]) != "HTTP/" || v[6] != '.' ||
		!isDigit(v[5]) || !isDigit(v[7]) {
		return 0, malformed("HTTP version", v)
	}
	if v[5] != '1' {
		return 0, wrapf(ErrUnsupportedVersion, "version", v)
	}
	return v[7] - '0', nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// parseTarget checks the request target as url.ParseRequestURI does (no
// control bytes, well-formed %-escapes in the path) and accepts three of
// its forms: origin-form ("/path?query"), asterisk-form ("*") and an
// absolute-form "http(s)://host[:port][/path][?query]" whose host is
// letters, digits, '-' and '.'. Stricter: other absolute forms (IP-literal
// hosts, userinfo, %-escaped hosts, other schemes, opaque URIs) are
// ErrUnsupportedTarget; net/http accepts them.
func (r *Request) parseTarget() error {
	t := r.Target()
	if len(t) == 0 {
		return malformed("empty request target", t)
	}
	for _, c := range t {
		if c < 0x20 || c == 0x7f {
			return malformed("control byte in request target", t)
		}
	}
	r.path = r.target
	if string(t) == "*" {
		return nil
	}
	if t[0] == '/' {
		return checkPath(t)
	}
	// absolute-form
	n := 0
	switch {
	case len(t) >= 7 && equalFold(t[:7], "http://"):
		n = 7
	case len(t) >= 8 && equalFold(t[:8], "https://"):
		n = 8
	default:
		return wrapf(ErrUnsupportedTarget, "request target", t)
	}
	a := n
	for a < len(t) && t[a] != '/' && t[a] != '?' {
		a++
	}
	if !plainAuthority(t[n:a]) {
		return wrapf(ErrUnsupportedTarget, "request target", t)
	}
	off := int(r.target.off)
	r.absolute = true
	r.host = span{int32(off + n), int32(off + a)}
	r.path = span{int32(off + a), r.target.end}
	return checkPath(t[a:])
}

// plainAuthority reports whether a is host[:port], the host a non-empty
// run of letters, digits, '-' and '.', the port digits.
func plainAuthority(a []byte) bool {
	host, port, hasPort := bytes.Cut(a, []byte{':'})
	if len(host) == 0 {
		return false
	}
	for _, c := range host {
		if !(isDigit(c) || 'a' <= lower(c) && lower(c) <= 'z' || c == '-' || c == '.') {
			return false
		}
	}
	if hasPort {
		for _, c := range port {
			if !isDigit(c) {
				return false
			}
		}
	}
	return true
}

// checkPath checks the %-escapes of the path part (before the first '?')
// of a target, as url.ParseRequestURI does; the query is not checked.
func checkPath(t []byte) error {
	p := t
	if q := bytes.IndexByte(p, '?'); q >= 0 {
		p = p[:q]
	}
	for i := 0; i < len(p); i++ {
		if p[i] == '%' && (i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2])) {
			return malformed("bad %-escape in request target", t)
		}
	}
	return nil
}

func isHex(c byte) bool { return isDigit(c) || 'a' <= lower(c) && lower(c) <= 'f' }

// check applies the net/http server's rules on fields (one Host, required
// from HTTP/1.1 on, of valid bytes) and decides framing and keep-alive.
func (r *Request) check() error {
	hi := r.Index("Host", 0)
	switch {
	case hi >= 0 && r.Index("Host", hi+1) >= 0:
		return malformed("more than one Host field", r.Value(hi))
	case hi < 0 && r.minor >= 1:
		return malformed("missing Host field", nil)
	case hi >= 0:
		for _, c := range r.Value(hi) {
			if !validHostByte[c] {
				return malformed("Host", r.Value(hi))
			}
		}
		if !r.absolute {
			r.host = r.fields[hi].value
		}
	}
	l, err := readLengths(&r.Header, r.minor)
	if err != nil {
		return fmt.Errorf("request: %w", err)
	}
	if err := r.checkConnection(); err != nil {
		return fmt.Errorf("request: %w", err)
	}
	if r.framing, err = requestFraming(l); err != nil {
		return fmt.Errorf("request with Transfer-Encoding and Content-Length: %w", err)
	}
	r.close = wantsClose(&r.Header, r.minor)
	return nil
}

// Method returns the request method, e.g. "GET".
func (r *Request) Method() []byte { return r.bytes(r.method) }

// Target returns the request target as received.
func (r *Request) Target() []byte { return r.bytes(r.target) }

// Host returns the host the request is for: an absolute-form target's
// authority, else the Host field's value (empty for an HTTP/1.0 request
// without one), like net/http's Request.Host.
func (r *Request) Host() []byte { return r.bytes(r.host) }

// Absolute reports whether the target was in absolute-form; the Host
// field, if any, is then not the request's host, and WriteRequest replaces
// it.
func (r *Request) Absolute() bool { return r.absolute }

// Minor returns the minor HTTP version: 0 for HTTP/1.0, 1 for HTTP/1.1
// (2-9 are HTTP/1.1 as far as this package is concerned).
func (r *Request) Minor() byte { return r.minor }

// Framing returns how the request's body is delimited: BodyNone,
// BodyLength or BodyChunked.
func (r *Request) Framing() Framing { return r.framing }

// KeepAlive reports whether the caller's connection may carry another
// request after this one (HTTP/1.1 without "Connection: close", HTTP/1.0
// with "Connection: keep-alive").
func (r *Request) KeepAlive() bool { return !r.close }

// ExpectContinue reports whether the caller waits for a 100 Continue before
// sending the body ("Expect: 100-continue" on HTTP/1.1 with a body), as
// net/http's server decides it. Other Expect values are the forwarder's to
// answer (net/http: 417).
func (r *Request) ExpectContinue() bool {
	v, ok := r.Get("Expect")
	return ok && r.minor >= 1 && r.framing.Kind != BodyNone && equalFold(v, "100-continue")
}

// IsHEAD reports whether the method is HEAD (its response has no body).
func (r *Request) IsHEAD() bool { return string(r.Method()) == "HEAD" }

// Upgrade returns the protocol the caller asks to switch to (the Upgrade
// field's value, when a Connection field lists "upgrade"), or nil.
func (r *Request) Upgrade() []byte {
	if !r.HasToken("Connection", "upgrade") {
		return nil
	}
	v, _ := r.Get("Upgrade")
	return v
}

// HeadLen returns the number of bytes the head took on the wire.
func (r *Request) HeadLen() int { return len(r.buf) }

// h2Preface is the HTTP/2 connection preface (RFC 9113 §3.4).
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// H2PrefaceLen is the length of the HTTP/2 connection preface.
const H2PrefaceLen = len(h2Preface)

// IsH2Preface reports whether p, the first bytes of a connection (from
// bufio.Reader.Peek), are the HTTP/2 prior-knowledge preface; p shorter
// than the preface reports whether it could still become one. The
// forwarder peeks before the first Read and hands such a connection to its
// h2c server: Read refuses HTTP/2.0 with ErrUnsupportedVersion.
func IsH2Preface(p []byte) bool {
	if len(p) > len(h2Preface) {
		p = p[:len(h2Preface)]
	}
	return string(p) == h2Preface[:len(p)]
}

// HeadBuffered reports whether br holds a whole request head already (a
// CRLF CRLF among its buffered bytes), so that Request.Read parses it
// without reading the connection. A false answer only means Read may read.
func HeadBuffered(br *bufio.Reader) bool {
	p, _ := br.Peek(br.Buffered())
	return bytes.Contains(p, crlfcrlf)
}

var crlfcrlf = []byte("\r\n\r\n")
