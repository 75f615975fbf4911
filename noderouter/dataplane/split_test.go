package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"golang.org/x/net/http/httpguts"

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/h1"
	"skipper.dev/skipper/noderouter/internal/routertest"
)

// The framing split (issue 30): whatever a caller or an instance writes,
// a request the router accepts reaches the instance as exactly that one
// request, and the instance's answer reaches the caller as exactly that
// answer, through each of the three forwarders.

// forwarders are the router's HTTP/1.1 forwarders; the tests here run
// each in turn, whatever SKIPPER_TEST_FORWARDER says.
var forwarders = []string{ForwarderLoop, ForwarderH1, ForwarderNethttp}

// skipRerun skips a test that runs every forwarder itself when `make
// unit` reruns the package with SKIPPER_TEST_FORWARDER set to another:
// once is enough.
func skipRerun(t testing.TB) {
	if testForwarder != ForwarderLoop {
		t.Skip("runs every forwarder itself: run with the default SKIPPER_TEST_FORWARDER")
	}
}

// hopFields are left out of the comparison on both sides: the fields a
// hop never passes on (RFC 9110 §7.6.1), those the router writes itself
// (the framing, X-Forwarded-*, Forwarded) and Expect, which h1 answers
// and net/http's transport sends.
var hopFields = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Expect",
	"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"}

// passed is h as the next hop should see it: without hopFields, the
// fields h's Connection fields name, the router's X-Skipper-* fields,
// names without a value (a trailer announced but not sent) and names that
// are not tokens (net/http's client reads "X :", its server never writes
// it; h1 refuses it).
func passed(h http.Header) http.Header {
	drop := map[string]bool{}
	for _, k := range hopFields {
		drop[k] = true
	}
	for _, v := range h["Connection"] {
		for e := range strings.SplitSeq(v, ",") {
			drop[http.CanonicalHeaderKey(strings.TrimSpace(e))] = true
		}
	}
	out := http.Header{}
	for k, vv := range h {
		if !drop[k] && len(vv) > 0 && !strings.HasPrefix(k, h1.ReservedPrefix) && httpguts.ValidHeaderFieldName(k) {
			out[k] = vv
		}
	}
	return out
}

// instanceAnswer is what an instance's answer bytes are, as net/http's
// client reads them (res, body; err when it cannot) and whether the h1
// reader, stricter, accepts them.
type instanceAnswer struct {
	res  *http.Response // nil: net/http cannot read its head
	body string
	err  error // net/http's, reading the head or the body
	// h1head is the h1 reader's error on the head, h1err on the head or
	// the body.
	h1head, h1err error
}

func readAnswer(raw []byte, method string) instanceAnswer {
	var a instanceAnswer
	a.res, a.err = http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), &http.Request{Method: method})
	if a.err == nil {
		var b []byte
		b, a.err = io.ReadAll(a.res.Body)
		a.body = string(b)
	} else {
		a.res = nil
	}
	br := bufio.NewReader(bytes.NewReader(raw))
	var r h1.Response
	if a.h1head = r.Read(br, DefaultOptions().MaxHeaderBytes, method == "HEAD"); a.h1head == nil {
		var body h1.Body
		body.Reset(br, r.Framing())
		_, a.h1err = io.Copy(io.Discard, &body)
	} else {
		a.h1err = a.h1head
	}
	return a
}

// headRelayed reports whether fwd relays the answer's head: when its body
// then breaks, the caller's exchange is aborted (or, where the router
// holds the whole answer before relaying it, answered 502).
func (a instanceAnswer) headRelayed(fwd string) bool {
	if a.res == nil || checkConnection(a.res.Header) != nil {
		return false
	}
	return fwd == ForwarderNethttp || a.h1head == nil
}

