package noderouter

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"golang.org/x/net/http/httpguts"

	"skipper.dev/skipper/noderouter/h1"
	"skipper.dev/skipper/noderouter/route"
)

// The router's HTTP/1.1 forwarding path on the wire (issue 14, Deliver 2):
// a raw caller writes bytes to the router, a raw instance records exactly
// the bytes the router sent it and answers with scripted bytes, and both
// sides are compared with what Go's own http.ReadRequest makes of the
// caller's bytes.

// wireHost routes a request to the function default/wire.
const wireHost = "Host: wire.default.fn\r\n"

// wireReq is one request as the instance read it from the router.
type wireReq struct {
	conn int    // the instance's connection it came on, from 1
	raw  string // its bytes, head and body, as the router sent them
	req  *http.Request
	body string // decoded
	err  error  // the head or body could not be read to its end
}

// String is the summary rows compare: method, target and body.
func (r wireReq) String() string {
	if r.req == nil {
		return fmt.Sprintf("<unreadable: %v>", r.err)
	}
	s := r.req.Method + " " + r.req.RequestURI
	if r.body != "" {
		s += " " + r.body
	}
	if r.err != nil {
		s += " <broken>"
	}
	return s
}

// wireAnswer is what the instance writes for one request: raw bytes, then
// closing the connection when close is set; after a 101 it echoes what
// comes.
type wireAnswer struct {
	raw   string
	close bool
}

// wireInstance is an instance on loopback that reads each request the
// router sends with http.ReadRequest, records it with its exact bytes, and
// answers with script's bytes (nil: wireOK).
type wireInstance struct {
	ln       net.Listener
	script   func(k int, r *http.Request) wireAnswer
	accepted atomic.Int64
	open     atomic.Int64
	wg       sync.WaitGroup

	mu  sync.Mutex
	got []wireReq
}

// wireOK answers request k with 200, X-Wire: k and the body k (none to
// HEAD): the caller tells the instance's answers, and their order, by it.
func wireOK(k int, r *http.Request) wireAnswer {
	b := strconv.Itoa(k)
	head := "HTTP/1.1 200 OK\r\nX-Wire: " + b + "\r\nContent-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n"
	if r.Method == "HEAD" {
		return wireAnswer{raw: head}
	}
	return wireAnswer{raw: head + b}
}

func startWireInstance(t testing.TB, script func(k int, r *http.Request) wireAnswer) *wireInstance {
	t.Helper()
	if script == nil {
		script = wireOK
	}
	in := &wireInstance{ln: listen(t), script: script}
	in.wg.Go(func() {
		for {
			c, err := in.ln.Accept()
			if err != nil {
				return
			}
			n := int(in.accepted.Add(1))
			in.open.Add(1)
			in.wg.Go(func() {
				defer in.open.Add(-1)
				defer c.Close()
				in.serve(c, n)
			})
		}
	})
	t.Cleanup(in.stop)
	return in
}

// recorder keeps every byte read through it.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

func (in *wireInstance) serve(c net.Conn, conn int) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	rec := &recorder{r: c}
	br := bufio.NewReader(rec)
	pos := func() int { return rec.buf.Len() - br.Buffered() }
	for {
		start := pos()
		if _, err := br.Peek(1); err != nil {
			return
		}
		req, err := http.ReadRequest(br)
		var body []byte
		if err == nil {
			if req.Header.Get("Expect") == "100-continue" {
				// As net/http's server does (the nethttp forwarder's
				// transport waits for it).
				_, _ = io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
			}
			body, err = io.ReadAll(req.Body)
		}
		in.mu.Lock()
		k := len(in.got)
		in.got = append(in.got, wireReq{conn: conn, raw: string(rec.buf.Bytes()[start:pos()]), req: req, body: string(body), err: err})
		in.mu.Unlock()
		if err != nil {
			return
		}
		a := in.script(k, req)
		if _, err := io.WriteString(c, a.raw); err != nil || a.close {
			return
		}
		if strings.HasPrefix(a.raw, "HTTP/1.1 101") {
			_, _ = io.Copy(c, br)
			return
		}
	}
}

// requests returns what the instance read so far.
func (in *wireInstance) requests() []wireReq {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]wireReq(nil), in.got...)
}

