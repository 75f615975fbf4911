package dataplane

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// wireRow is one exchange of TestWire: a caller's bytes, the instance's
// script, and what both ends see.
type wireRow struct {
	name   string
	writes []string // the caller's; each after the first once a response came
	next   string   // written on a second connection after the first ended
	script func(int, *http.Request) wireAnswer
	// want: the caller's responses; fwd: the requests the instance read
	// (wireReq.String); accepted: its connections (0: not checked).
	want     []string
	fwd      []string
	accepted int64
	// Under the nethttp forwarder (net/http's server), when it differs.
	wantNethttp []string
	fwdNethttp  []string
	skipNethttp string // why the row does not hold there
	check       func(t *testing.T, resps []wireResp, got []wireReq)
}

// wireRows are TestWire's table; FuzzRouterWire starts from their bytes.
func wireRows() []wireRow {
	get := func(path string) string { return "GET " + path + " HTTP/1.1\r\n" + wireHost + "\r\n" }
	last := "GET /last HTTP/1.1\r\n" + wireHost + "Connection: close\r\n\r\n"
	post := func(path, fields, body string) string {
		return "POST " + path + " HTTP/1.1\r\n" + wireHost + fields + "\r\n" + body
	}
	cl := func(body string) string { return "Content-Length: " + strconv.Itoa(len(body)) + "\r\n" }
	const te = "Transfer-Encoding: chunked\r\n"
	answer := func(raw string) func(int, *http.Request) wireAnswer {
		// raw to the first request, wireOK to the others.
		return func(k int, r *http.Request) wireAnswer {
			if k == 0 {
				return wireAnswer{raw: raw}
			}
			return wireOK(k, r)
		}
	}
	return []wireRow{
		// Framing of request bodies.
		{
			name:   "duplicate equal Content-Length",
			writes: []string{post("/a", cl("abc")+cl("abc"), "abc") + last},
			want:   []string{`200 "0"`, `200 "1"`},
			fwd:    []string{"POST /a abc", "GET /last"},
		},
		{
			name:   "conflicting Content-Length",
			writes: []string{post("/a", "Content-Length: 3\r\nContent-Length: 4\r\n", "abcd") + last},
			want:   []string{`400`},
		},
		{
			name:   "Content-Length list",
			writes: []string{post("/a", "Content-Length: 3, 3\r\n", "abc") + last},
			want:   []string{`400`},
		},
		{
			name:   "signed Content-Length",
			writes: []string{post("/a", "Content-Length: +3\r\n", "abc") + last},
			want:   []string{`400`},
		},
		{
			name:   "Transfer-Encoding gzip, chunked",
			writes: []string{post("/a", "Transfer-Encoding: gzip, chunked\r\n", "3\r\nabc\r\n0\r\n\r\n") + last},
			want:   []string{`501`},
		},
		{
			name:   "Transfer-Encoding twice",
			writes: []string{post("/a", te+te, "3\r\nabc\r\n0\r\n\r\n") + last},
			want:   []string{`501`},
		},
		{
			name:   "Transfer-Encoding identity",
			writes: []string{post("/a", "Transfer-Encoding: identity\r\n"+cl("abc"), "abc") + last},
			want:   []string{`501`},
		},
		{
			// Stricter than net/http, which lets chunked win (smuggling).
			name:        "Transfer-Encoding and Content-Length",
			writes:      []string{post("/a", te+cl("3\r\nabc\r\n0\r\n\r\n"), "3\r\nabc\r\n0\r\n\r\n") + last},
			want:        []string{`400`},
			wantNethttp: []string{`200 "0"`, `200 "1"`},
			fwdNethttp:  []string{"POST /a abc", "GET /last"},
		},
		{
			// Stricter than net/http, which ignores Transfer-Encoding in
			// HTTP/1.0.
			name:        "Transfer-Encoding in HTTP/1.0",
			writes:      []string{"POST /a HTTP/1.0\r\n" + wireHost + te + "\r\n0\r\n\r\n"},
			want:        []string{`400`},
			wantNethttp: []string{`200 "0"`},
			fwdNethttp:  []string{"POST /a"},
		},
		{
			name:     "chunked body re-framed with its trailer",
			writes:   []string{post("/c", te+"Trailer: X-Sum\r\n", "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Sum: 11\r\n\r\n") + last},
			want:     []string{`200 "0"`, `200 "1"`},
			fwd:      []string{"POST /c hello world", "GET /last"},
			accepted: 1,
			check: func(t *testing.T, _ []wireResp, got []wireReq) {
				r := got[0]
				if diff := cmp.Diff([]string{"chunked"}, r.req.TransferEncoding); diff != "" {
					t.Errorf("Transfer-Encoding (-want +got):\n%s", diff)
				}
				if n := strings.Count(strings.ToLower(r.raw), "transfer-encoding:"); n != 1 {
					t.Errorf("%d Transfer-Encoding fields went out: %q", n, r.raw)
				}
				// httputil.ReverseProxy does not forward request trailers.
				if got := r.req.Trailer.Get("X-Sum"); got != "11" && testForwarder == ForwarderH1 {
					t.Errorf("trailer X-Sum = %q, want 11 (request %q)", got, r.raw)
				}
				if strings.Contains(r.raw, "ext=1") {
					t.Errorf("a chunk extension went out: %q", r.raw)
				}
			},
		},
		// A body that breaks the chunked coding: the head went out (it may
		// still sit in the router's buffer), the body does not end, the
		// instance never reads a whole request. Every forwarder answers 400
		// malformed_body and closes the instance's connection (issue 30).
		{
			name:   "bad chunk size",
			writes: []string{post("/c", te, "zz\r\nabc\r\n0\r\n\r\n") + last},
			want:   []string{`400`},
		},
		{
			name:   "chunk size overflows",
			writes: []string{post("/c", te, "10000000000000003\r\nabc\r\n0\r\n\r\n") + last},
			want:   []string{`400`},
		},
		{
			name:   "chunk size line with a bare LF",
			writes: []string{post("/c", te, "3\nabc\r\n0\r\n\r\n") + last},
			want:   []string{`400`},
		},
		{
			name:   "chunk extension with a bare LF",
			writes: []string{post("/c", te, "3;a=\nb\r\nabc\r\n0\r\n\r\n") + last},
			want:   []string{`400`},
		},
		{
			name:   "chunk data without its CRLF",
			writes: []string{post("/c", te, "3\r\nabcd\r\n0\r\n\r\n") + last},
			want:   []string{`400`},
		},
		// Heads.
		{
			// Stricter than net/http, which joins the lines.
			name:        "obs-fold",
			writes:      []string{"GET /a HTTP/1.1\r\n" + wireHost + "X-A: 1\r\n 2\r\n\r\n" + last},
			want:        []string{`400`},
			wantNethttp: []string{`200 "0"`, `200 "1"`},
			fwdNethttp:  []string{"GET /a", "GET /last"},
		},
		{
			name:   "bare LF line endings",
			writes: []string{"GET /a HTTP/1.1\nHost: wire.default.fn\nX-A: 1\n\n" + last},
			want:   []string{`200 "0"`, `200 "1"`},
			fwd:    []string{"GET /a", "GET /last"},
		},
		{
			name:   "CR in a value",
			writes: []string{"GET /a HTTP/1.1\r\n" + wireHost + "X-A: a\rb\r\n\r\n" + last},
			want:   []string{`400`},
		},
		{
			name:   "LF in a value",
			writes: []string{"GET /a HTTP/1.1\r\n" + wireHost + "X-A: a\nb\r\n\r\n" + last},
			want:   []string{`400`},
		},
		{
			name:   "NUL in a value",
			writes: []string{"GET /a HTTP/1.1\r\n" + wireHost + "X-A: a\x00b\r\n\r\n" + last},
			want:   []string{`400`},
		},
		{
			name:   "space before the colon",
			writes: []string{"GET /a HTTP/1.1\r\n" + wireHost + "X-A : 1\r\n\r\n" + last},
			want:   []string{`400`},
		},
		{
			name:   "two Host fields",
			writes: []string{"GET /a HTTP/1.1\r\n" + wireHost + wireHost + "\r\n" + last},
			want:   []string{`400`},
		},
		{
			name:   "HTTP/2.0 request line",
			writes: []string{"GET /a HTTP/2.0\r\n" + wireHost + "\r\n" + last},
			want:   []string{`505`},
		},
		{
			// Past net/http's own limit too (1 MiB + 4096 in the test
			// server), so that both forwarders answer 431.
			name:   "oversized head",
			writes: []string{"GET /a HTTP/1.1\r\n" + wireHost + "X-Big: " + strings.Repeat("b", 1<<20+8<<10) + "\r\n\r\n" + last},
			want:   []string{`431`},
		},
		// Pipelining, Expect.
		{
			name:     "pipelined requests answered in order",
			writes:   []string{get("/1") + post("/2", cl("hello"), "hello") + get("/3") + last},
			want:     []string{`200 "0"`, `200 "1"`, `200 "2"`, `200 "3"`},
			fwd:      []string{"GET /1", "POST /2 hello", "GET /3", "GET /last"},
			accepted: 1,
		},
		{
			name:   "Expect: 100-continue",
			writes: []string{post("/e", cl("hello")+"Expect: 100-continue\r\n", ""), "hello" + last},
			want:   []string{`100`, `200 "0"`, `200 "1"`},

			fwd:      []string{"POST /e hello", "GET /last"},
			accepted: 1,
		},
		// Responses without bodies; the connections stay usable.
		{
			name:     "HEAD",
			writes:   []string{"HEAD /h HTTP/1.1\r\n" + wireHost + "\r\n" + last},
			script:   answer("HTTP/1.1 200 OK\r\nX-Wire: 0\r\nContent-Length: 5\r\n\r\n"),
			want:     []string{`200 ""`, `200 "1"`},
			fwd:      []string{"HEAD /h", "GET /last"},
			accepted: 1,
			check: func(t *testing.T, resps []wireResp, _ []wireReq) {
				if got := resps[0].header.Get("Content-Length"); got != "5" {
					t.Errorf("HEAD's Content-Length = %q, want 5", got)
				}
			},
		},
		{
			name:     "204",
			writes:   []string{get("/n") + last},
			script:   answer("HTTP/1.1 204 No Content\r\nX-Wire: 0\r\n\r\n"),
			want:     []string{`204 ""`, `200 "1"`},
			fwd:      []string{"GET /n", "GET /last"},
			accepted: 1,
		},
		{
			name:     "304",
			writes:   []string{get("/n") + last},
			script:   answer("HTTP/1.1 304 Not Modified\r\nX-Wire: 0\r\nETag: \"x\"\r\n\r\n"),
			want:     []string{`304 ""`, `200 "1"`},
			fwd:      []string{"GET /n", "GET /last"},
			accepted: 1,
		},
		{
			name:     "1xx before the answer",
			writes:   []string{get("/i") + last},
			script:   answer("HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nX-Wire: 0\r\nContent-Length: 2\r\n\r\nok"),
			want:     []string{`103`, `200 "ok"`, `200 "1"`},
			fwd:      []string{"GET /i", "GET /last"},
			accepted: 1,
		},
		{
			// A 101 to a request that asked for no upgrade is not a switch;
			// that connection is not used again.
			name:     "101 without an Upgrade request",
			writes:   []string{get("/u") + last},
			script:   answer("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\n"),
			want:     []string{`502`, `200 "1"`},
			fwd:      []string{"GET /u", "GET /last"},
			accepted: 2,
			skipNethttp: "httputil.ReverseProxy's handleUpgradeResponse leaves a refused 101's connection open " +
				"(res.Body not closed) until the instance closes it",
		},
		// Response bodies re-framed for the caller.
		{
			name:     "chunked response to an HTTP/1.1 caller",
			writes:   []string{get("/c") + last},
			script:   answer("HTTP/1.1 200 OK\r\nX-Wire: 0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nX-Sum: 5\r\n\r\n"),
			want:     []string{`200 "abcde"`, `200 "1"`},
			fwd:      []string{"GET /c", "GET /last"},
			accepted: 1,
			check: func(t *testing.T, resps []wireResp, _ []wireReq) {
				if diff := cmp.Diff([]string{"chunked"}, resps[0].te); diff != "" {
					t.Errorf("Transfer-Encoding (-want +got):\n%s", diff)
				}
				if got := resps[0].trailer.Get("X-Sum"); got != "5" {
					t.Errorf("trailer X-Sum = %q, want 5", got)
				}
			},
		},
		{
			// Its upstream connection ends with it: the next request dials.
			name:   "close-delimited response to an HTTP/1.1 caller",
			writes: []string{get("/c") + last},
			script: func(k int, r *http.Request) wireAnswer {
				return wireAnswer{raw: "HTTP/1.1 200 OK\r\nX-Wire: " + strconv.Itoa(k) + "\r\n\r\nabc", close: true}
			},
			want:     []string{`200 "abc"`, `200 "abc"`},
			fwd:      []string{"GET /c", "GET /last"},
			accepted: 2,
			check: func(t *testing.T, resps []wireResp, _ []wireReq) {
				if diff := cmp.Diff([]string{"chunked"}, resps[0].te); diff != "" || resps[0].close {
					t.Errorf("Transfer-Encoding (-want +got):\n%s; close %t, want a kept connection", diff, resps[0].close)
				}
			},
		},
		{
			name:     "chunked response to an HTTP/1.0 caller",
			writes:   []string{"GET /c HTTP/1.0\r\n" + wireHost + "Connection: keep-alive\r\n\r\n"},
			script:   answer("HTTP/1.1 200 OK\r\nX-Wire: 0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
			want:     []string{`200 "abc"`},
			fwd:      []string{"GET /c"},
			accepted: 1,
			check: func(t *testing.T, resps []wireResp, _ []wireReq) {
				if resps[0].te != nil || !resps[0].close {
					t.Errorf("Transfer-Encoding %q, close %t; want none and close", resps[0].te, resps[0].close)
				}
			},
		},
		{
			name:     "HTTP/1.0 caller kept alive",
			writes:   []string{"GET /k HTTP/1.0\r\n" + wireHost + "Connection: keep-alive\r\n\r\n" + "GET /k2 HTTP/1.0\r\n" + wireHost + "\r\n"},
			want:     []string{`200 "0"`, `200 "1"`},
			fwd:      []string{"GET /k", "GET /k2"},
			accepted: 1,
			check: func(t *testing.T, resps []wireResp, _ []wireReq) {
				if resps[0].close || !resps[1].close {
					t.Errorf("close %t then %t; want kept, then closed", resps[0].close, resps[1].close)
				}
			},
		},
		{
			// The instance breaks the chunked coding and keeps its
			// connection open: the router must not use it again.
			name:     "aborted exchange",
			writes:   []string{get("/b") + last},
			next:     last,
			script:   answer("HTTP/1.1 200 OK\r\nX-Wire: 0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n"),
			want:     []string{`200 "abc" <unexpected EOF>`, `200 "1"`},
			fwd:      []string{"GET /b", "GET /last"},
			accepted: 2,
		},
		// Fields.
		{
			name: "hop-by-hop fields and forwarding headers",
			writes: []string{"GET /f HTTP/1.1\r\nHost: example.com\r\nX-Skipper-Function: default/wire\r\n" +
				"Connection: X-Hop, keep-alive\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nTE: gzip\r\nUpgrade: x\r\n" +
				"Proxy-Connection: keep-alive\r\nX-Forwarded-For: 203.0.113.9\r\nForwarded: for=203.0.113.9\r\nX-Keep: 1\r\n\r\n" + last},
			want: []string{`200 "0"`, `200 "1"`},
			fwd:  []string{"GET /f", "GET /last"},
			check: func(t *testing.T, _ []wireResp, got []wireReq) {
				h := got[0].req.Header
				for _, k := range []string{HeaderFunction, "Connection", "X-Hop", "Keep-Alive", "Te", "Upgrade", "Proxy-Connection"} {
					if v, ok := h[k]; ok {
						t.Errorf("%s went out: %q", k, v)
					}
				}
				want := http.Header{
					"X-Keep":          {"1"},
					"X-Forwarded-For": {"203.0.113.9, 127.0.0.1"},
					"Forwarded":       {"for=203.0.113.9", `for=127.0.0.1;host="example.com";proto=http`},
				}
				for k, v := range want {
					if diff := cmp.Diff(v, h.Values(k)); diff != "" {
						t.Errorf("%s (-want +got):\n%s", k, diff)
					}
				}
			},
		},
	}
}