// sameTarget reports whether the instance got the target net/http read
// (forwardedTarget). net/http's client escapes the path's bytes outside
// ASCII, which h1 forwards as they came: under nethttp the paths are
// compared unescaped.
func sameTarget(fwd, got, want string) bool {
	if got == want || fwd != ForwarderNethttp {
		return got == want
	}
	gp, gq, _ := strings.Cut(got, "?")
	wp, wq, _ := strings.Cut(want, "?")
	gu, err1 := url.PathUnescape(gp)
	wu, err2 := url.PathUnescape(wp)
	return err1 == nil && err2 == nil && gu == wu && gq == wq
}

// relayed reports whether fwd relays the answer rather than answer 502
// for it.
func (a instanceAnswer) relayed(fwd string) bool {
	if a.err != nil || checkConnection(a.res.Header) != nil {
		return false
	}
	return fwd == ForwarderNethttp || a.h1err == nil
}

// closes reports an answer after which the instance ends its side: its
// body runs to the close, or it cannot be read at all.
func (a instanceAnswer) closes() bool { return a.err != nil || a.res.Close }

// isRouterAnswer reports an answer the router wrote itself: JSON with a
// reason (no body at all to a HEAD), or the h1 server's plain-text
// refusal of a head.
func isRouterAnswer(r wireResp) bool {
	ct := r.header.Get("Content-Type")
	return r.status >= 400 && (ct == "application/json" && (r.body == "" || strings.Contains(r.body, `"reason":`)) ||
		strings.HasPrefix(ct, "text/plain"))
}

// splitCheck sends one caller's bytes (one request as net/http's server
// reads them, want) through the router with forwarder fwd to an instance
// answering answer, and checks both ends against net/http's reading.
func splitCheck(t *testing.T, fwd string, data []byte, want stdReq, answer []byte, ans instanceAnswer) error {
	in := startWireInstance(t, func(int, *http.Request) wireAnswer {
		return wireAnswer{raw: string(answer), halfClose: ans.closes()}
	})
	p, addr := wireRouterWith(t, in, fwd, true)
	resps, err := callOnce(addr, data, want.req.Method)
	got := settleWith(t, p, in, fwd)
	if err != nil && !(ans.headRelayed(fwd) && !ans.relayed(fwd)) {
		return fmt.Errorf("reading the answers after %v: %w", resps, err)
	}
	// At the instance: each connection carries at most one request, whole,
	// and it is the caller's.
	perConn := map[int]int{}
	for _, g := range got {
		if perConn[g.conn]++; perConn[g.conn] > 1 {
			return fmt.Errorf("the instance read more than one request on connection %d: %q", g.conn, g.raw)
		}
		if g.err != nil {
			return fmt.Errorf("the instance read a broken request (%v): %q", g.err, g.raw)
		}
		if w := forwardedTarget(want.req.RequestURI); g.req.Method != want.req.Method || !sameTarget(fwd, g.req.RequestURI, w) {
			return fmt.Errorf("forwarded %s %s, net/http read %s %s", g.req.Method, g.req.RequestURI, want.req.Method, w)
		}
		if g.req.Host != want.req.Host {
			return fmt.Errorf("forwarded Host %q, net/http read %q", g.req.Host, want.req.Host)
		}
		if diff := cmp.Diff(passed(want.req.Header), passed(g.req.Header), cmpopts.EquateEmpty()); diff != "" {
			return fmt.Errorf("forwarded fields (-caller's +instance's):\n%s", diff)
		}
		if g.body != want.body {
			return fmt.Errorf("forwarded body %q, net/http read %q", g.body, want.body)
		}
	}
	if err != nil {
		return nil // aborted after the head: the answer's body broke
	}
	// At the caller: exactly one final answer, the instance's as it wrote
	// it, or the router's own.
	var final []wireResp
	for _, r := range resps {
		if r.status >= 200 {
			final = append(final, r)
		}
	}
	if len(final) != 1 {
		return fmt.Errorf("the caller read %d final answers: %v", len(final), resps)
	}
	r := final[0]
	switch {
	case len(got) == 0:
		if !isRouterAnswer(r) {
			return fmt.Errorf("nothing was forwarded, yet the caller got %v %v", r, r.header)
		}
		return nil
	case !ans.relayed(fwd):
		if r.status != http.StatusBadGateway || !isRouterAnswer(r) {
			return fmt.Errorf("an answer the router cannot relay (%v; h1: %v) reached the caller as %v %v", ans.err, ans.h1err, r, r.header)
		}
		return nil
	}
	if r.status != ans.res.StatusCode || r.body != ans.body {
		return fmt.Errorf("the caller got %d %q, the instance answered %d %q", r.status, r.body, ans.res.StatusCode, ans.body)
	}
	wantH, gotH := passed(ans.res.Header), passed(r.header)
	if fwd == ForwarderNethttp {
		// net/http's server adds these when the answer has none.
		for _, k := range []string{"Date", "Content-Type"} {
			if _, ok := wantH[k]; !ok {
				delete(gotH, k)
			}
		}
	}
	if diff := cmp.Diff(wantH, gotH, cmpopts.EquateEmpty()); diff != "" {
		return fmt.Errorf("relayed fields (-instance's +caller's):\n%s", diff)
	}
	if want.req.ProtoAtLeast(1, 1) {
		// An HTTP/1.0 caller gets no trailers: nothing frames them.
		if diff := cmp.Diff(passed(ans.res.Trailer), passed(r.trailer), cmpopts.EquateEmpty()); diff != "" {
			return fmt.Errorf("relayed trailers (-instance's +caller's):\n%s", diff)
		}
	}
	if _, ok := r.trailer[HeaderCaller]; ok {
		return fmt.Errorf("the caller got an %s trailer", HeaderCaller)
	}
	return nil
}