func (in *wireInstance) stop() {
	_ = in.ln.Close()
	in.wg.Wait()
}

// wireRouter is a router for default/wire at the instance in, served with
// the forwarder under test.
func wireRouter(t *testing.T, in *wireInstance) (*proxy, string) {
	t.Helper()
	addr := in.ln.Addr().String()
	res := &fakeResolver{cache: &route.Cache{}, addr: addr, upd: route.Update{Generation: 1,
		Instances: []route.InstanceInfo{{Pod: "pod-1", PodUID: "uid-1", Address: addr}}}}
	p, url := proxyServer(t, res, nil)
	return p, strings.TrimPrefix(url, "http://")
}

// settle waits until the instance has read everything the router sent it:
// the router's idle connections closed, the instance's reads ended.
func settle(t *testing.T, p *proxy, in *wireInstance) []wireReq {
	t.Helper()
	switch testForwarder {
	case forwarderH1:
		// When the caller saw its connection end, every upstream
		// connection of it was back in the pool or closed.
		p.pool.close()
	case forwarderLoop:
		// The loops close their idle connections at their next sweep once
		// the pool is closed.
		p.pool.close()
		poll(t, "the instance's connections closed", func() bool { return in.open.Load() == 0 })
	default:
		// The transport may put a connection back after the caller's
		// connection ended.
		poll(t, "the instance's connections closed", func() bool {
			p.nethttp.transport.CloseIdleConnections()
			return in.open.Load() == 0
		})
	}
	in.stop()
	return in.requests()
}

// wireResp is one response as the caller read it.
type wireResp struct {
	status  int
	header  http.Header
	body    string
	trailer http.Header
	te      []string
	close   bool
	err     error // reading its body
}

// String is the summary rows compare: the status, and the body of the
// instance's answers (the router's own are its business).
func (r wireResp) String() string {
	s := strconv.Itoa(r.status)
	if _, ok := r.fromInstance(); ok {
		s += fmt.Sprintf(" %q", r.body)
	}
	if r.err != nil {
		s += fmt.Sprintf(" <%v>", r.err)
	}
	return s
}

// fromInstance returns the X-Wire number of an answer the instance wrote.
func (r wireResp) fromInstance() (int, bool) {
	k, err := strconv.Atoi(r.header.Get("X-Wire"))
	return k, err == nil
}

// wireCall writes writes[0] to the router at addr, reads responses until
// the router closes the connection (or a response cannot be read), and
// writes each further write after a response was read (an Expect:
// 100-continue body after the 100). methods are the requests' methods in
// order (GET past them): a response to HEAD has no body. halfClose ends
// the caller's side after the last write. Every read is bounded by
// timeout.
func wireCall(t testing.TB, addr string, writes []string, methods []string, halfClose bool, timeout time.Duration) ([]wireResp, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	write := func() {
		w := writes[0]
		writes = writes[1:]
		_, _ = io.WriteString(c, w)
		if halfClose && len(writes) == 0 {
			_ = c.(*net.TCPConn).CloseWrite()
		}
	}
	write()
	br := bufio.NewReader(c)
	var out []wireResp
	for final := 0; ; {
		if _, err := br.Peek(1); errors.Is(err, io.EOF) {
			return out, nil
		}
		method := "GET"
		if final < len(methods) {
			method = methods[final]
		}
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			return out, err
		}
		b, err := io.ReadAll(resp.Body)
		out = append(out, wireResp{status: resp.StatusCode, header: resp.Header, body: string(b), trailer: resp.Trailer,
			te: resp.TransferEncoding, close: resp.Close, err: err})
		if err != nil || resp.StatusCode == http.StatusSwitchingProtocols {
			return out, nil
		}
		if resp.StatusCode >= 200 {
			final++
		}
		if len(writes) > 0 {
			write()
		}
	}
}

// stdReq is one request http.ReadRequest read from the caller's bytes.
type stdReq struct {
	req  *http.Request
	raw  []byte // head and body
	body string
}

