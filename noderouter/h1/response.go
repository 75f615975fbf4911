package h1

import (
	"bufio"
	"bytes"
	"fmt"
)

// Response is a parsed response head, reused like Request.
type Response struct {
	Header
	status  int
	reason  span
	minor   byte
	framing Framing
	close   bool
}

// Read reads and validates the next response head from br, at most max
// bytes of it, and decides its body framing and whether the connection may
// carry another request. forHEAD says the request was a HEAD (no body
// follows whatever the fields say). A 1xx response is a whole message: the
// final response follows it (after a 101, the new protocol).
//
// With chunked framing any Content-Length field is marked dropped (RFC
// 9112 §6.3: an intermediary removes it before forwarding).
//
// Like Request.Read it returns io.EOF, unwrapped, when br ends before the
// first byte: the instance closed the (idle) connection without answering,
// which a forwarder may treat as "nothing was processed" for retries.
func (r *Response) Read(br *bufio.Reader, max int, forHEAD bool) error {
	*r = Response{Header: r.Header}
	if err := r.readHead(br, max, r.parseLine); err != nil {
		return err
	}
	l, err := readLengths(&r.Header, r.minor)
	if err != nil {
		return fmt.Errorf("response: %w", err)
	}
	if err := r.checkConnection(); err != nil {
		return fmt.Errorf("response: %w", err)
	}
	r.framing = responseFraming(r.status, forHEAD, l)
	if l.chunked {
		r.Drop("Content-Length")
	}
	r.close = wantsClose(&r.Header, r.minor) || r.framing.Kind == BodyUntilClose
	return nil
}

// parseLine parses the status line r.buf[:end] as net/http's ReadResponse
// does: version SP, any spaces, a three-digit code, then SP and the reason
// phrase or nothing. Stricter: the version must be HTTP/1.x, the code 100
// to 999 in digits (net/http takes "+99" and "000"), the reason without
// control bytes other than HTAB.
func (r *Response) parseLine(end int) error {
	line := r.buf[:end]
	sp := bytes.IndexByte(line, ' ')
	if sp < 0 {
		return malformed("status line", line)
	}
	rest := line[sp+1:]
	for len(rest) > 0 && rest[0] == ' ' {
		rest = rest[1:]
	}
	code, reason, _ := bytes.Cut(rest, []byte{' '})
	if len(code) != 3 {
		return malformed("status code", line)
	}
	if !isDigit(code[0]) || !isDigit(code[1]) || !isDigit(code[2]) || code[0] == '0' {
		return wrapf(errStatus, "status code", line)
	}
	minor, err := parseVersion(line[:sp])
	if err != nil {
		return err
	}
	for _, c := range reason {
		if !validValueByte[c] {
			return wrapf(errReason, "status line", line)
		}
	}
	r.minor = minor
	r.status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	off := end - len(reason)
	r.reason = span{int32(off), int32(end)}
	return nil
}

// Status returns the status code.
func (r *Response) Status() int { return r.status }

// Reason returns the reason phrase (may be empty).
func (r *Response) Reason() []byte { return r.bytes(r.reason) }

// Minor returns the minor HTTP version.
func (r *Response) Minor() byte { return r.minor }

// Framing returns how the response's body is delimited.
func (r *Response) Framing() Framing { return r.framing }

// KeepAlive reports whether the upstream connection may carry another
// request after this response's body: not when the response asks to close
// ("Connection: close", HTTP/1.0 without keep-alive) or its body runs to
// the close. The request's own Connection: close is the caller's to add.
func (r *Response) KeepAlive() bool { return !r.close }

// Informational reports whether the status is 1xx other than 101: an
// interim response (100 Continue, 103 Early Hints) the final one follows.
func (r *Response) Informational() bool { return r.status/100 == 1 && r.status != 101 }

// SwitchingProtocols reports a 101: after its head the connection carries
// the protocol the request's Upgrade named, in both directions.
func (r *Response) SwitchingProtocols() bool { return r.status == 101 }

// HeadLen returns the number of bytes the head took on the wire.
func (r *Response) HeadLen() int { return len(r.buf) }
