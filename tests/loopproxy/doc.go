// Command loopproxy is a measuring tool, not a part of Skipper: the
// smallest HTTP/1.1 keep-alive reverse proxy built the way nginx is, in Go:
// one event loop per thread (its own epoll set, its own SO_REUSEPORT
// listener, its own LIFO pool of instance connections), raw non-blocking
// system calls, readiness tracked as nginx does (a short read means
// drained until the next edge), no goroutine per connection and no Go net
// poller. It forwards GETs without bodies to one upstream and answers
// responses framed by Content-Length; anything else closes the connection.
//
// It answers one question for issue 14: how far below the goroutine
// design's CPU per request can a Go process on this kind of machine get,
// side by side with nginx. See docs/benchmarks.md.
//
//	loopproxy -listen 198.51.100.11:18084 -upstream 198.18.1.4:8080 -procs 2
package main
