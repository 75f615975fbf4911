package h1

import (
	"bufio"
	"bytes"
	"io"
	"testing"
)

// benchRequest is a typical call through the router: a POST with a small
// JSON body and the fields a client and an ingress add.
var benchRequest = []byte("POST /api/v1/items?limit=10 HTTP/1.1\r\nHost: fn.default.fn\r\nUser-Agent: Go-http-client/1.1\r\n" +
	"Content-Length: 17\r\nAccept: application/json\r\nAccept-Encoding: gzip\r\nContent-Type: application/json\r\n" +
	"X-Skipper-Function: default/fn\r\nX-Forwarded-For: 203.0.113.7\r\nX-Request-Id: 5f0c1a7e-2b1d-4c55-9d3e-0a1b2c3d4e5f\r\n" +
	"Connection: keep-alive\r\n\r\n{\"name\":\"skipper\"}")

func BenchmarkParseRequest(b *testing.B) {
	rd := bytes.NewReader(benchRequest)
	br := bufio.NewReader(rd)
	var r Request
	b.ReportAllocs()
	b.SetBytes(int64(len(benchRequest)))
	for b.Loop() {
		rd.Reset(benchRequest)
		br.Reset(rd)
		if err := r.Read(br, DefaultMaxHead); err != nil {
			b.Fatal(err)
		}
		if _, ok := r.Get("X-Skipper-Function"); !ok {
			b.Fatal("no function")
		}
	}
}

func BenchmarkWriteHead(b *testing.B) {
	var r Request
	if err := r.Read(bufio.NewReader(bytes.NewReader(benchRequest)), DefaultMaxHead); err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(io.Discard)
	scratch := make([]byte, 0, 128)
	add := make([]Field, 0, 2)
	forwarded := []byte(`for=10.0.0.1;host="fn.default.fn";proto=http`)
	b.ReportAllocs()
	for b.Loop() {
		r.DropHopByHop()
		r.Drop("X-Skipper-Function")
		scratch = append(r.AppendValues(scratch[:0], "X-Forwarded-For", ", "), ", 10.0.0.1"...)
		r.Drop("X-Forwarded-For")
		add = append(add[:0], Field{"X-Forwarded-For", scratch}, Field{"Forwarded", forwarded})
		if err := WriteRequest(w, &r, add); err != nil {
			b.Fatal(err)
		}
		w.Flush()
	}
}

func BenchmarkChunkedCopy(b *testing.B) {
	var in bytes.Buffer
	for range 16 {
		in.WriteString("400\r\n")
		in.Write(bytes.Repeat([]byte("x"), 0x400))
		in.WriteString("\r\n")
	}
	in.WriteString("0\r\n\r\n")
	body := in.Bytes()
	rd := bytes.NewReader(body)
	br := bufio.NewReader(rd)
	w := bufio.NewWriter(io.Discard)
	var bd Body
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		rd.Reset(body)
		br.Reset(rd)
		bd.Reset(br, Framing{Kind: BodyChunked})
		if _, err := Copy(w, &bd, true, false); err != nil {
			b.Fatal(err)
		}
	}
}
