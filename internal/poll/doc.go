// Package poll is the tests' one way to wait for a condition on the real
// clock: Until calls a condition until it holds or a timeout passes, and
// fails the test with the condition's last error.
//
// Use it where a test waits for something another goroutine, process or
// server does; where the code under test runs on timers alone and touches
// no real sockets, use testing/synctest instead (fake time, no waiting).
// Any package of the module may import it from its tests; nothing else
// should.
package poll
