package h1

import (
	"errors"
	"fmt"
	"net/http"
)

// Sentinels callers branch on. Every parse error wraps exactly one of
// ErrHeadTooLarge, ErrMalformed, ErrUnsupportedTE, ErrUnsupportedVersion or
// io.ErrUnexpectedEOF (the peer closed inside a message); a connection
// closed cleanly before a message's first byte is io.EOF itself. The finer
// malformations below wrap ErrMalformed.
var (
	// ErrHeadTooLarge: the head did not end within the limit (431 for a
	// request; a response is a 502).
	ErrHeadTooLarge = errors.New("h1: message head too large")
	// ErrMalformed: the message breaks HTTP/1.1 syntax or framing (400 for a
	// request, 502 for a response). The connection cannot be reused.
	ErrMalformed = errors.New("h1: malformed message")
	// ErrUnsupportedTE: a Transfer-Encoding other than a single "chunked"
	// (501, as net/http answers).
	ErrUnsupportedTE = errors.New("h1: unsupported transfer encoding")
	// ErrUnsupportedVersion: a protocol other than HTTP/1.x (505), among
	// them the HTTP/2 preface "PRI * HTTP/2.0" (see IsH2Preface).
	ErrUnsupportedVersion = errors.New("h1: unsupported HTTP version")

	// ErrObsFold: a field line folded onto the next one (obs-fold, RFC 9112
	// §5.2). net/http joins folded lines; this package rejects them.
	ErrObsFold = fmt.Errorf("%w: obsolete line folding", ErrMalformed)
	// ErrUnsupportedTarget: a request target in authority-form, or an
	// absolute-form whose scheme is not http(s) or whose authority has
	// userinfo or bytes outside a plain host[:port]. net/http accepts more.
	ErrUnsupportedTarget = fmt.Errorf("%w: unsupported request target", ErrMalformed)
	// ErrUnsupportedMethod: CONNECT, which a function router does not
	// tunnel.
	ErrUnsupportedMethod = fmt.Errorf("%w: unsupported method", ErrMalformed)
	// ErrAmbiguousLength: a request with both Transfer-Encoding and
	// Content-Length, or an HTTP/1.0 message with Transfer-Encoding
	// (RFC 9112 §6.1, §6.3). net/http lets chunked win, or ignores
	// Transfer-Encoding in HTTP/1.0; this package rejects them.
	ErrAmbiguousLength = fmt.Errorf("%w: ambiguous body length", ErrMalformed)
	// ErrBadChunk: a chunked body breaks the chunked coding.
	ErrBadChunk = fmt.Errorf("%w: bad chunked encoding", ErrMalformed)
	// ErrBadConnection: a Connection field names a field that frames or
	// routes the message (Content-Length, Transfer-Encoding, Host, a
	// field of ReservedPrefix).
	// Dropping such a field as hop-by-hop would forward the body without
	// its length, so that its bytes reach the next hop as a message of
	// their own (issue 30); net/http keeps the framing and forwards.
	ErrBadConnection = fmt.Errorf("%w: Connection names a framing field", ErrMalformed)
)

// errNameSpace is a field name with a space in it, which net/http's
// textproto accepts (go.dev/issue/34540) and its server then rejects for
// requests; this package rejects it everywhere.
var errNameSpace = fmt.Errorf("%w: space in field name", ErrMalformed)

// errStatus is a status code outside 100-999 or not three digits; net/http
// accepts "+99" and "000".
var errStatus = fmt.Errorf("%w: bad status code", ErrMalformed)

// errReason is a reason phrase with a control byte, which net/http ignores
// and this package would forward.
var errReason = fmt.Errorf("%w: control byte in reason phrase", ErrMalformed)

// errTrailerLF is a trailer section with a bare LF line ending, which
// net/http accepts in some positions (see Body).
var errTrailerLF = fmt.Errorf("%w: bare LF in trailer section", ErrMalformed)

// Status returns the HTTP status a server answers a request parse error
// with: 431, 501, 505 or 400. Errors that are not parse errors (io.EOF, a
// network error) have no answer: 0.
func Status(err error) int {
	switch {
	case errors.Is(err, ErrHeadTooLarge):
		return http.StatusRequestHeaderFieldsTooLarge
	case errors.Is(err, ErrUnsupportedTE):
		return http.StatusNotImplemented
	case errors.Is(err, ErrUnsupportedVersion):
		return http.StatusHTTPVersionNotSupported
	case errors.Is(err, ErrMalformed):
		return http.StatusBadRequest
	}
	return 0
}

func malformed(what string, b []byte) error {
	return fmt.Errorf("%w: %s %q", ErrMalformed, what, clip(b))
}

func wrapf(sentinel error, what string, b []byte) error {
	return fmt.Errorf("%w: %s %q", sentinel, what, clip(b))
}

// clip bounds how much of the peer's input an error quotes.
func clip(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}