// probe follows a caller's request on its connection once the final
// answer came (unless that closed it): the router answers it itself, 400
// missing_function, and closes. Whatever else the caller reads after the
// answer shows instead. (Half-closing the caller's side would tell the
// same without it, but the router takes a caller that half-closed while
// it waits for gone: 499, nothing written.)
const probe = "GET /probe HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n"

// callOnce writes data to the router at addr and reads the answers to it
// up to the final one (method: the request's); then, on a connection
// still open, the probe's answer; then nothing but the close.
func callOnce(addr string, data []byte, method string) ([]wireResp, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(data); err != nil {
		return nil, err
	}
	br := bufio.NewReader(c)
	var out []wireResp
	for {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			return out, err
		}
		b, err := io.ReadAll(resp.Body)
		r := wireResp{status: resp.StatusCode, header: resp.Header, body: string(b), trailer: resp.Trailer,
			te: resp.TransferEncoding, close: resp.Close, err: err}
		out = append(out, r)
		if err != nil {
			return out, err
		}
		if resp.StatusCode < 200 {
			continue
		}
		if !resp.Close {
			_, _ = io.WriteString(c, probe)
			p, err := http.ReadResponse(br, &http.Request{Method: "GET"})
			if err != nil {
				return out, fmt.Errorf("the probe after the final answer: %w", err)
			}
			b, _ := io.ReadAll(p.Body)
			if p.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), ReasonMissingFunction) {
				return out, fmt.Errorf("the probe after the final answer got %d %q", p.StatusCode, b)
			}
		}
		if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 {
			return out, fmt.Errorf("after the final answer: %q, %v", rest, err)
		}
		return out, nil
	}
}

// smuggle is issue 30's case: a body holding a whole request with a
// forged caller, its length named in Connection.
const smuggled = "GET /smuggled HTTP/1.1\r\nHost: echo.default\r\nX-Skipper-Caller: ns-b/admin\r\n\r\n"

var smuggle = "POST /outer HTTP/1.1\r\n" + wireHost + "Connection: Content-Length\r\nContent-Length: " +
	fmt.Sprint(len(smuggled)) + "\r\n\r\n" + smuggled

