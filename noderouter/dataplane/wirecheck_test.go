package dataplane

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"slices"
	"strings"

	"golang.org/x/net/http/httpguts"
)

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
		return checkConnection(s.req.Header) != nil || // h1.ErrBadConnection
			strings.Contains(lower, "\n ") || strings.Contains(lower, "\n\t") || // obs-fold
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
// (plain text; the core's answers are JSON, and so is the refusal of a
// Connection field naming the framing, bad_connection_header).
func isRefusal(r wireResp) bool {
	_, inst := r.fromInstance()
	return !inst && (strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") ||
		strings.Contains(r.body, `"reason":"`+ReasonBadConnection+`"`))
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
