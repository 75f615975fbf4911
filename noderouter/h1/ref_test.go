package h1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// msg is what one message of a stream came to: where in the stream it
// ended (head and body), its decoded body, whether the connection stays
// open after it, and the request's host or the response's status.
type msg struct {
	End       int
	Body      string
	KeepAlive bool
	Host      string
	Status    int
}

// maxMessages bounds how many pipelined messages one input is read as.
const maxMessages = 4

// bufSize is the reader buffer both sides read with: net/http's bounds on
// chunk lines and trailers depend on it.
const bufSize = 4096

func newReader(data []byte) (*bufio.Reader, func() int) {
	rd := bytes.NewReader(data)
	br := bufio.NewReaderSize(rd, bufSize)
	return br, func() int { return len(data) - rd.Len() - br.Buffered() }
}

// ourRequests reads data as a stream of requests with this package, until
// an error, a request that closes the connection, or the end of data.
func ourRequests(data []byte) ([]msg, error) {
	br, pos := newReader(data)
	var r Request
	var b Body
	var out []msg
	for len(out) < maxMessages && pos() < len(data) {
		if err := r.Read(br, 1<<20); err != nil {
			return out, err
		}
		b.Reset(br, r.Framing())
		body, err := io.ReadAll(&b)
		if err != nil {
			return out, err
		}
		out = append(out, msg{End: pos(), Body: string(body), KeepAlive: r.KeepAlive(), Host: string(r.Host())})
		if !r.KeepAlive() {
			break
		}
	}
	return out, nil
}

// stdRequests is ourRequests with Go's HTTP/1 server as the parser:
// http.ReadRequest, the server's own checks (conn.readRequest: version,
// Host, field names and values) and reading the body to its end. req is
// the last request read, nil if none.
func stdRequests(data []byte) (out []msg, reqs []*http.Request, err error) {
	br, pos := newReader(data)
	for len(out) < maxMessages && pos() < len(data) {
		start := pos()
		req, err := http.ReadRequest(br)
		if err != nil {
			return out, reqs, err
		}
		if err := serverChecks(req, data[start:]); err != nil {
			return out, reqs, err
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return out, reqs, err
		}
		out = append(out, msg{End: pos(), Body: string(body), KeepAlive: !req.Close, Host: req.Host})
		reqs = append(reqs, req)
		if req.Close {
			break
		}
	}
	return out, reqs, nil
}

// serverChecks are the checks net/http's conn.readRequest makes after
// readRequest. ReadRequest removes the Host field, so the head is read
// again with textproto, as readRequest reads it.
func serverChecks(req *http.Request, data []byte) error {
	if req.ProtoMajor != 1 {
		return errors.New("std: unsupported protocol version")
	}
	tp := textproto.NewReader(bufio.NewReaderSize(bytes.NewReader(data), bufSize))
	if _, err := tp.ReadLine(); err != nil {
		return err
	}
	mh, err := tp.ReadMIMEHeader()
	if err != nil {
		return err
	}
	hosts := mh["Host"]
	if req.ProtoAtLeast(1, 1) && len(hosts) == 0 && req.Method != "CONNECT" {
		return errors.New("std: missing required Host header")
	}
	if len(hosts) == 1 && !httpguts.ValidHostHeader(hosts[0]) {
		return errors.New("std: malformed Host header")
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return errors.New("std: invalid header name")
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return errors.New("std: invalid header value")
			}
		}
	}
	return nil
}

// ourResponses reads data as a stream of responses to method.
func ourResponses(data []byte, method string) ([]msg, error) {
	br, pos := newReader(data)
	var r Response
	var b Body
	var out []msg
	for len(out) < maxMessages && pos() < len(data) {
		if err := r.Read(br, 1<<20, method == "HEAD"); err != nil {
			return out, err
		}
		b.Reset(br, r.Framing())
		body, err := io.ReadAll(&b)
		if err != nil {
			return out, err
		}
		out = append(out, msg{End: pos(), Body: string(body), KeepAlive: r.KeepAlive(), Status: r.Status()})
		if !r.KeepAlive() || r.SwitchingProtocols() {
			break
		}
	}
	return out, nil
}

// stdResponses is ourResponses with http.ReadResponse.
func stdResponses(data []byte, method string) (out []msg, ress []*http.Response, err error) {
	br, pos := newReader(data)
	for len(out) < maxMessages && pos() < len(data) {
		res, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			return out, ress, err
		}
		body, err := io.ReadAll(res.Body)
		if err != nil {
			return out, ress, err
		}
		out = append(out, msg{End: pos(), Body: string(body), KeepAlive: !res.Close, Status: res.StatusCode})
		ress = append(ress, res)
		if res.Close || res.StatusCode == 101 {
			break
		}
	}
	return out, ress, nil
}