// FuzzRouterSplit is the differential target of issue 30: for any bytes a
// caller writes that net/http's server reads as exactly one request, and
// any bytes an instance answers with, through each forwarder the instance
// reads with http.ReadRequest exactly that request (method, target, the
// fields the router passes on, body) and nothing more on its connection,
// and the caller reads with http.ReadResponse exactly the instance's
// answer (status, fields, body, trailers), or the router's own answer
// (a refusal, or a 502 for an answer it cannot relay).
func FuzzRouterSplit(f *testing.F) {
	skipRerun(f)
	ok := "HTTP/1.1 200 OK\r\nX-Wire: 0\r\nContent-Length: 2\r\n\r\nok"
	f.Add([]byte(smuggle), []byte(ok))
	f.Add([]byte("GET / HTTP/1.1\r\n"+wireHost+"\r\n"), []byte("HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: 2\r\n\r\nok"))
	f.Add([]byte("POST /c HTTP/1.1\r\n"+wireHost+"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Skipper-Caller: ns-b/admin\r\nX-Sum: 1\r\n\r\n"),
		[]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Skipper-Caller: x/y\r\nX-Sum: 2\r\n\r\n"))
	f.Add([]byte("POST /a HTTP/1.1\r\n"+wireHost+"Content-Length: 3\r\nContent-Length: 3\r\nX-Keep: 1\r\nConnection: X-Drop\r\nX-Drop: 1\r\n\r\nabc"),
		[]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nokGET /stray HTTP/1.1\r\n\r\n"))
	f.Add([]byte("HEAD /h HTTP/1.1\r\n"+wireHost+"\r\n"), []byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"))
	f.Add([]byte("GET /u HTTP/1.0\r\n"+wireHost+"\r\n"), []byte("HTTP/1.1 200 OK\r\n\r\nuntil close"))
	f.Fuzz(func(t *testing.T, data, answer []byte) {
		if len(data) >= h1.H2PrefaceLen && h1.IsH2Preface(data) {
			return // handed to the h2c server
		}
		std, err := stdWire(data)
		if err != nil || len(std) != 1 || len(std[0].raw) != len(data) {
			return // not one request: FuzzRouterWire's
		}
		ans := readAnswer(answer, std[0].req.Method)
		if ans.err == nil && ans.res.StatusCode < 200 {
			return // interim answers: TestWire's rows
		}
		for _, fwd := range forwarders {
			if err := splitCheck(t, fwd, data, std[0], answer, ans); err != nil {
				t.Fatalf("%s: %v\ncaller's bytes: %q\ninstance's answer: %q", fwd, err, data, answer)
			}
		}
	})
}

// hostileRow is one request, or one answer, shaped to split a message
// (issue 30), sent through each forwarder by TestHostileFraming.
type hostileRow struct {
	name   string
	req    string // the caller's bytes: one request
	answer string // the instance's answer to it ("": 200 "ok")
	// want is the caller's final answer, "<status> <reason>" for the
	// router's own, `<status> "<body>"` for the instance's; fwd the
	// requests the instance read (wireReq.String).
	want string
	fwd  []string
	// Under nethttp (net/http's server and transport), where they differ.
	wantNethttp string
	fwdNethttp  []string
	// closes: the instance's connection is closed after the answer.
	closes bool
	// noInterim: the caller reads no 1xx answer before the final one.
	noInterim bool
	check     func(t *testing.T, fwd string, r wireResp, got []wireReq)
}

func (r hostileRow) expect(fwd string) (string, []string) {
	if fwd == ForwarderNethttp && r.wantNethttp != "" {
		return r.wantNethttp, r.fwdNethttp
	}
	return r.want, r.fwd
}

// summary is a final answer as hostileRow.want states it.
func summary(r wireResp) string {
	if isRouterAnswer(r) {
		if i := strings.Index(r.body, `"reason":"`); i >= 0 {
			reason, _, _ := strings.Cut(r.body[i+len(`"reason":"`):], `"`)
			return fmt.Sprintf("%d %s", r.status, reason)
		}
		return fmt.Sprintf("%d refused", r.status)
	}
	return fmt.Sprintf("%d %q", r.status, r.body)
}

func hostileRows() []hostileRow {
	post := func(fields, body string) string {
		return "POST /p HTTP/1.1\r\n" + wireHost + fields + "\r\n" + body
	}
	get := "GET /g HTTP/1.1\r\n" + wireHost + "\r\n"
	okAnswer := func(fields, body string) string { return "HTTP/1.1 200 OK\r\n" + fields + "\r\n" + body }
	noTrailer := func(name string) func(t *testing.T, fwd string, r wireResp, got []wireReq) {
		return func(t *testing.T, fwd string, r wireResp, got []wireReq) {
			for _, g := range got {
				if _, ok := g.req.Trailer[name]; ok {
					t.Errorf("the instance got trailer %s: %v", name, g.req.Trailer)
				}
			}
			if _, ok := r.trailer[name]; ok {
				t.Errorf("the caller got trailer %s: %v", name, r.trailer)
			}
		}
	}
	const badConn = "400 " + ReasonBadConnection
	return []hostileRow{
		// Each framing or routing field named in a request's Connection.
		{name: "issue 30: Connection names Content-Length", req: smuggle, want: badConn},
		{name: "Connection names Transfer-Encoding", req: post("Connection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n", "3\r\nabc\r\n0\r\n\r\n"), want: badConn},
		{name: "Connection names Host", req: "GET /g HTTP/1.1\r\n" + wireHost + "Connection: keep-alive, Host\r\n\r\n", want: badConn},
		// nginx's WebSocket example sends it on every request: nothing
		// frames or routes by it (h1.BadConnection).
		{name: "Connection names Upgrade outside an upgrade", req: "GET /g HTTP/1.1\r\n" + wireHost + "Connection: Upgrade\r\n\r\n",
			want: `200 "ok"`, fwd: []string{"GET /g"}},
		{name: "Connection names X-Skipper-Function", req: "GET /g HTTP/1.1\r\nX-Skipper-Function: default/wire\r\nHost: h\r\nConnection: x-skipper-function\r\n\r\n", want: badConn},
		{name: "Connection names X-Skipper-Caller", req: "GET /g HTTP/1.1\r\n" + wireHost + "Connection: X-Skipper-Caller\r\n\r\n", want: badConn},
		{name: "Connection names other fields", req: "GET /g HTTP/1.1\r\n" + wireHost + "Connection: X-Hop\r\nX-Hop: 1\r\nX-Keep: 2\r\n\r\n",
			want: `200 "ok"`, fwd: []string{"GET /g"},
			check: func(t *testing.T, _ string, _ wireResp, got []wireReq) {
				if h := got[0].req.Header; h.Get("X-Hop") != "" || h.Get("X-Keep") != "2" {
					t.Errorf("fields at the instance: %v", h)
				}
			}},
		// Lengths.
		{name: "duplicate equal Content-Length", req: post("Content-Length: 3\r\nContent-Length: 3\r\n", "abc"), want: `200 "ok"`, fwd: []string{"POST /p abc"},
			check: func(t *testing.T, _ string, _ wireResp, got []wireReq) {
				if n := strings.Count(strings.ToLower(got[0].raw), "content-length:"); n != 1 {
					t.Errorf("the instance got %d Content-Length fields: %q", n, got[0].raw)
				}
			}},
		{name: "conflicting Content-Length", req: post("Content-Length: 3\r\nContent-Length: 4\r\n", "abcd"), want: "400 refused"},
		// net/http's server lets chunked win and drops Content-Length
		// (one request, not split); h1 refuses it (noderouter/h1/doc.go).
		{name: "Transfer-Encoding with Content-Length", req: post("Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", "3\r\nabc\r\n0\r\n\r\n"), want: "400 refused",
			wantNethttp: `200 "ok"`, fwdNethttp: []string{"POST /p abc"}},
		// The head has gone to the instance when the body breaks: a 400,
		// and the instance's connection closed with the request unfinished.
		{name: "chunk size overflow", req: post("Transfer-Encoding: chunked\r\n", "10000000000000000\r\nabc\r\n0\r\n\r\n"), want: "400 " + ReasonBadBody, closes: true},
		// Field lines.
		{name: "obs-fold", req: "GET /g HTTP/1.1\r\n" + wireHost + "X-Fold: a\r\n b\r\n\r\n", want: "400 refused",
			wantNethttp: `200 "ok"`, fwdNethttp: []string{"GET /g"}},
		{name: "bare LF", req: "GET /g HTTP/1.1\n" + strings.TrimSuffix(wireHost, "\r\n") + "\nX-A: 1\n\n", want: `200 "ok"`, fwd: []string{"GET /g"}},
		// Trailers.
		{name: "X-Skipper-* trailers from the caller", req: post("Transfer-Encoding: chunked\r\n", "3\r\nabc\r\n0\r\nX-Skipper-Caller: ns-b/admin\r\nX-Sum: 1\r\n\r\n"),
			want: `200 "ok"`, fwd: []string{"POST /p abc"}, check: noTrailer(HeaderCaller)},
		// The same shapes in an instance's answers: a 502, and the
		// instance's connection closed.
		{name: "answer: Connection names Content-Length", req: get, answer: okAnswer("Connection: Content-Length\r\nContent-Length: 2\r\n", "ok"),
			want: "502 upstream_error", fwd: []string{"GET /g"}, closes: true},
		{name: "answer: Connection names Transfer-Encoding", req: get, answer: okAnswer("Connection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n", "2\r\nok\r\n0\r\n\r\n"),
			want: "502 upstream_error", fwd: []string{"GET /g"}, closes: true},
		{name: "answer: Connection names X-Skipper-Caller", req: get, answer: okAnswer("Connection: X-Skipper-Caller\r\nContent-Length: 2\r\n", "ok"),
			want: "502 upstream_error", fwd: []string{"GET /g"}, closes: true},
		{name: "answer: an upgrade offered", req: get, answer: okAnswer("Upgrade: h2c\r\nConnection: Upgrade\r\nContent-Length: 2\r\n", "ok"),
			want: `200 "ok"`, fwd: []string{"GET /g"}},
		{name: "answer: duplicate equal Content-Length", req: get, answer: okAnswer("Content-Length: 2\r\nContent-Length: 2\r\n", "ok"),
			want: `200 "ok"`, fwd: []string{"GET /g"}},
		{name: "answer: conflicting Content-Length", req: get, answer: okAnswer("Content-Length: 2\r\nContent-Length: 3\r\n", "ok!"),
			want: "502 upstream_error", fwd: []string{"GET /g"}, closes: true},
		{name: "answer: Transfer-Encoding with Content-Length", req: get, answer: okAnswer("Transfer-Encoding: chunked\r\nContent-Length: 99\r\n", "2\r\nok\r\n0\r\n\r\n"),
			want: `200 "ok"`, fwd: []string{"GET /g"}},
		{name: "answer: bytes after it", req: get, answer: okAnswer("Content-Length: 2\r\n", "okHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray"),
			want: `200 "ok"`, fwd: []string{"GET /g"}, closes: true},
		{name: "answer: obs-fold", req: get, answer: okAnswer("X-Fold: a\r\n b\r\nContent-Length: 2\r\n", "ok"),
			want: "502 upstream_error", fwd: []string{"GET /g"}, closes: true,
			wantNethttp: `200 "ok"`, fwdNethttp: []string{"GET /g"}},
		{name: "answer: 204 with Content-Length", req: get, answer: "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
			want: `204 ""`, fwd: []string{"GET /g"}, check: func(t *testing.T, _ string, r wireResp, _ []wireReq) {
				if v, ok := r.header["Content-Length"]; ok {
					t.Errorf("the caller got a 204 with Content-Length %q", v)
				}
			}},
		{name: "answer: 103 to an HTTP/1.0 caller", req: "GET /g HTTP/1.0\r\n" + wireHost + "\r\n",
			answer: "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
			want:   `200 "ok"`, fwd: []string{"GET /g"}, noInterim: true},
		{name: "answer: bare LF", req: get, answer: "HTTP/1.1 200 OK\nContent-Length: 2\n\nok", want: `200 "ok"`, fwd: []string{"GET /g"}},
		{name: "answer: chunk size overflow", req: get, answer: okAnswer("Content-Length: 2\r\nTransfer-Encoding: chunked\r\n", "10000000000000000\r\nok\r\n0\r\n\r\n"),
			want: "aborted", fwd: []string{"GET /g"}, closes: true},
		{name: "answer: X-Skipper-* trailers", req: get, answer: okAnswer("Transfer-Encoding: chunked\r\n", "2\r\nok\r\n0\r\nX-Skipper-Caller: ns-b/admin\r\nX-Sum: 2\r\n\r\n"),
			want: `200 "ok"`, fwd: []string{"GET /g"}, check: noTrailer(HeaderCaller)},
	}
}

// TestHostileFraming sends the shapes that split a message (issue 30)
// through each forwarder: a request or an answer whose Connection field
// names its framing, duplicate and conflicting lengths, Transfer-Encoding
// with Content-Length, obs-fold, bare LF, an overflowing chunk size,
// X-Skipper-* trailers, in requests and in answers. It checks the
// caller's answer, what the instance read, and that an answer the router
// could not relay left no connection to the instance open.
func TestHostileFraming(t *testing.T) {
	t.Parallel()
	skipRerun(t)
	for _, fwd := range forwarders {
		for _, row := range hostileRows() {
			t.Run(fwd+"/"+row.name, func(t *testing.T) {
				answer := row.answer
				if answer == "" {
					answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
				}
				in := startWireInstance(t, func(int, *http.Request) wireAnswer { return wireAnswer{raw: answer} })
				p, addr := wireRouterWith(t, in, fwd, true)
				method, _, _ := strings.Cut(row.req, " ")
				resps, err := callOnce(addr, []byte(row.req), method)
				var final wireResp
				got := "aborted"
				if len(resps) > 0 && err == nil {
					final = resps[len(resps)-1]
					got = summary(final)
				}
				if row.closes && (fwd != ForwarderNethttp || row.wantNethttp == "") {
					// (nethttp relays what it reads more loosely: a
					// connection it relayed from stays open.)
					poll.Until(t, pollTimeout, pollInterval, "the instance's connection closed", func(context.Context) error { return poll.Unmet(in.open.Load() == 0, "%d open", in.open.Load()) })
				}
				reqs := settleWith(t, p, in, fwd)
				want, wantFwd := row.expect(fwd)
				if got != want {
					t.Errorf("the caller got %s (%v, %v), want %s", got, resps, err, want)
				}
				complete := checkForwarded(t, wantFwd, reqs)
				for _, g := range reqs {
					if strings.Contains(g.raw, "/smuggled") {
						t.Errorf("the instance read %q", g.raw)
					}
				}
				if fwd == ForwarderLoop && method == "GET" && want == `200 "ok"` && row.answer == "" {
					// A warm GET the loop answers itself: its own path ran.
					if n := routertest.Counter(p.m.loopServed); n != 1 {
						t.Errorf("the event loop served %v requests itself, want 1", n)
					}
				}
				if row.noInterim && len(resps) > 1 {
					t.Errorf("the caller read interim answers: %v", resps)
				}
				if row.check != nil && !t.Failed() {
					row.check(t, fwd, final, complete)
				}
			})
		}
	}
}
