// Command fastproxy is a minimal reverse proxy on github.com/valyala/fasthttp:
// one fasthttp.Server whose handler sends every request, unchanged but for
// the X-Skipper-Function header it strips, to one upstream through a
// fasthttp.HostClient, and copies the answer back. No routing, no retries of
// its own, no Forwarded headers: it is the lower bound a Go proxy on
// fasthttp reaches, measured beside the router, nginx and haproxy by
// `skipper-bench warm` (contender "fasthttp"; issue 14).
//
//	fastproxy -listen 198.51.100.11:18083 -upstream 198.18.1.9:8080 -procs 2
//
// What it sets so that it does no work the other contenders skip:
//   - keep-alive on both sides; upstream connections reused LIFO, at most
//     4096 (nginx's worker_connections and haproxy's maxconn in the bench);
//   - request and response bodies streamed (Server.StreamRequestBody,
//     HostClient.StreamResponseBody): a chunked answer is re-framed and
//     flushed chunk by chunk as the upstream sends it;
//   - header names and paths passed as they came (no normalising), no
//     default Server, Content-Type or User-Agent added. Date is the one
//     exception: HostClient.Do resets the response's NoDefaultDate, so the
//     server writes fasthttp's own Date line (a copy of one refreshed once a
//     second by a background goroutine) in place of the upstream's; fasthttp
//     has no setter to keep the upstream's;
//   - GOMAXPROCS = -procs (the bench passes the router's GOMAXPROCS, as it
//     gives nginx its workers and haproxy its threads).
//
// It is a module of its own, like tests/benchplot, so that fasthttp and its
// dependencies stay out of the product's module graph. main only makes a
// signal context (SIGINT, SIGTERM: a graceful stop) and calls run.
package main
