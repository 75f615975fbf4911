module skipper.dev/skipper/tests/httpbin

go 1.26.6

require github.com/mccutchen/go-httpbin/v2 v2.26.0 // indirect

tool github.com/mccutchen/go-httpbin/v2/cmd/go-httpbin
