// Package golden compares a test's output with a file under the test
// package's testdata/ directory. `go test -update` rewrites the files
// instead (the flag is registered here, once per test binary).
package golden