// stdWire reads data as a stream of requests as Go's HTTP/1 server reads
// them: http.ReadRequest, the server's checks on version, Host and fields,
// the body to its end; it stops after a request that closes the
// connection. err is why it stopped before the end of data.
func stdWire(data []byte) (out []stdReq, err error) {
	rd := bytes.NewReader(data)
	br := bufio.NewReader(rd)
	pos := func() int { return len(data) - rd.Len() - br.Buffered() }
	for pos() < len(data) {
		start := pos()
		req, err := http.ReadRequest(br)
		if err != nil {
			return out, err
		}
		if err := serverChecks(req, data[start:]); err != nil {
			return out, err
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return out, err
		}
		out = append(out, stdReq{req: req, raw: data[start:pos()], body: string(body)})
		if req.Close {
			return out, nil
		}
	}
	return out, nil
}

// serverChecks are the checks net/http's server makes after ReadRequest
// (conn.readRequest). ReadRequest removes Host, so the head is read again.
func serverChecks(req *http.Request, data []byte) error {
	if req.ProtoMajor != 1 {
		return errors.New("unsupported protocol version")
	}
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(data)))
	_, _ = tp.ReadLine()
	mh, err := tp.ReadMIMEHeader()
	if err != nil {
		return err
	}
	hosts := mh["Host"]
	switch {
	case req.ProtoAtLeast(1, 1) && len(hosts) == 0:
		return errors.New("missing required Host header")
	case len(hosts) > 1:
		return errors.New("too many Host headers")
	case len(hosts) == 1 && !httpguts.ValidHostHeader(hosts[0]):
		return errors.New("malformed Host header")
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return errors.New("invalid header name")
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return errors.New("invalid header value")
			}
		}
	}
	return nil
}

// forwardedTarget is the target a request read by net/http goes upstream
// with: an absolute-form target's path and query ("/" first when empty or
// a query), else the target itself.
func forwardedTarget(uri string) string {
	if uri == "*" || strings.HasPrefix(uri, "/") {
		return uri
	}
	_, rest, _ := strings.Cut(uri, "://")
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		rest = rest[i:]
	} else {
		rest = ""
	}
	if !strings.HasPrefix(rest, "/") {
		rest = "/" + rest
	}
	return rest
}

// stricter reports whether the router's refusal (status) of a request
// net/http accepted is one of the rules noderouter/h1/doc.go states as
// stricter than net/http, with its cause visible in the request.
func stricter(status int, s stdReq, maxHead int) bool {
	head, _, _ := bytes.Cut(s.raw, []byte("\n\r\n"))
	head2, _, _ := bytes.Cut(s.raw, []byte("\n\n"))
	if len(head2) < len(head) {
		head = head2
	}
	lower := strings.ToLower(string(head))
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		return len(head) >= maxHead
	case http.StatusHTTPVersionNotSupported:
		return s.req.Method == "PRI" && s.req.ProtoMajor == 2
	case http.StatusBadRequest:
		for k := range s.req.Header {
			if strings.ContainsAny(k, " \t") {
				return true
			}
		}
		uri := s.req.RequestURI
		return strings.Contains(lower, "\n ") || strings.Contains(lower, "\n\t") || // obs-fold
			strings.Contains(lower, "transfer-encoding") || // with Content-Length, or in HTTP/1.0
			s.req.Method == "CONNECT" ||
			(uri != "*" && !strings.HasPrefix(uri, "/") && !plainAbsolute(uri))
	}
	return false
}

// plainAbsolute reports an absolute-form target the router forwards:
// http(s)://host[:port] with a plain host, then a path or query.
func plainAbsolute(uri string) bool {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok || !strings.EqualFold(scheme, "http") && !strings.EqualFold(scheme, "https") {
		return false
	}
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		rest = rest[:i]
	}
	host, port, hasPort := strings.Cut(rest, ":")
	if host == "" || hasPort && (port == "" || strings.Trim(port, "0123456789") != "") {
		return false
	}
	return strings.Trim(strings.ToLower(host), "abcdefghijklmnopqrstuvwxyz0123456789-.") == ""
}

// isRefusal reports the h1 server's own answer to a head it cannot read
// (plain text; the core's answers are JSON).
func isRefusal(r wireResp) bool {
	_, inst := r.fromInstance()
	return !inst && strings.HasPrefix(r.header.Get("Content-Type"), "text/plain")
}

