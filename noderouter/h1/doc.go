// Package h1 is the wire level of the router's HTTP/1.1 forwarding path:
// it reads request and response heads, decides how their bodies are
// framed and whether a connection may carry another message, streams
// bodies chunk by chunk, and writes heads with fields removed and added.
// It does no dialling, pooling or routing and starts no goroutine: the
// goroutine that serves a caller's connection drives it (issue 14: the
// net/http + httputil.ReverseProxy path cost about four times nginx's CPU
// per request on a 2-core node).
//
// # Invariants
//
// Zero allocations once warm. A Request, Response or Body keeps one byte
// buffer and one field slice, reset and reused for every message on a
// connection; fields are (name, value) offset pairs into the buffer.
// Read, the lookups (Get, Index, Count, HasToken, AppendValues into a
// caller's buffer), Drop, DropHopByHop, WriteRequest, WriteResponse,
// Body.Read, WriteChunk and Copy (a sync.Pool buffer) allocate nothing
// once the buffers have grown to the largest message seen; only errors
// allocate. Byte slices returned alias the buffer and are valid until the
// next Read. BenchmarkParseRequest and BenchmarkWriteHead report 0
// allocs/op, TestZeroAlloc checks a whole request.
//
// Agreement with net/http. What is accepted, where each message (head and
// body) ends, its decoded body, and keep-alive are those of Go's HTTP/1
// server for requests (http.ReadRequest plus the server's checks: HTTP/1.x
// only, exactly one valid Host from HTTP/1.1 on, field names tokens and
// values without CTLs) and of http.ReadResponse for responses, except
// where stricter below. FuzzRequestFraming and FuzzResponseFraming feed
// the same bytes (pipelined messages included) to both and fail on any
// other difference; the table tests run the same comparison. In detail:
//   - Line endings: CRLF or a bare LF end head lines (net/http accepts
//     both); a CR anywhere else in a head is an error. Chunk-size lines
//     must end in CRLF (net/http too, RFC 9112 errata 7633).
//   - Request body: exactly one Transfer-Encoding field whose value is
//     "chunked" (else ErrUnsupportedTE, 501), else Content-Length (every
//     such field the same decimal below 2^63, else ErrMalformed), else none.
//   - Response body: none for a response to HEAD and for 1xx, 204 and 304
//     (their Content-Length still validated); else chunked (overriding
//     Content-Length, which Read marks dropped), else Content-Length, else
//     until the connection closes. A 101 ends at its head; the connection
//     then carries the upgraded protocol.
//   - With chunked, a Trailer field naming Transfer-Encoding, Trailer or
//     Content-Length is an error. Chunk sizes are 1-16 hex digits, trailing
//     OWS and extensions (from ';', content unchecked as in net/http) are
//     ignored, the line is under 4096 bytes, the non-data overhead is
//     bounded as in net/http; trailers must end within the reader's buffer.
//   - Keep-alive: HTTP/1.1 unless "Connection: close"; HTTP/1.0 only with
//     "Connection: keep-alive"; never after a close-delimited body.
//
// Stricter than net/http (each a documented error the fuzz targets allow
// only when net/http's own parse shows the cause):
//   - obs-fold (a field line starting with SP or HTAB) is ErrObsFold;
//     net/http joins it to the previous line. RFC 9112 §5.2 allows either.
//   - A space in a field name (response heads, trailers) is an error;
//     textproto accepts it (go.dev/issue/34540) and "Content-Length : 5"
//     then is not a length at all.
//   - Both Transfer-Encoding and Content-Length in a request, and
//     Transfer-Encoding in any HTTP/1.0 message, are ErrAmbiguousLength
//     (request smuggling, RFC 9112 §6.1, §6.3); net/http lets chunked win,
//     or ignores Transfer-Encoding in HTTP/1.0. A response with both is
//     accepted as in net/http.
//   - Request targets: origin-form, "*", and absolute-form http(s) with a
//     plain host[:port]; other forms (authority-form, userinfo, IP
//     literals, opaque URIs) are ErrUnsupportedTarget. CONNECT is
//     ErrUnsupportedMethod. "PRI * HTTP/2.0" is ErrUnsupportedVersion: the
//     forwarder checks IsH2Preface first.
//   - Status codes must be three digits from 100 ("+99", "000" are
//     errors), reason phrases free of CTLs, response versions HTTP/1.x.
//   - Trailer lines must end in CRLF.
//   - A Connection field naming Content-Length, Transfer-Encoding, Host or
//     a field of ReservedPrefix (X-Skipper-*) is ErrBadConnection (400 for
//     a request, 502 for a response): DropHopByHop would drop what frames
//     or routes the message, and its body would reach the next hop as
//     messages of their own (issue 30). net/http forwards such a message
//     with its framing. Naming "upgrade" is allowed (see BadConnection).
//   - The head has a size limit of its own (max, e.g. DefaultMaxHead):
//     ErrHeadTooLarge counts the head's bytes exactly; net/http counts
//     MaxHeaderBytes+4096 of everything read.
//
// Trailers: a trailer section's fields named with ReservedPrefix are
// marked dropped as it is read (Body.Trailer), so that neither a caller
// nor an instance can pass the router's own fields on in them.
//
// Not done here: the net/http server skips CRLFs after a POST's body
// before the next request (RFC 9112 §2.2 robustness); answering Expect
// values other than 100-continue (417); caps on 1xx responses.
//
// # How the forwarder drives it
//
// Per caller connection: a bufio.Reader and bufio.Writer on the caller, a
// pooled upstream connection with its own pair, one Request, Response
// and Body each.
//
//  1. Peek: IsH2Preface → hand the connection to the h2c server.
//  2. req.Read(callerR, max). io.EOF: close quietly; other errors: answer
//     Status(err) (431, 400, 501, 505) and close.
//  3. Route by req.Host() / req.Get("X-Skipper-Function"); then
//     req.DropHopByHop(), req.Drop("X-Skipper-Function"), AppendValues
//     for X-Forwarded-For and Forwarded into a per-connection scratch
//     buffer, Drop those, and WriteRequest(upR, req, add) with add holding
//     the new X-Forwarded-*/Forwarded fields, the framing written from
//     req.Framing() ("Transfer-Encoding: chunked", or "Content-Length: n"
//     in place of the caller's, never copied), Host when Absolute() or missing
//     (HTTP/1.0), and "Connection: Upgrade"/"Upgrade" when req.Upgrade().
//  4. Body: body.Reset(callerR, req.Framing()); Copy(upW,
//     &body, chunked, true) (chunk by chunk, each flushed). With
//     ExpectContinue the forwarder drops Expect, answers the caller's
//     100 Continue itself and then copies the body. A body that breaks
//     its coding (ErrMalformed) is a 400 to the caller, and the instance's
//     connection, holding part of a request, is closed.
//  5. resp.Read(upR, max, req.IsHEAD()); relay Informational() responses
//     (WriteResponse, flush; never to an HTTP/1.0 caller) and read again. SwitchingProtocols(): write
//     the head and splice both ways until either side closes.
//  6. resp.DropHopByHop(), WriteResponse(callerW, resp, add) with framing
//     for the caller written from resp.Framing() (a length body's
//     Content-Length replaced; chunked stays chunked to an HTTP/1.1 caller; an
//     HTTP/1.0 caller gets the decoded body and a close), then Copy with
//     flush (server-sent events arrive as written).
//  7. The upstream connection returns to its pool only if
//     resp.KeepAlive(), the request body was read to its end, the
//     response body was read to the end its framing gives and nothing
//     is left unread in the connection's reader (bytes that arrive later
//     are found only when the connection is next used: by the liveness
//     peek of one that idled, or read as the next answer); the
//     caller's connection serves the next request only if req.KeepAlive()
//     and the response went out framed. A *WriteError from Copy names the
//     side that failed.
package h1
