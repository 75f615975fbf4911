package h1

import "strconv"

// BodyKind is how a message's body is delimited (RFC 9112 §6.3).
type BodyKind uint8

const (
	// BodyNone: the message has no body; the next message (or, after a
	// 101, the tunnelled protocol) starts right after the head.
	BodyNone BodyKind = iota
	// BodyLength: Content-Length bytes follow the head.
	BodyLength
	// BodyChunked: a chunked body, its trailers and the blank line follow.
	BodyChunked
	// BodyUntilClose: a response body that ends when the server closes the
	// connection (no Content-Length, no chunked coding).
	BodyUntilClose
)

func (k BodyKind) String() string {
	switch k {
	case BodyNone:
		return "none"
	case BodyLength:
		return "length"
	case BodyChunked:
		return "chunked"
	case BodyUntilClose:
		return "until-close"
	}
	return "BodyKind(" + strconv.Itoa(int(k)) + ")"
}

// Framing is a message body's delimitation.
type Framing struct {
	Kind BodyKind
	// Length is the body's length for BodyLength, else 0.
	Length int64
}

// lengths are a head's framing fields as net/http reads them: whether it
// has Transfer-Encoding (then chunked, the only coding accepted) and its
// Content-Length (-1: none).
type lengths struct {
	chunked bool
	length  int64
}

// readLengths applies net/http's transfer rules to h (transfer.go:
// parseTransferEncoding, fixLength, fixTrailer) for a message of HTTP/1.minor:
// exactly one Transfer-Encoding field, whose value is "chunked"; every
// Content-Length field the same non-empty decimal number below 2^63; with
// chunked, no Trailer field naming Transfer-Encoding, Trailer or
// Content-Length. Stricter: Transfer-Encoding in HTTP/1.0 is an error
// (net/http ignores it).
func readLengths(h *Header, minor byte) (lengths, error) {
	l := lengths{length: -1}
	if i := h.Index("Transfer-Encoding", 0); i >= 0 {
		if minor == 0 {
			return l, wrapf(ErrAmbiguousLength, "Transfer-Encoding in HTTP/1.0", h.Value(i))
		}
		if h.Index("Transfer-Encoding", i+1) >= 0 {
			return l, wrapf(ErrUnsupportedTE, "more than one Transfer-Encoding field", h.Value(i))
		}
		if !equalFold(h.Value(i), "chunked") {
			return l, wrapf(ErrUnsupportedTE, "Transfer-Encoding", h.Value(i))
		}
		l.chunked = true
	}
	if i := h.Index("Content-Length", 0); i >= 0 {
		first := h.Value(i)
		for j := h.Index("Content-Length", i+1); j >= 0; j = h.Index("Content-Length", j+1) {
			if string(h.Value(j)) != string(first) {
				return l, malformed("differing Content-Length fields", h.Value(j))
			}
		}
		n, ok := parseLength(first)
		if !ok {
			return l, malformed("Content-Length", first)
		}
		l.length = n
	}
	if l.chunked {
		for i := h.Index("Trailer", 0); i >= 0; i = h.Index("Trailer", i+1) {
			if hasToken(h.Value(i), "Transfer-Encoding") || hasToken(h.Value(i), "Trailer") || hasToken(h.Value(i), "Content-Length") {
				return l, malformed("Trailer names a framing field", h.Value(i))
			}
		}
	}
	return l, nil
}

// parseLength is strconv.ParseUint(b, 10, 63) without allocating.
func parseLength(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		if n > (1<<63-1)/10 {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
		if n > 1<<63-1 {
			return 0, false
		}
	}
	return int64(n), true
}

// requestFraming is a request's body framing (RFC 9112 §6.3 rules 4-6):
// chunked, else Content-Length, else none. Stricter than net/http: both
// Transfer-Encoding and Content-Length is an error (net/http lets chunked
// win); RFC 9112 §6.3 allows either.
func requestFraming(l lengths) (Framing, error) {
	switch {
	case l.chunked && l.length >= 0:
		return Framing{}, ErrAmbiguousLength
	case l.chunked:
		return Framing{Kind: BodyChunked}, nil
	case l.length > 0:
		return Framing{Kind: BodyLength, Length: l.length}, nil
	}
	return Framing{}, nil
}

// responseFraming is a response's body framing (RFC 9112 §6.3 rules 1-3,
// 7): none for a response to HEAD and for 1xx, 204 and 304 (whatever its
// fields say), else chunked (which overrides Content-Length, as in
// net/http), else Content-Length, else until the connection closes.
func responseFraming(status int, forHEAD bool, l lengths) Framing {
	switch {
	case forHEAD, status/100 == 1, status == 204, status == 304:
		return Framing{}
	case l.chunked:
		return Framing{Kind: BodyChunked}
	case l.length == 0:
		return Framing{}
	case l.length > 0:
		return Framing{Kind: BodyLength, Length: l.length}
	}
	return Framing{Kind: BodyUntilClose}
}

// wantsClose is net/http's shouldClose: HTTP/1.0 closes unless
// "Connection: keep-alive" (and no "close"); HTTP/1.1 closes on
// "Connection: close".
func wantsClose(h *Header, minor byte) bool {
	if h.HasToken("Connection", "close") {
		return true
	}
	return minor == 0 && !h.HasToken("Connection", "keep-alive")
}