// stricter reports whether err is one of the documented cases in which
// this package rejects what net/http accepts, and the input shows the
// cause (checked independently of the parser where the input allows).
// data is the stream up to the end of the message net/http accepted.
func stricter(err error, data []byte, req *http.Request, res *http.Response) bool {
	head := strings.ToLower(string(data))
	switch {
	case errors.Is(err, ErrObsFold):
		return strings.Contains(head, "\n ") || strings.Contains(head, "\n\t")
	case errors.Is(err, errTrailerLF):
		return bytes.Contains(bytes.ReplaceAll(data, []byte("\r\n"), nil), []byte("\n"))
	case errors.Is(err, ErrAmbiguousLength):
		return strings.Contains(head, "transfer-encoding")
	case errors.Is(err, errNameSpace):
		return hasSpaceKey(req, res)
	case errors.Is(err, ErrBadConnection):
		return badConnection(req, res)
	case req != nil && errors.Is(err, ErrUnsupportedTarget):
		return req.RequestURI != "*" && !strings.HasPrefix(req.RequestURI, "/")
	case req != nil && errors.Is(err, ErrUnsupportedMethod):
		return req.Method == "CONNECT"
	case req != nil && errors.Is(err, ErrUnsupportedVersion):
		return req.Method == "PRI" && req.ProtoMajor == 2
	case res != nil && errors.Is(err, ErrUnsupportedVersion):
		return res.ProtoMajor != 1
	case res != nil && errors.Is(err, errStatus):
		code, _, _ := strings.Cut(strings.TrimLeft(res.Status, " "), " ")
		return res.StatusCode < 100 || strings.ContainsAny(code, "+-")
	case res != nil && errors.Is(err, errReason):
		return strings.ContainsFunc(res.Status, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f })
	}
	return false
}

// badConnection reports a Connection field, as net/http read it, naming
// Content-Length, Transfer-Encoding, Host or an X-Skipper-* field
// (ErrBadConnection's rule, restated).
func badConnection(req *http.Request, res *http.Response) bool {
	var h http.Header
	switch {
	case req != nil:
		h = req.Header
	case res != nil:
		h = res.Header
	default:
		return false
	}
	for _, v := range h["Connection"] {
		for _, e := range strings.Split(v, ",") {
			e = strings.ToLower(strings.Trim(e, " \t"))
			switch {
			case e == "content-length", e == "transfer-encoding", e == "host", strings.HasPrefix(e, "x-skipper-"):
				return true
			}
		}
	}
	return false
}

func hasSpaceKey(req *http.Request, res *http.Response) bool {
	var hs []http.Header
	if req != nil {
		hs = append(hs, req.Header, req.Trailer)
	}
	if res != nil {
		hs = append(hs, res.Header, res.Trailer)
	}
	for _, h := range hs {
		for k := range h {
			if strings.Contains(k, " ") {
				return true
			}
		}
	}
	return false
}

// agree compares the two parses of one stream: the messages both read
// must match, and where one side failed the other must fail at the same
// message, unless this package failed for a documented stricter reason
// whose cause net/http's parse of that message shows. reqs and ress are
// net/http's messages (either may be nil).
func agree(data []byte, ours []msg, ourErr error, std []msg, stdErr error, reqs []*http.Request, ress []*http.Response) error {
	n := min(len(ours), len(std))
	for i := range n {
		if ours[i] != std[i] {
			return fmt.Errorf("message %d: ours %+v, net/http %+v", i, ours[i], std[i])
		}
	}
	switch {
	case len(ours) > len(std):
		return fmt.Errorf("message %d: ours accepts %+v, net/http rejects: %v", n, ours[n], stdErr)
	case len(ours) < len(std):
		var req *http.Request
		var res *http.Response
		if reqs != nil {
			req = reqs[n]
		}
		if ress != nil {
			res = ress[n]
		}
		if ourErr != nil && stricter(ourErr, data[:std[n].End], req, res) {
			return nil
		}
		return fmt.Errorf("message %d: ours rejects (%v), net/http accepts %+v", n, ourErr, std[n])
	case (ourErr == nil) != (stdErr == nil):
		return fmt.Errorf("message %d: ours %v, net/http %v", n, ourErr, stdErr)
	}
	return nil
}