// wireAgree checks one connection through the h1 forwarder against
// net/http's reading of the caller's bytes in: every request the instance
// got is one net/http read, in the same order, with the same method,
// target and body; each answer from the instance reached the caller in
// order; what the router refused, net/http refused too, or a stricter rule
// of noderouter/h1/doc.go applies. resps are the caller's responses, got
// the instance's requests.
func wireAgree(in []byte, resps []wireResp, got []wireReq, maxHead int) error {
	std, stdErr := stdWire(in)
	same := func(g wireReq, s stdReq) error {
		want := s.req.Method + " " + forwardedTarget(s.req.RequestURI)
		if s.body != "" {
			want += " " + s.body
		}
		if g.String() != want {
			return fmt.Errorf("forwarded %q, net/http read %q", g, want)
		}
		return nil
	}
	for k, g := range got {
		if g.req == nil {
			return fmt.Errorf("the router sent a head http.ReadRequest rejects: %v\n%q", g.err, g.raw)
		}
		head, _, _ := strings.Cut(g.raw, "\r\n\r\n")
		if strings.Contains(strings.ReplaceAll(head, "\r\n", ""), "\n") || strings.Contains(head, "\r\r") {
			return fmt.Errorf("request %d went out with a bare line ending: %q", k, head)
		}
		if g.req.Header.Get(HeaderFunction) != "" {
			return fmt.Errorf("request %d went out with %s", k, HeaderFunction)
		}
	}
	var final []wireResp
	for _, r := range resps {
		if r.status >= 200 {
			final = append(final, r)
		}
	}
	answered := 0  // requests of got up to the last one the instance answered
	var ours []int // the requests the router answered itself (not refusals)
	for j, r := range final {
		k, inst := r.fromInstance()
		switch {
		case j > len(std):
			return fmt.Errorf("answer %d (%v): net/http reads only %d requests (%v)", j, r, len(std), stdErr)
		case inst && j == len(std):
			return fmt.Errorf("answer %d: the router forwarded a request net/http rejects (%v)", j, stdErr)
		case inst:
			if k < answered || k >= len(got) {
				return fmt.Errorf("answer %d is the instance's answer to request %d, want one from %d", j, k, answered)
			}
			// Those in between went out for requests the router answered
			// itself (a 502 for a bad response).
			for _, g := range got[answered:k] {
				if !slices.ContainsFunc(ours, func(j int) bool { return same(g, std[j]) == nil }) {
					return fmt.Errorf("request %v forwarded but answered by neither", g)
				}
			}
			if err := same(got[k], std[j]); err != nil {
				return fmt.Errorf("request %d: %w", j, err)
			}
			answered = k + 1
		case isRefusal(r):
			if j != len(final)-1 {
				return fmt.Errorf("answers after refusing request %d", j)
			}
			switch r.status {
			case 400, 431, 501, 505:
			default:
				return fmt.Errorf("refused request %d with %d", j, r.status)
			}
			if j < len(std) && !stricter(r.status, std[j], maxHead) {
				return fmt.Errorf("refused request %d (%d), net/http reads it: %q", j, r.status, std[j].raw)
			}
		case j < len(std):
			ours = append(ours, j)
		}
	}
	// A request forwarded but not answered (the caller half-closed and was
	// taken for gone, or the body broke) is the last one.
	switch extra := got[answered:]; {
	case len(extra) > 1:
		return fmt.Errorf("%d requests forwarded without an answer: %v", len(extra), extra)
	case len(extra) == 1:
		j := len(final)
		if extra[0].err == nil && j < len(std) {
			if err := same(extra[0], std[j]); err != nil {
				return fmt.Errorf("request %d (unanswered): %w", j, err)
			}
		} else if j < len(std) || stdErr == nil {
			return fmt.Errorf("request %d went out broken (%v) but net/http reads it whole", j, extra[0])
		}
	}
	return nil
}

