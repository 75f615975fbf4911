package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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

	"skipper.dev/skipper/internal/poll"
	"skipper.dev/skipper/noderouter/h1"
	"skipper.dev/skipper/noderouter/internal/routertest"
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
	// halfClose ends the instance's side after raw (a body delimited by
	// the close ends) while it goes on reading what the router sends.
	halfClose bool
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
	in := &wireInstance{ln: routertest.Listen(t), script: script}
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
		if a.halfClose {
			_ = c.(*net.TCPConn).CloseWrite()
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
func wireRouter(t *testing.T, in *wireInstance) (*Proxy, string) {
	t.Helper()
	return wireRouterWith(t, in, testForwarder, false)
}

// wireRouterWith is wireRouter with the forwarder fwd. warm: the cache
// holds the function from the start, so that the event loops serve what
// they can themselves (a cold request is handed to h1 for GetInstance).
// TestWire's rows are cold: warm, the loop differs in two (a resumed
// exchange that fails closes the caller's connection, so a request
// pipelined after it goes unanswered; the loop's own pool opens a second
// instance connection), which issue 32's one pipeline is to end.
func wireRouterWith(t *testing.T, in *wireInstance, fwd string, warm bool) (*Proxy, string) {
	t.Helper()
	addr := in.ln.Addr().String()
	res := &fakeResolver{cache: &route.Cache{}, addr: addr, upd: route.Update{Generation: 1,
		Instances: []route.InstanceInfo{{Pod: "pod-1", PodUID: "uid-1", Address: addr}}}}
	p := testProxy(t, res, nil)
	if warm {
		res.cache.Store(route.Ref{Namespace: "default", Name: "wire"}, res.upd)
	}
	return p, strings.TrimPrefix(serveProxyWith(t, p, fwd), "http://")
}

// settle waits until the instance has read everything the router sent it:
// the router's idle connections closed, the instance's reads ended.
func settle(t *testing.T, p *Proxy, in *wireInstance) []wireReq {
	t.Helper()
	return settleWith(t, p, in, testForwarder)
}

// settleWith is settle for a router serving with the forwarder fwd.
func settleWith(t *testing.T, p *Proxy, in *wireInstance, fwd string) []wireReq {
	t.Helper()
	switch fwd {
	case ForwarderH1:
		// When the caller saw its connection end, every upstream
		// connection of it was back in the pool or closed.
		p.pool.close()
	case ForwarderLoop:
		// The loops close their idle connections at their next sweep once
		// the pool is closed.
		p.pool.close()
		poll.Until(t, pollTimeout, pollInterval, "the instance's connections closed", func(context.Context) error { return poll.Unmet(in.open.Load() == 0, "%d open", in.open.Load()) })
	default:
		// The transport may put a connection back after the caller's
		// connection ended.
		poll.Until(t, pollTimeout, pollInterval, "the instance's connections closed", func(context.Context) error {
			p.nethttp.transport.CloseIdleConnections()
			return poll.Unmet(in.open.Load() == 0, "%d open", in.open.Load())
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

// TestWire: the router's HTTP/1.1 path over raw sockets. Each row writes
// a caller's bytes and checks the answers, the requests the instance got
// (and, under h1, wireAgree), and how many connections the instance
// accepted.
func TestWire(t *testing.T) {
	t.Parallel()
	for _, tt := range wireRows() {
		t.Run(tt.name, func(t *testing.T) {
			if testForwarder == ForwarderNethttp && tt.skipNethttp != "" {
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
			if testForwarder == ForwarderNethttp && tt.wantNethttp != nil {
				want, fwd = tt.wantNethttp, tt.fwdNethttp
			}
			got1 := strs(resps)
			if testForwarder == ForwarderNethttp {
				// net/http's server sends its own 100 Continue as the
				// ReverseProxy reads the body, and may relay the instance's
				// too (Expect goes upstream).
				got1 = slices.CompactFunc(got1, func(a, b string) bool { return a == "100" && b == "100" })
			}
			if diff := cmp.Diff(want, got1); diff != "" {
				t.Errorf("responses (-want +got):\n%s", diff)
			}
			checkForwarded(t, fwd, got)
			if n := in.accepted.Load(); tt.accepted != 0 && n != tt.accepted {
				t.Errorf("the instance accepted %d connections, want %d", n, tt.accepted)
			}
			if testForwarder == ForwarderH1 && tt.next == "" {
				if err := wireAgree([]byte(data), resps[:firstConn], got, DefaultOptions().MaxHeaderBytes); err != nil {
					t.Errorf("against http.ReadRequest: %v", err)
				}
			}
			if tt.check != nil && !t.Failed() {
				tt.check(t, resps, got)
			}
		})
	}
}

// checkForwarded compares the requests the instance read whole (got)
// with want (wireReq.String) and returns them.
func checkForwarded(t *testing.T, want []string, got []wireReq) []wireReq {
	t.Helper()
	var complete []wireReq
	for _, g := range got {
		if g.err == nil {
			complete = append(complete, g)
		}
	}
	if diff := cmp.Diff(want, strs(complete), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("requests at the instance (-want +got):\n%s", diff)
	}
	return complete
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
	t.Parallel()
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
	if testForwarder == ForwarderNethttp {
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
//
// It runs the h1 forwarder whatever SKIPPER_TEST_FORWARDER says: the
// agreement with http.ReadRequest is h1's (the event loop hands every
// request it does not serve whole to it; nethttp reads with net/http
// itself). FuzzRouterSplit holds all three to the same answers.
func FuzzRouterWire(f *testing.F) {
	skipRerun(f)
	for _, r := range wireRows() {
		if data := strings.Join(r.writes, ""); len(data) < 4<<10 {
			f.Add([]byte(data))
		}
	}
	f.Add([]byte("GET http://wire.default.fn?q HTTP/1.1\r\nHost: x\r\n\r\nHEAD * HTTP/1.1\r\n" + wireHost + "\r\n"))
	f.Add([]byte("POST /a HTTP/1.1\r\nX-Skipper-Function: default/wire\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nxGET /b HTTP/1.0\r\nHost: b\r\n\r\n"))
	maxHead := DefaultOptions().MaxHeaderBytes
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) >= h1.H2PrefaceLen && h1.IsH2Preface(data) {
			return // handed to the h2c server
		}
		in := startWireInstance(t, nil)
		p, addr := wireRouterWith(t, in, ForwarderH1, false)
		resps, err := wireCall(t, addr, []string{string(data)}, wireMethods(string(data)), true, 5*time.Second)
		if err != nil {
			t.Fatalf("after %v: %v", resps, err)
		}
		got := settleWith(t, p, in, ForwarderH1)
		if err := wireAgree(data, resps, got, maxHead); err != nil {
			t.Fatalf("%v\ncaller's bytes: %q\nresponses: %v\nforwarded: %q", err, data, resps, got)
		}
	})
}
