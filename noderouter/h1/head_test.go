package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func readRequest(t testing.TB, s string) *Request {
	t.Helper()
	var r Request
	if err := r.Read(bufio.NewReader(strings.NewReader(s)), DefaultMaxHead); err != nil {
		t.Fatalf("Read: %v", err)
	}
	return &r
}

func TestHeadTooLarge(t *testing.T) {
	tests := []struct {
		name string
		max  int
		in   string
		err  error
	}{
		{name: "fits exactly", max: len(get), in: get},
		{name: "one byte over", max: len(get) - 1, in: get, err: ErrHeadTooLarge},
		{name: "long line beyond the reader's buffer", max: 64 << 10, in: "GET /" + strings.Repeat("a", 20000) + " HTTP/1.1\r\nHost: a\r\n\r\n"},
		{name: "many fields", max: 1 << 10, in: "GET / HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("X: y\r\n", 300) + "\r\n", err: ErrHeadTooLarge},
		{name: "response too large", max: 16, in: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", err: ErrHeadTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tt.in), 4096)
			var err error
			if strings.HasPrefix(tt.in, "HTTP/") {
				var r Response
				err = r.Read(br, tt.max, false)
			} else {
				var r Request
				err = r.Read(br, tt.max)
			}
			checkErr(t, tt.err, err)
			if tt.err != nil && Status(err) != http.StatusRequestHeaderFieldsTooLarge {
				t.Errorf("Status = %d, want 431", Status(err))
			}
		})
	}
}

func TestStatus(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"", 0}, // EOF before the first byte: close quietly
		{"GET / HTTP/1.1\r\nHost: a\r\n", 0},
		{"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
		{"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505},
	}
	for _, tt := range tests {
		var r Request
		err := r.Read(bufio.NewReader(strings.NewReader(tt.in)), DefaultMaxHead)
		if got := Status(err); got != tt.want {
			t.Errorf("%q: Status(%v) = %d, want %d", tt.in, err, got, tt.want)
		}
	}
	var r Request
	if err := r.Read(bufio.NewReader(strings.NewReader("")), DefaultMaxHead); err != io.EOF {
		t.Errorf("empty stream: %v, want io.EOF itself", err)
	}
}