// wireMethods are the methods of the requests net/http reads from data.
func wireMethods(data string) []string {
	std, _ := stdWire([]byte(data))
	var m []string
	for _, s := range std {
		m = append(m, s.req.Method)
	}
	return m
}

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
				if got := r.req.Trailer.Get("X-Sum"); got != "11" && testForwarder == forwarderH1 {
					t.Errorf("trailer X-Sum = %q, want 11 (request %q)", got, r.raw)
				}
				if strings.Contains(r.raw, "ext=1") {
					t.Errorf("a chunk extension went out: %q", r.raw)
				}
			},
		},
		// A body that breaks the chunked coding: the head went out (it may
		// still sit in the router's buffer), the body does not end, the
		// instance never reads a whole request. The h1 forwarder closes the
		// caller's connection without an answer; net/http's server gives
		// the ReverseProxy the body's error: a 502.
		{
			name:        "bad chunk size",
			writes:      []string{post("/c", te, "zz\r\nabc\r\n0\r\n\r\n") + last},
			want:        []string{},
			wantNethttp: []string{`502`},
		},
		{
			name:        "chunk size overflows",
			writes:      []string{post("/c", te, "10000000000000003\r\nabc\r\n0\r\n\r\n") + last},
			want:        []string{},
			wantNethttp: []string{`502`},
		},
		{
			name:        "chunk size line with a bare LF",
			writes:      []string{post("/c", te, "3\nabc\r\n0\r\n\r\n") + last},
			want:        []string{},
			wantNethttp: []string{`502`},
		},
		{
			name:        "chunk extension with a bare LF",
			writes:      []string{post("/c", te, "3;a=\nb\r\nabc\r\n0\r\n\r\n") + last},
			want:        []string{},
			wantNethttp: []string{`502`},
		},
		{
			name:        "chunk data without its CRLF",
			writes:      []string{post("/c", te, "3\r\nabcd\r\n0\r\n\r\n") + last},
			want:        []string{},
			wantNethttp: []string{`502`},
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

// TestWire: the router's HTTP/1.1 path over raw sockets. Each row writes
// a caller's bytes and checks the answers, the requests the instance got
// (and, under h1, wireAgree), and how many connections the instance
// accepted.
func TestWire(t *testing.T) {
	for _, tt := range wireRows() {
		t.Run(tt.name, func(t *testing.T) {
			if testForwarder == forwarderNethttp && tt.skipNethttp != "" {
				t.Skip(tt.skipNethttp)
			}
			in := startWireInstance(t, tt.script)
			p, addr := wireRouter(t, in)
			data := strings.Join(tt.writes, "")
			resps, err := wireCall(t, addr, tt.writes, wireMethods(data), false, 10*time.Second)
			if err != nil {
				t.Fatalf("after %v: %v", resps, err)
			}
			firstConn := len(resps)
			if tt.next != "" {
				more, err := wireCall(t, addr, []string{tt.next}, nil, false, 10*time.Second)
				if err != nil {
					t.Fatalf("second connection, after %v: %v", more, err)
				}
				resps = append(resps, more...)
			}
			got := settle(t, p, in)

			want, fwd := tt.want, tt.fwd
			if testForwarder == forwarderNethttp && tt.wantNethttp != nil {
				want, fwd = tt.wantNethttp, tt.fwdNethttp
			}
			got1 := strs(resps)
			if testForwarder == forwarderNethttp {
				// net/http's server sends its own 100 Continue as the
				// ReverseProxy reads the body, and may relay the instance's
				// too (Expect goes upstream).
				got1 = slices.CompactFunc(got1, func(a, b string) bool { return a == "100" && b == "100" })
			}
			if diff := cmp.Diff(want, got1); diff != "" {
				t.Errorf("responses (-want +got):\n%s", diff)
			}
			var complete []wireReq
			for _, g := range got {
				if g.err == nil {
					complete = append(complete, g)
				}
			}
			if diff := cmp.Diff(fwd, strs(complete), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("requests at the instance (-want +got):\n%s", diff)
			}
			if n := in.accepted.Load(); tt.accepted != 0 && n != tt.accepted {
				t.Errorf("the instance accepted %d connections, want %d", n, tt.accepted)
			}
			if testForwarder == forwarderH1 && tt.next == "" {
				if err := wireAgree([]byte(data), resps[:firstConn], got, DefaultConfig().MaxHeaderBytes); err != nil {
					t.Errorf("against http.ReadRequest: %v", err)
				}
			}
			if tt.check != nil && !t.Failed() {
				tt.check(t, resps, got)
			}
		})
	}
}

func strs[T fmt.Stringer](l []T) []string {
	out := []string{}
	for _, v := range l {
		out = append(out, v.String())
	}
	return out
}

// TestWireUpgrade: a 101 to a request that asked for an upgrade goes to
// the caller with the upgrade's fields, and then the two connections are
// spliced; the instance got the request with Connection: Upgrade and its
// Upgrade.
func TestWireUpgrade(t *testing.T) {
	in := startWireInstance(t, func(int, *http.Request) wireAnswer {
		return wireAnswer{raw: "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: wire\r\nX-Wire: 0\r\n\r\n"}
	})
	p, addr := wireRouter(t, in)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	msgs := []string{"early\n", "late\n"}
	if testForwarder == forwarderNethttp {
		// httputil.ReverseProxy copies from the hijacked connection, not
		// from the server's reader: what came with the head is lost.
		msgs = msgs[1:]
	}
	head := "GET /u HTTP/1.1\r\n" + wireHost + "Connection: keep-alive, Upgrade\r\nUpgrade: wire\r\n\r\n"
	if msgs[0] == "early\n" {
		head += msgs[0]
	}
	_, _ = io.WriteString(c, head)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 101 || resp.Header.Get("Upgrade") != "wire" || !httpguts.HeaderValuesContainsToken(resp.Header["Connection"], "upgrade") {
		t.Fatalf("status %d, fields %v; want 101 with the upgrade", resp.StatusCode, resp.Header)
	}
	// Bytes sent with the request head, and after the 101, come back.
	for _, msg := range msgs {
		if msg == "late\n" {
			_, _ = io.WriteString(c, msg)
		}
		got, err := br.ReadString('\n')
		if err != nil || got != msg {
			t.Fatalf("echoed %q, %v; want %q", got, err, msg)
		}
	}
	c.Close()
	got := settle(t, p, in)
	if len(got) != 1 {
		t.Fatalf("the instance read %v", got)
	}
	h := got[0].req.Header
	if h.Get("Upgrade") != "wire" || !httpguts.HeaderValuesContainsToken(h["Connection"], "upgrade") ||
		httpguts.HeaderValuesContainsToken(h["Connection"], "keep-alive") {
		t.Errorf("upgrade fields at the instance: Connection %q, Upgrade %q", h["Connection"], h["Upgrade"])
	}
}

// FuzzRouterWire writes arbitrary caller bytes (pipelined requests)
// through the h1 forwarder to a recording instance and checks wireAgree:
// every request forwarded is one http.ReadRequest reads from the same
// bytes, in the same order, with the same method, target and body; each
// answer reaches the caller in order; what the router refuses, net/http
// refuses, or a stricter rule of noderouter/h1/doc.go applies. The caller
// half-closes after its bytes and every read has a deadline: a router that
// hangs fails the input.
func FuzzRouterWire(f *testing.F) {
	if testForwarder != forwarderH1 {
		f.Skip("the agreement with http.ReadRequest is the h1 forwarder's; nethttp reads with net/http itself")
	}
	for _, r := range wireRows() {
		if data := strings.Join(r.writes, ""); len(data) < 4<<10 {
			f.Add([]byte(data))
		}
	}
	f.Add([]byte("GET http://wire.default.fn?q HTTP/1.1\r\nHost: x\r\n\r\nHEAD * HTTP/1.1\r\n" + wireHost + "\r\n"))
	f.Add([]byte("POST /a HTTP/1.1\r\nX-Skipper-Function: default/wire\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nxGET /b HTTP/1.0\r\nHost: b\r\n\r\n"))
	maxHead := DefaultConfig().MaxHeaderBytes
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) >= h1.H2PrefaceLen && h1.IsH2Preface(data) {
			return // handed to the h2c server
		}
		in := startWireInstance(t, nil)
		p, addr := wireRouter(t, in)
		resps, err := wireCall(t, addr, []string{string(data)}, wireMethods(string(data)), true, 5*time.Second)
		if err != nil {
			t.Fatalf("after %v: %v", resps, err)
		}
		got := settle(t, p, in)
		if err := wireAgree(data, resps, got, maxHead); err != nil {
			t.Fatalf("%v\ncaller's bytes: %q\nresponses: %v\nforwarded: %q", err, data, resps, got)
		}
	})
}
