package h1

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the fuzz seed corpora in testdata/fuzz from the table tests")

// framingCase is one stream of messages: the pieces are the wire messages
// in order (the last may be one that fails), want what each accepted one
// comes to (End is filled in from the pieces), err the sentinel of the
// failure, nil if every piece is accepted.
type framingCase struct {
	name   string
	pieces []string
	head   bool // responses: to a HEAD request
	want   []msg
	err    error
}

const (
	get      = "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
	getClose = "GET /c HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
	post5    = "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
)

var requestCases = []framingCase{
	{name: "get", pieces: []string{get}, want: []msg{{KeepAlive: true, Host: "a"}}},
	{name: "bare LF line endings", pieces: []string{"GET / HTTP/1.1\nHost: a\n\n"}, want: []msg{{KeepAlive: true, Host: "a"}}},
	{name: "content-length", pieces: []string{post5}, want: []msg{{Body: "hello", KeepAlive: true, Host: "a"}}},
	{name: "content-length 0", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", get},
		want: []msg{{KeepAlive: true, Host: "a"}, {KeepAlive: true, Host: "a"}}},
	{name: "equal duplicate content-length", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-length:  3 \r\n\r\nabc"},
		want: []msg{{Body: "abc", KeepAlive: true, Host: "a"}}},
	{name: "chunked with extensions and trailers", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n" +
		"5;ext=1\r\nhello\r\n6 \r\n world\r\n0\r\nX-Sum: 1\r\nX-Other: 2\r\n\r\n", get},
		want: []msg{{Body: "hello world", KeepAlive: true, Host: "a"}, {KeepAlive: true, Host: "a"}}},
	{name: "pipelined", pieces: []string{get, post5, getClose}, want: []msg{
		{KeepAlive: true, Host: "a"}, {Body: "hello", KeepAlive: true, Host: "a"}, {Host: "a"}}},
	{name: "expect 100-continue", pieces: []string{"PUT /u HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"},
		want: []msg{{Body: "abc", KeepAlive: true, Host: "a"}}},
	{name: "HTTP/1.0 closes by default", pieces: []string{"GET / HTTP/1.0\r\n\r\n"}, want: []msg{{}}},
	{name: "HTTP/1.0 keep-alive", pieces: []string{"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\nHost: h\r\n\r\n", "GET / HTTP/1.0\r\n\r\n"},
		want: []msg{{KeepAlive: true, Host: "h"}, {}}},
	{name: "connection close among tokens", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, CLOSE\r\n\r\n"}, want: []msg{{Host: "a"}}},
	{name: "absolute-form wins over Host", pieces: []string{"GET HTTP://fn.ns.fn:80/p?q HTTP/1.1\r\nHost: other\r\n\r\n"},
		want: []msg{{KeepAlive: true, Host: "fn.ns.fn:80"}}},
	{name: "asterisk-form", pieces: []string{"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"}, want: []msg{{KeepAlive: true, Host: "a"}}},
	{name: "HTTP/1.9 is 1.1", pieces: []string{"GET / HTTP/1.9\r\nHost: a\r\n\r\n"}, want: []msg{{KeepAlive: true, Host: "a"}}},
	{name: "obs-text in value, OWS trimmed", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\nX: \t\xff v \t\r\n\r\n"}, want: []msg{{KeepAlive: true, Host: "a"}}},

	{name: "differing content-length", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"}, err: ErrMalformed},
	{name: "signed content-length", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc"}, err: ErrMalformed},
	{name: "empty content-length", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n"}, err: ErrMalformed},
	{name: "content-length list", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc"}, err: ErrMalformed},
	{name: "content-length 2^63", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775808\r\n\r\n"}, err: ErrMalformed},
	{name: "transfer-encoding gzip", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"}, err: ErrUnsupportedTE},
	{name: "transfer-encoding twice", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"}, err: ErrUnsupportedTE},
	{name: "transfer-encoding and content-length (stricter)", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"}, err: ErrAmbiguousLength},
	{name: "transfer-encoding in HTTP/1.0 (stricter)", pieces: []string{"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\nx"}, err: ErrAmbiguousLength},
	{name: "trailer names content-length", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTrailer: content-length\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"}, err: ErrMalformed},
	{name: "obs-fold (stricter)", pieces: []string{get, "GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n\r\n"}, want: []msg{{KeepAlive: true, Host: "a"}}, err: ErrObsFold},
	{name: "leading whitespace before first field", pieces: []string{"GET / HTTP/1.1\r\n Host: a\r\n\r\n"}, err: ErrMalformed},
	{name: "space before colon", pieces: []string{"GET / HTTP/1.1\r\nHost : a\r\n\r\n"}, err: ErrMalformed},
	{name: "empty field name", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\n: x\r\n\r\n"}, err: ErrMalformed},
	{name: "no colon", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\nX\r\n\r\n"}, err: ErrMalformed},
	{name: "NUL in value", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n"}, err: ErrMalformed},
	{name: "bare CR in value", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n"}, err: ErrMalformed},
	{name: "CR CR LF", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\r\n\r\n"}, err: ErrMalformed},
	{name: "missing Host", pieces: []string{"GET / HTTP/1.1\r\n\r\n"}, err: ErrMalformed},
	{name: "two Hosts", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n"}, err: ErrMalformed},
	{name: "bad Host byte", pieces: []string{"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n"}, err: ErrMalformed},
	{name: "two-part request line", pieces: []string{"GET /\r\nHost: a\r\n\r\n"}, err: ErrMalformed},
	{name: "extra space in request line", pieces: []string{"GET  / HTTP/1.1\r\nHost: a\r\n\r\n"}, err: ErrMalformed},
	{name: "lower-case version", pieces: []string{"GET / http/1.1\r\nHost: a\r\n\r\n"}, err: ErrMalformed},
	{name: "HTTP/2.0", pieces: []string{"GET / HTTP/2.0\r\nHost: a\r\n\r\n"}, err: ErrUnsupportedVersion},
	{name: "HTTP/0.9", pieces: []string{"GET / HTTP/0.9\r\nHost: a\r\n\r\n"}, err: ErrUnsupportedVersion},
	{name: "h2 preface", pieces: []string{h2Preface}, err: ErrUnsupportedVersion},
	{name: "bad method", pieces: []string{"G@T / HTTP/1.1\r\nHost: a\r\n\r\n"}, err: ErrMalformed},
	{name: "bad %-escape", pieces: []string{"GET /a%zz HTTP/1.1\r\nHost: a\r\n\r\n"}, err: ErrMalformed},
	{name: "control byte in target", pieces: []string{"GET /a\x01 HTTP/1.1\r\nHost: a\r\n\r\n"}, err: ErrMalformed},
	{name: "CONNECT (stricter)", pieces: []string{"CONNECT fn:443 HTTP/1.1\r\nHost: fn:443\r\n\r\n"}, err: ErrUnsupportedMethod},
	{name: "opaque target (stricter)", pieces: []string{"GET mailto:x HTTP/1.1\r\nHost: a\r\n\r\n"}, err: ErrUnsupportedTarget},
	{name: "userinfo (stricter)", pieces: []string{"GET http://u@fn/ HTTP/1.1\r\nHost: a\r\n\r\n"}, err: ErrUnsupportedTarget},
	{name: "chunk size with bare LF", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n"}, err: ErrBadChunk},
	{name: "chunk size not hex", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nx\r\n"}, err: ErrBadChunk},
	{name: "chunk size space before extension", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5 ;e\r\nhello\r\n0\r\n\r\n"}, err: ErrBadChunk},
	{name: "chunk size of 17 digits", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n00000000000000001\r\nx\r\n0\r\n\r\n"}, err: ErrBadChunk},
	{name: "CR in chunk extension", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1;a\rb\r\nx\r\n0\r\n\r\n"}, err: ErrBadChunk},
	{name: "chunk data not followed by CRLF", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"}, err: ErrBadChunk},
	{name: "trailer with bare LF (stricter)", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: 1\n\r\n\r\n"}, err: errTrailerLF},
	{name: "truncated body", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhel"}, err: io.ErrUnexpectedEOF},
	{name: "truncated head", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\n"}, err: io.ErrUnexpectedEOF},
	{name: "truncated chunked", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"}, err: io.ErrUnexpectedEOF},
	{name: "leading blank line", pieces: []string{"\r\n" + get}, err: ErrMalformed},
	// A Connection field naming what frames or routes the request (issue
	// 30): dropped as hop-by-hop, the body would go on without its length.
	{name: "connection names content-length (stricter)", pieces: []string{get, "POST /outer HTTP/1.1\r\nHost: a\r\nConnection: Content-Length\r\nContent-Length: 26\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n"},
		want: []msg{{KeepAlive: true, Host: "a"}}, err: ErrBadConnection},
	{name: "connection names transfer-encoding (stricter)", pieces: []string{"POST / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, transfer-encoding\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"}, err: ErrBadConnection},
	{name: "connection names host (stricter)", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\nConnection: host\r\n\r\n"}, err: ErrBadConnection},
	{name: "connection names upgrade without one", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\n\r\n"}, want: []msg{{KeepAlive: true, Host: "a"}}},
	{name: "connection names x-skipper field (stricter)", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\nConnection: x-skipper-caller\r\nX-Skipper-Caller: ns/sa\r\n\r\n"}, err: ErrBadConnection},
	{name: "connection names an upgrade", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"}, want: []msg{{KeepAlive: true, Host: "a"}}},
	{name: "connection names other fields", pieces: []string{"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, x-hop, content-type\r\nX-Hop: 1\r\n\r\n"}, want: []msg{{KeepAlive: true, Host: "a"}}},
}

var responseCases = []framingCase{
	{name: "content-length", pieces: []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"}, want: []msg{{Body: "hi", KeepAlive: true, Status: 200}}},
	{name: "no reason phrase", pieces: []string{"HTTP/1.1   404\r\nContent-Length: 0\r\n\r\n"}, want: []msg{{KeepAlive: true, Status: 404}}},
	{name: "close-delimited", pieces: []string{"HTTP/1.1 200 OK\r\n\r\nall of it\r\n0\r\n\r\n"}, want: []msg{{Body: "all of it\r\n0\r\n\r\n", Status: 200}}},
	{name: "chunked with trailers", pieces: []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 9\r\n\r\n", "HTTP/1.1 204 No Content\r\n\r\n"},
		want: []msg{{Body: "abc", KeepAlive: true, Status: 200}, {KeepAlive: true, Status: 204}}},
	{name: "chunked overrides content-length", pieces: []string{"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
		want: []msg{{Body: "abc", KeepAlive: true, Status: 200}}},
	{name: "HEAD response has no body", head: true, pieces: []string{"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"},
		want: []msg{{KeepAlive: true, Status: 200}, {KeepAlive: true, Status: 200}}},
	{name: "HEAD response without length stays open", head: true, pieces: []string{"HTTP/1.1 200 OK\r\n\r\n"}, want: []msg{{KeepAlive: true, Status: 200}}},
	{name: "204 and 304 have no body", pieces: []string{"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"},
		want: []msg{{KeepAlive: true, Status: 204}, {KeepAlive: true, Status: 304}, {Body: "x", KeepAlive: true, Status: 200}}},
	{name: "100 continue then final", pieces: []string{"HTTP/1.1 100 Continue\r\n\r\n", "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"},
		want: []msg{{KeepAlive: true, Status: 100}, {KeepAlive: true, Status: 201}}},
	{name: "103 early hints then final", pieces: []string{"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"},
		want: []msg{{KeepAlive: true, Status: 103}, {Body: "x", KeepAlive: true, Status: 200}}},
	{name: "101 switching protocols", pieces: []string{"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"},
		want: []msg{{KeepAlive: true, Status: 101}}},
	{name: "HTTP/1.0 closes by default", pieces: []string{"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx"}, want: []msg{{Body: "x", Status: 200}}},
	{name: "HTTP/1.0 keep-alive", pieces: []string{"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"},
		want: []msg{{Body: "x", KeepAlive: true, Status: 200}, {Status: 200}}},
	{name: "status 999", pieces: []string{"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n"}, want: []msg{{KeepAlive: true, Status: 999}}},

	{name: "status +99 (stricter)", pieces: []string{"HTTP/1.1 +99 OK\r\n\r\n"}, err: errStatus},
	{name: "status 099 (stricter)", pieces: []string{"HTTP/1.1 099 OK\r\n\r\n"}, err: errStatus},
	{name: "status of 4 digits", pieces: []string{"HTTP/1.1 2000 OK\r\n\r\n"}, err: ErrMalformed},
	{name: "control byte in reason (stricter)", pieces: []string{"HTTP/1.1 200 O\x01K\r\n\r\n"}, err: errReason},
	{name: "HTTP/2.0 status line (stricter)", pieces: []string{"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n"}, err: ErrUnsupportedVersion},
	{name: "no space in status line", pieces: []string{"HTTP/1.1\r\n\r\n"}, err: ErrMalformed},
	{name: "transfer-encoding identity", pieces: []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n"}, err: ErrUnsupportedTE},
	{name: "transfer-encoding in HTTP/1.0 (stricter)", pieces: []string{"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\nx"}, err: ErrAmbiguousLength},
	{name: "bad content-length on 204", pieces: []string{"HTTP/1.1 204 No Content\r\nContent-Length: x\r\n\r\n"}, err: ErrMalformed},
	{name: "bad content-length on HEAD", head: true, pieces: []string{"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"}, err: ErrMalformed},
	{name: "space in field name (stricter)", pieces: []string{"HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\n"}, err: errNameSpace},
	{name: "obs-fold (stricter)", pieces: []string{"HTTP/1.1 200 OK\r\nX: a\r\n\tb\r\nContent-Length: 0\r\n\r\n"}, err: ErrObsFold},
	{name: "truncated chunked", pieces: []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab"}, err: io.ErrUnexpectedEOF},
	{name: "empty stream", pieces: []string{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"},
		want: []msg{{KeepAlive: true, Status: 200}}, err: io.ErrUnexpectedEOF},
	{name: "connection names content-length (stricter)", pieces: []string{"HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: 2\r\n\r\nhi"}, err: ErrBadConnection},
	{name: "connection names transfer-encoding (stricter)", pieces: []string{"HTTP/1.1 200 OK\r\nConnection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"}, err: ErrBadConnection},
	{name: "connection names x-skipper field (stricter)", pieces: []string{"HTTP/1.1 204 No Content\r\nConnection: X-Skipper-Function\r\n\r\n"}, err: ErrBadConnection},
	{name: "connection names upgrade without one", pieces: []string{"HTTP/1.1 200 OK\r\nConnection: upgrade\r\nContent-Length: 0\r\n\r\n"}, want: []msg{{KeepAlive: true, Status: 200}}},
	{name: "an upgrade offered (RFC 9110 7.8)", pieces: []string{"HTTP/1.1 200 OK\r\nUpgrade: h2c\r\nConnection: Upgrade\r\nContent-Length: 0\r\n\r\n"}, want: []msg{{KeepAlive: true, Status: 200}}},
}

func (c framingCase) input() []byte { return []byte(strings.Join(c.pieces, "")) }

// wantMsgs fills in the End of each wanted message from the pieces.
func (c framingCase) wantMsgs() []msg {
	var want []msg
	end := 0
	for i, m := range c.want {
		end += len(c.pieces[i])
		m.End = end
		want = append(want, m)
	}
	return want
}

func checkErr(t *testing.T, want, got error) {
	t.Helper()
	switch {
	case want == nil && got != nil:
		t.Errorf("error %v, want none", got)
	case want != nil && !errors.Is(got, want):
		t.Errorf("error %v, want %v", got, want)
	}
}

func TestRequestFraming(t *testing.T) {
	for _, c := range requestCases {
		t.Run(c.name, func(t *testing.T) {
			data := c.input()
			got, err := ourRequests(data)
			if diff := cmp.Diff(c.wantMsgs(), got); diff != "" {
				t.Errorf("messages (-want +got):\n%s", diff)
			}
			checkErr(t, c.err, err)
			std, reqs, stdErr := stdRequests(data)
			if err := agree(data, got, err, std, stdErr, reqs, nil); err != nil {
				t.Errorf("disagreement with net/http: %v", err)
			}
		})
	}
}

func TestResponseFraming(t *testing.T) {
	for _, c := range responseCases {
		t.Run(c.name, func(t *testing.T) {
			data := c.input()
			method := "GET"
			if c.head {
				method = "HEAD"
			}
			got, err := ourResponses(data, method)
			if diff := cmp.Diff(c.wantMsgs(), got); diff != "" {
				t.Errorf("messages (-want +got):\n%s", diff)
			}
			checkErr(t, c.err, err)
			std, ress, stdErr := stdResponses(data, method)
			if err := agree(data, got, err, std, stdErr, nil, ress); err != nil {
				t.Errorf("disagreement with net/http: %v", err)
			}
		})
	}
}

func FuzzRequestFraming(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		ours, ourErr := ourRequests(data)
		std, reqs, stdErr := stdRequests(data)
		if err := agree(data, ours, ourErr, std, stdErr, reqs, nil); err != nil {
			t.Fatalf("%q: %v", data, err)
		}
	})
}

func FuzzResponseFraming(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, head bool) {
		method := "GET"
		if head {
			method = "HEAD"
		}
		ours, ourErr := ourResponses(data, method)
		std, ress, stdErr := stdResponses(data, method)
		if err := agree(data, ours, ourErr, std, stdErr, nil, ress); err != nil {
			t.Fatalf("%q (%s): %v", data, method, err)
		}
	})
}

// TestSeedCorpus keeps testdata/fuzz in step with the table cases: every
// case is a seed of its fuzz target. Run with -update to rewrite them.
func TestSeedCorpus(t *testing.T) {
	write := func(target, name, body string) {
		path := filepath.Join("testdata", "fuzz", target, strings.NewReplacer(" ", "_", "/", "_", "(", "", ")", "", "^", "").Replace(name))
		want := "go test fuzz v1\n" + body
		if *update {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != want {
			t.Errorf("%s is stale or missing (go test ./noderouter/h1 -run TestSeedCorpus -update): %v", path, err)
		}
	}
	for _, c := range requestCases {
		write("FuzzRequestFraming", c.name, fmt.Sprintf("[]byte(%q)\n", c.input()))
	}
	for _, c := range responseCases {
		write("FuzzResponseFraming", c.name, fmt.Sprintf("[]byte(%q)\nbool(%v)\n", c.input(), c.head))
	}
}
