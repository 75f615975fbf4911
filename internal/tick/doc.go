// Package tick is the one ticker loop of Skipper's background work: the
// controller's (informer lag, pre-connections, the assign key, each
// supervisor's pass), the router's (usage sampling, the cache sweep, the
// BPF liveness heartbeat, pre-connections, the local address) and the
// echo runtime's key reload.
//
// Every calls a function at once and then every interval; After waits one
// interval before the first call. Both run on the caller's goroutine and
// return when the context ends: a tick that arrives together with the end
// is dropped, and no call starts after the end was seen. The function is
// given the time it runs at, read after the tick (not the tick's own
// time), so a call that ran late does not see a stale clock. Calls never
// overlap; one that outlasts the interval is followed at once by the next,
// and further ticks missed meanwhile are dropped (time.Ticker's rule).
//
// A loop that stops on its own (a supervisor whose function is gone)
// cancels the context it passed. Loops use the real clock and are tested
// with testing/synctest. The package imports only the standard library,
// so the controller and the router may both use it.
package tick
