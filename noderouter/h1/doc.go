// Package h1 is the wire level of the router's HTTP/1.1 forwarding path:
// it reads request and response heads, decides how their bodies are
// framed and whether a connection may carry another message, streams
// bodies chunk by chunk, and writes heads with fields removed and added.
// It does no dialling, pooling or routing and starts no goroutine: the
// goroutine that serves a caller's connection drives it. docs/architecture.md
// ("HTTP/1.1 on the wire") states every framing rule and each departure
// from net/http.
//
// Invariants:
//   - Zero allocations once warm: a Request, Response or Body keeps one
//     byte buffer and one field slice, reused for every message on a
//     connection; fields are offset pairs into the buffer, and returned
//     slices alias it until the next Read. Only errors allocate
//     (TestZeroAlloc, BenchmarkParseRequest, BenchmarkWriteHead).
//   - What is accepted, where each message ends, its decoded body and
//     keep-alive are those of Go's HTTP/1 server (requests) and
//     http.ReadResponse (responses), except where stricter: obs-fold,
//     spaces in field names, Transfer-Encoding with Content-Length in a
//     request or in HTTP/1.0, targets other than origin-form, "*" and
//     plain absolute http(s), CONNECT, malformed status lines, and a
//     Connection field naming the framing, Host or X-Skipper-* (issue 30)
//     are errors. FuzzRequestFraming and FuzzResponseFraming compare both
//     parsers on the same bytes and allow a difference only for these.
//   - Trailer fields named with ReservedPrefix are dropped as read.
//
// How the forwarder drives it, per caller connection (one Request,
// Response and Body each): IsH2Preface hands h2c away; Request.Read, or
// answer Status(err) and close; route by Host or X-Skipper-Function;
// DropHopByHop and WriteRequest with the forwarding fields added and the
// framing written from Framing(), never copied; Body.Reset and Copy;
// Response.Read, relaying Informational() answers and splicing after
// SwitchingProtocols(); WriteResponse and Copy, flushing each read. An
// instance connection is reused only when Response.KeepAlive(), both
// bodies were read to their end and nothing is left unread; the caller's
// only when Request.KeepAlive() and the answer went out framed.
package h1