func TestAccessors(t *testing.T) {
	r := readRequest(t, "POST /p?q HTTP/1.1\r\nHost: fn.ns.fn\r\nX-Forwarded-For: 1.1.1.1\r\nExpect: 100-Continue\r\n"+
		"Connection: Upgrade, X-Hop\r\nUpgrade: websocket\r\nx-forwarded-for: 2.2.2.2, 3.3.3.3\r\nContent-Length: 3\r\nX-Hop: 1\r\n\r\n")
	type view struct {
		Method, Target, Host, Upgrade, XFF string
		Minor                              byte
		Framing                            Framing
		Expect, KeepAlive, HEAD            bool
		Fields, XFFCount                   int
	}
	got := view{
		Method: string(r.Method()), Target: string(r.Target()), Host: string(r.Host()), Upgrade: string(r.Upgrade()),
		XFF: string(r.AppendValues(nil, "X-Forwarded-For", ", ")), Minor: r.Minor(), Framing: r.Framing(),
		Expect: r.ExpectContinue(), KeepAlive: r.KeepAlive(), HEAD: r.IsHEAD(), Fields: r.Len(), XFFCount: r.Count("x-forwarded-for"),
	}
	want := view{
		Method: "POST", Target: "/p?q", Host: "fn.ns.fn", Upgrade: "websocket", XFF: "1.1.1.1, 2.2.2.2, 3.3.3.3",
		Minor: 1, Framing: Framing{Kind: BodyLength, Length: 3}, Expect: true, KeepAlive: true, Fields: 8, XFFCount: 2,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if v, ok := r.Get("CONTENT-LENGTH"); !ok || string(v) != "3" {
		t.Errorf("Get(CONTENT-LENGTH) = %q, %v", v, ok)
	}
	if _, ok := r.Get("Missing"); ok {
		t.Error("Get(Missing) found a field")
	}
}

func TestWriteRequest(t *testing.T) {
	tests := []struct {
		name string
		in   string
		drop []string
		add  []Field
		want string
	}{
		{
			name: "hop-by-hop and the function header dropped, forwarding fields added",
			in: "GET /p HTTP/1.1\nHost: fn\nConnection: keep-alive, X-Hop\nX-Hop: 1\nKeep-Alive: 5\nTE: trailers\n" +
				"X-Skipper-Function: ns/fn\nX-Forwarded-For: 1.1.1.1\nAccept:  */* \n\n",
			drop: []string{"X-Skipper-Function", "X-Forwarded-For"},
			add:  []Field{{"X-Forwarded-For", []byte("1.1.1.1, 10.0.0.1")}, {"Forwarded", []byte(`for=10.0.0.1;host="fn";proto=http`)}},
			want: "GET /p HTTP/1.1\r\nHost: fn\r\nAccept: */*\r\nX-Forwarded-For: 1.1.1.1, 10.0.0.1\r\n" +
				"Forwarded: for=10.0.0.1;host=\"fn\";proto=http\r\n\r\n",
		},
		{
			name: "chunked request: Transfer-Encoding re-added by the caller",
			in:   "POST /u HTTP/1.0\r\nHost: fn\r\nContent-Length: 1\r\n\r\nx",
			add:  []Field{{"Connection", []byte("close")}},
			want: "POST /u HTTP/1.1\r\nHost: fn\r\nContent-Length: 1\r\nConnection: close\r\n\r\n",
		},
		{
			name: "absolute-form becomes origin-form",
			in:   "GET http://fn.ns.fn?x=1 HTTP/1.1\r\nHost: other\r\n\r\n",
			drop: []string{"Host"},
			add:  []Field{{"Host", []byte("fn.ns.fn")}},
			want: "GET /?x=1 HTTP/1.1\r\nHost: fn.ns.fn\r\n\r\n",
		},
		{
			name: "asterisk-form",
			in:   "OPTIONS * HTTP/1.1\r\nHost: fn\r\n\r\n",
			want: "OPTIONS * HTTP/1.1\r\nHost: fn\r\n\r\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := readRequest(t, tt.in)
			r.DropHopByHop()
			for _, d := range tt.drop {
				r.Drop(d)
			}
			var out bytes.Buffer
			w := bufio.NewWriter(&out)
			if err := WriteRequest(w, r, tt.add); err != nil {
				t.Fatal(err)
			}
			w.Flush()
			if diff := cmp.Diff(tt.want, out.String()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			// What is written is a request net/http reads back.
			if _, err := http.ReadRequest(bufio.NewReader(&out)); err != nil {
				t.Errorf("net/http cannot read it back: %v", err)
			}
		})
	}
}

func TestWriteResponse(t *testing.T) {
	in := "HTTP/1.0 200 Fine\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\nX-A: b\r\n\r\n"
	in = strings.Replace(in, "HTTP/1.0", "HTTP/1.1", 1)
	var r Response
	if err := r.Read(bufio.NewReader(strings.NewReader(in)), DefaultMaxHead, false); err != nil {
		t.Fatal(err)
	}
	r.DropHopByHop()
	var out bytes.Buffer
	w := bufio.NewWriter(&out)
	if err := WriteResponse(w, &r, []Field{{"Transfer-Encoding", []byte("chunked")}}); err != nil {
		t.Fatal(err)
	}
	w.Flush()
	want := "HTTP/1.1 200 Fine\r\nX-A: b\r\nTransfer-Encoding: chunked\r\n\r\n"
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestCopy(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		chunked bool
		want    string
		err     error
	}{
		{name: "chunked re-framed with trailers", chunked: true,
			in:   "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n2\r\nde\r\n0\r\nX-Sum: 5\nbad\r\n\r\n",
			want: "", err: errTrailerLF},
		{name: "chunked re-framed", chunked: true,
			in:   "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n2\r\nde\r\n0\r\nX-Sum: 5\r\n\r\n",
			want: "3\r\nabc\r\n2\r\nde\r\n0\r\nX-Sum: 5\r\n\r\n"}, // chunk by chunk
		{name: "length body as is", in: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcNEXT", want: "abc"},
		{name: "length body chunked", chunked: true, in: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", want: "3\r\nabc\r\n0\r\n\r\n"},
		{name: "until close", in: "HTTP/1.1 200 OK\r\n\r\nevent: a\n\nevent: b\n\n", want: "event: a\n\nevent: b\n\n"},
		{name: "truncated", in: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc", want: "abc", err: io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReader(strings.NewReader(tt.in))
			var r Response
			if err := r.Read(br, DefaultMaxHead, false); err != nil {
				t.Fatal(err)
			}
			var b Body
			b.Reset(br, r.Framing())
			var out bytes.Buffer
			w := bufio.NewWriter(&out)
			_, err := Copy(w, &b, tt.chunked, true)
			checkErr(t, tt.err, err)
			if tt.err != nil {
				return
			}
			if diff := cmp.Diff(tt.want, out.String()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestCopyWriteError(t *testing.T) {
	br := bufio.NewReader(strings.NewReader("abc"))
	var b Body
	b.Reset(br, Framing{Kind: BodyLength, Length: 3})
	w := bufio.NewWriter(failWriter{})
	_, err := Copy(w, &b, false, true)
	var we *WriteError
	if !errors.As(err, &we) {
		t.Errorf("Copy = %v, want a *WriteError", err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("peer gone") }

// TestCopyFlushesEachRead: a stream reaches the writer as each read
// arrives, not when the body ends.
func TestCopyFlushesEachRead(t *testing.T) {
	pr, pw := io.Pipe()
	br := bufio.NewReader(pr)
	var b Body
	b.Reset(br, Framing{Kind: BodyUntilClose})
	seen := make(chan string, 4)
	w := bufio.NewWriter(writerFunc(func(p []byte) (int, error) { seen <- string(p); return len(p), nil }))
	done := make(chan error, 1)
	go func() { _, err := Copy(w, &b, true, true); done <- err }()
	for _, ev := range []string{"data: 1\n\n", "data: 2\n\n"} {
		pw.Write([]byte(ev))
		if got, want := <-seen, "9\r\n"+ev+"\r\n"; got != want {
			t.Errorf("flushed %q, want %q", got, want)
		}
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got != "0\r\n\r\n" {
		t.Errorf("end %q", got)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestIsH2Preface(t *testing.T) {
	for in, want := range map[string]bool{
		"":                        true,
		"PRI * HT":                true,
		h2Preface:                 true,
		h2Preface + "\x00\x00":    true,
		"GET / HTTP/1.1\r\n":      false,
		"PRI * HTTP/2.0\r\n\r\nX": false,
	} {
		if got := IsH2Preface([]byte(in)); got != want {
			t.Errorf("IsH2Preface(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestAgreeDetects keeps the differential harness honest: it flags what
// it should.
func TestAgreeDetects(t *testing.T) {
	data := []byte(get)
	ok := []msg{{End: len(get), KeepAlive: true, Host: "a"}}
	tests := []struct {
		name   string
		ours   []msg
		ourErr error
		std    []msg
		stdErr error
		flag   bool
	}{
		{name: "same", ours: ok, std: ok},
		{name: "different end", ours: []msg{{End: 3, KeepAlive: true, Host: "a"}}, std: ok, flag: true},
		{name: "ours accepts more", ours: ok, stdErr: errors.New("x"), flag: true},
		{name: "ours rejects, no stricter cause", ourErr: ErrMalformed, std: ok, flag: true},
		{name: "ours rejects obs-fold that is not there", ourErr: ErrObsFold, std: ok, flag: true},
	}
	for _, tt := range tests {
		reqs := []*http.Request{{Method: "GET", RequestURI: "/", ProtoMajor: 1, ProtoMinor: 1}}
		err := agree(data, tt.ours, tt.ourErr, tt.std, tt.stdErr, reqs, nil)
		if (err != nil) != tt.flag {
			t.Errorf("%s: agree = %v, want flagged %v", tt.name, err, tt.flag)
		}
	}
}

// TestZeroAlloc: once warm, reading a head, its body, and writing both
// allocate nothing.
func TestZeroAlloc(t *testing.T) {
	in := []byte("POST /f?x=1 HTTP/1.1\r\nHost: fn.ns.fn\r\nX-Skipper-Function: ns/fn\r\nTransfer-Encoding: chunked\r\n" +
		"Connection: keep-alive\r\nX-Forwarded-For: 1.1.1.1\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n")
	rd := bytes.NewReader(in)
	br := bufio.NewReader(rd)
	w := bufio.NewWriter(io.Discard)
	var r Request
	var b Body
	scratch := make([]byte, 0, 256)
	add := make([]Field, 0, 2)
	chunked := []byte("chunked")
	allocs := testing.AllocsPerRun(100, func() {
		rd.Reset(in)
		br.Reset(rd)
		if err := r.Read(br, DefaultMaxHead); err != nil {
			t.Fatal(err)
		}
		r.DropHopByHop()
		r.Drop("X-Skipper-Function")
		scratch = append(r.AppendValues(scratch[:0], "X-Forwarded-For", ", "), ", 10.0.0.1"...)
		r.Drop("X-Forwarded-For")
		add = append(add[:0], Field{"X-Forwarded-For", scratch}, Field{"Transfer-Encoding", chunked})
		if err := WriteRequest(w, &r, add); err != nil {
			t.Fatal(err)
		}
		b.Reset(br, r.Framing())
		if _, err := Copy(w, &b, true, false); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per request, want 0", allocs)
	}
}

func TestWriteChunk(t *testing.T) {
	for _, n := range []int{0, 1, 15, 16, 255, 4096, 32 << 10} {
		var out bytes.Buffer
		w := bufio.NewWriter(&out)
		if err := WriteChunk(w, bytes.Repeat([]byte("x"), n)); err != nil {
			t.Fatal(err)
		}
		w.Flush()
		want := ""
		if n > 0 {
			want = strconv.FormatInt(int64(n), 16) + "\r\n" + strings.Repeat("x", n) + "\r\n"
		}
		if out.String() != want {
			t.Errorf("WriteChunk(%d bytes) = %.20q…, want %.20q…", n, out.String(), want)
		}
	}
}

// TestHeadBuffered: true only when the reader holds a whole head.
func TestHeadBuffered(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"", false},
		{"GET / HTTP/1.1\r\nHost: a\r\n", false},
		{"GET / HTTP/1.1\r\nHost: a\r\n\r", false},
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", true},
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\n", true},
		{"GET / HTTP/1.1\nHost: a\n\n", false}, // bare LF: Read reads and refuses it
	} {
		br := bufio.NewReader(strings.NewReader(tc.in))
		_, _ = br.Peek(1) // fill the buffer
		if got := HeadBuffered(br); got != tc.want {
			t.Errorf("HeadBuffered(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
