package dataplane

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"skipper.dev/skipper/noderouter/h1"
)

// An evloop serves the warm exchange the way nginx does (issue 14,
// docs/architecture.md "What the design costs, measured"): one goroutine
// with its own epoll set takes callers' connections from the
// listeners, reads each request head, picks an instance from the cache,
// writes the request on a kept-alive instance connection of its own and,
// when the whole answer is there, writes it back, all with raw
// non-blocking system calls and no goroutine per connection. Readiness is
// tracked as nginx does: a short read means the socket is drained until
// its next edge. Its peers stay awake between one write and the next, and
// a request costs no goroutine hand-off.
//
// It serves only what is warm and simple: a GET or HEAD without a body
// for a function the cache holds instances of, one of which has a free
// slot, whose answer is framed by a length and fits its buffer. Anything
// else goes to the goroutine path with its connection (loophandoff.go):
// before anything was sent (bodies, upgrades, h2c, cold starts, queueing,
// oneshot functions, a head cut in two reads, a failed send, which the
// goroutine path retries), or in the middle of the answer (1xx, 101,
// chunked or close-delimited bodies, bodies larger than the buffer).
//
// Lock order: none of its own. A loop's state is its goroutine's; other
// goroutines reach it only through post.
type evloop struct {
	s   *h1Server
	p   *Proxy
	log *slog.Logger

	ep, wake  int // the epoll set; an eventfd that wakes it for post
	exclusive bool
	spare     bool // a P is left to the rest of the router (wait)
	quiet     bool // no events for rawWaitMax: waits give up the P

	mu    sync.Mutex
	posts []func() // run by the loop (post)
	ended bool     // run returned; posts run at once

	lns      map[int]bool      // listener fds (duplicates of the server's)
	conns    []*lconn          // by fd
	serial   uint32            // of the last connection added
	callers  int               // caller connections open
	idle     idleShard[*lconn] // its shard of the instance pool
	dropIdle func(*lconn)      // closeIdle, made once (a method value per call would allocate)
	addrs    map[string]sockaddr
	events   []unix.EpollEvent
	draining bool
	stopped  bool
	paused   bool // accepting paused (out of file descriptors)
	sweepAt  time.Time
	now      time.Time // when the events at hand were read
	dirty    []*lconn  // with bytes in out to write at the batch's end

	// Scratch of the request and answer being handled (one at a time).
	fdw     fdWriter
	bw      *bufio.Writer
	rd      bytes.Reader
	br      *bufio.Reader
	req     h1.Request
	resp    h1.Response
	scratch []byte
	lenBuf  []byte // an answer's Content-Length value
	fields  []h1.Field
}

const (
	loopBufSize   = 16 << 10
	loopSweep     = time.Second
	loopEvents    = 128
	acceptBatch   = 64
	epollConnBits = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET
)

// loopCount is the number of event loops for --loops n.
func loopCount(n int) int {
	if n > 0 {
		return n
	}
	return max(1, runtime.GOMAXPROCS(0)-1)
}

func newEvloop(s *h1Server, exclusive, spare bool) (*evloop, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		_ = unix.Close(ep)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}); err != nil {
		_ = unix.Close(ep)
		_ = unix.Close(wake)
		return nil, fmt.Errorf("epoll_ctl eventfd: %w", err)
	}
	l := &evloop{s: s, p: s.p, log: s.log, ep: ep, wake: wake, exclusive: exclusive, spare: spare,
		lns: map[int]bool{}, addrs: map[string]sockaddr{},
		events: make([]unix.EpollEvent, loopEvents)}
	l.fdw.l = l
	l.dropIdle = l.closeIdle
	l.bw = bufio.NewWriterSize(&l.fdw, loopBufSize)
	l.br = bufio.NewReaderSize(&l.rd, loopBufSize)
	return l, nil
}

// post runs f on the loop's goroutine (at once, under mu, once the loop
// has ended: f finds nothing left to act on but what it owns itself).
func (l *evloop) post(f func()) {
	l.mu.Lock()
	if l.ended {
		f()
		l.mu.Unlock()
		return
	}
	l.posts = append(l.posts, f)
	// Under mu: closeAll closes the eventfd under it once ended is set.
	var one = [8]byte{1}
	_, _ = unix.Write(l.wake, one[:])
	l.mu.Unlock()
}

// listen makes the loop accept on a duplicate of ln's socket. The
// server's own accept loop must not run on ln meanwhile.
func (l *evloop) listen(ln *net.TCPListener) error {
	rc, err := ln.SyscallConn()
	if err != nil {
		return err
	}
	var fd int
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = unix.Dup(int(s)) }); err != nil {
		return err
	}
	if derr != nil {
		return fmt.Errorf("dup listener: %w", derr)
	}
	unix.CloseOnExec(fd)
	l.post(func() {
		if l.draining || l.stopped {
			_ = unix.Close(fd)
			return
		}
		l.lns[fd] = true
		l.watchListener(fd)
	})
	return nil
}

func (l *evloop) watchListener(fd int) {
	ev := uint32(unix.EPOLLIN)
	if l.exclusive {
		ev |= unix.EPOLLEXCLUSIVE
	}
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: ev, Fd: int32(fd)}); err != nil {
		l.log.Error("event loop: watch listener", "err", err)
	}
}

// run serves until the server is closed, or shut down and every caller
// connection of the loop ended. It owns the loop's thread.
func (l *evloop) run() {
	// Not locked to its thread: the runtime preempts a goroutine that ran
	// 10 ms without a scheduling point (a loop under load, or in a raw
	// wait), and a locked one then costs a hand-over of its thread and P
	// each time (futex wake-ups, measured in the open loop's p99);
	// unlocked, it goes back to the run queue and the next thread with a
	// P (as a rule its own) takes it up.
	defer l.closeAll()
	l.sweepAt = time.Now().Add(loopSweep)
	for !l.stopped && !(l.draining && l.callers == 0) {
		timeout := -1
		if l.callers > 0 || l.idle.len() > 0 || l.paused {
			timeout = int(max(time.Until(l.sweepAt), 0) / time.Millisecond)
		}
		n, err := l.wait(timeout)
		if err != nil {
			l.log.Error("event loop: epoll_wait", "err", err)
			l.s.Close()
			return
		}
		l.now = time.Now()
		for i := range n {
			ev := l.events[i]
			fd := int(ev.Fd)
			switch {
			case fd == l.wake:
				l.runPosts()
			case l.lns[fd]:
				l.accept(fd)
			default:
				// The serial tells a connection from one that had its fd
				// before it in this same batch of events.
				if c := l.conn(fd); c != nil && c.serial == uint32(ev.Pad) {
					l.event(c, ev.Events)
				}
			}
		}
		if !l.now.Before(l.sweepAt) {
			l.sweepAt = l.sweep(l.now)
		}
		l.flushDirty()
	}
}

// wait is epoll_wait, blocking up to timeout milliseconds (-1: no bound).
//
// While events keep coming, and a P is left to the rest of the router
// (spare), it blocks as a raw call that keeps the loop's P (at most
// rawWaitMax at a time). Issue 14, measured at 1,000 requests/s: a wait
// entered the runtime's way lets every P go idle, so sysmon sleeps deeply,
// and each return from the wait wakes it and resets it to its 20 µs
// polling: 2,000 sysmon wake-ups a second, a quarter of the router's CPU.
// Kept, the P never looks idle; sysmon backs off to 10 ms, and preempts
// the loop about as often (a signal, which ends the wait with EINTR).
//
// Once a raw wait saw nothing for rawWaitMax, the loop is quiet and waits
// the runtime's way: an idle router costs no wake-ups. A loop blocked
// there is a P in a system call, which the runtime takes back (a thread
// hand-off each time) only when no P is idle: so one P is left to the rest
// of the router (see loopCount).
func (l *evloop) wait(timeout int) (int, error) {
	if l.spare && !l.quiet {
		t := rawWaitMax
		if timeout >= 0 && timeout < t {
			t = timeout
		}
		ev := l.events
		// epoll_pwait with no signal mask: epoll_wait, on every
		// architecture (arm64 has only the former).
		n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.ep), uintptr(unsafe.Pointer(&ev[0])), uintptr(len(ev)), uintptr(t), 0, 0)
		switch {
		case e == unix.EINTR:
			return 0, nil // a preemption signal: back through run, which may be preempted
		case e != 0:
			return 0, e
		case n > 0:
			return int(n), nil
		case t == timeout:
			return 0, nil
		}
		l.quiet = true
		if timeout > 0 {
			timeout -= t // a deadline is kept to the millisecond
		}
	}
	n, err := l.waitBlocking(timeout)
	if n > 0 {
		l.quiet = false
	}
	return n, err
}

// rawWaitMax bounds a raw wait, in milliseconds (see wait).
const rawWaitMax = 5

func (l *evloop) waitBlocking(timeout int) (int, error) {
	for {
		n, err := unix.EpollWait(l.ep, l.events, timeout)
		if err == unix.EINTR {
			continue
		}
		return n, err
	}
}

func (l *evloop) runPosts() {
	var b [8]byte
	_, _ = unix.Read(l.wake, b[:])
	l.mu.Lock()
	posts := l.posts
	l.posts = nil
	l.mu.Unlock()
	for _, f := range posts {
		f()
	}
}

// accept takes the connections waiting on the listener ln.
func (l *evloop) accept(ln int) {
	for range acceptBatch {
		fd, sa, err := unix.Accept4(ln, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		switch {
		case err == unix.EAGAIN:
			return
		case err == unix.EMFILE || err == unix.ENFILE || err == unix.ENOBUFS || err == unix.ENOMEM:
			// Out of descriptors: stop accepting until the next sweep, as
			// net/http's server backs off.
			l.log.Warn("accept", "err", err, "retry_in", loopSweep.String())
			l.pauseAccept()
			return
		case err != nil:
			continue // the caller gave up before the accept (ECONNABORTED)
		}
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		keepAliveProbes(fd, 15) // as Go's listeners have them
		c := &lconn{fd: fd, in: make([]byte, loopBufSize), since: l.now}
		c.ip = sockaddrIP(sa)
		c.forIP, c.forwardedFor = forwardedNames(c.ip)
		if err := l.add(c); err != nil {
			_ = unix.Close(fd)
			continue
		}
		l.fromCaller(c) // bytes may be there already
	}
}

func (l *evloop) pauseAccept() {
	l.paused = true
	for fd := range l.lns {
		_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, fd, nil)
	}
}

// forwardedNames are the caller's address as X-Forwarded-For and
// Forwarded name it (IPv6 quoted and bracketed in Forwarded).
func forwardedNames(ip netip.Addr) (forIP, forwardedFor string) {
	forIP = ip.String()
	if ip.Is6() && !ip.Is4In6() {
		return forIP, `"[` + forIP + `]"`
	}
	return forIP, forIP
}

func sockaddrIP(sa unix.Sockaddr) netip.Addr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(a.Addr)
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(a.Addr).Unmap()
	}
	return netip.Addr{}
}

// sweepBy has the loop sweep at t at the latest.
func (l *evloop) sweepBy(t time.Time) {
	if t.Before(l.sweepAt) {
		l.sweepAt = t
	}
}

// sweep closes what idled too long, answers requests whose deadline
// passed or whose caller shut its side down watchAfter ago unanswered,
// fails connects that took too long, and accepts again after a pause. It
// returns when to sweep next: in a second, or at the first deadline
// before.
func (l *evloop) sweep(now time.Time) time.Time {
	// GOMAXPROCS follows the container's CPU limit as it changes.
	l.spare = runtime.GOMAXPROCS(0) > len(l.s.loops)
	next := now.Add(loopSweep)
	soon := func(t time.Time) {
		if !t.IsZero() && t.Before(next) {
			next = t
		}
	}
	if l.paused && !l.draining {
		l.paused = false
		for fd := range l.lns {
			l.watchListener(fd)
		}
	}
	for _, c := range l.conns {
		switch {
		case c == nil:
		case c.up && c.connecting && !now.Before(c.dialBy):
			l.instanceFailed(c, &net.OpError{Op: "dial", Net: "tcp", Err: errDialTimeout})
		case c.up && c.connecting:
			soon(c.dialBy)
		case c.up:
		case c.x.busy && !c.x.ls.deadline.IsZero() && !now.Before(c.x.ls.deadline):
			l.abort(c, errRequestTimeout)
		case c.x.busy && !c.x.leftAt.IsZero() && now.Sub(c.x.leftAt) >= watchAfter:
			l.abort(c, errCallerLeft)
		case c.x.busy:
			soon(c.x.ls.deadline)
			if !c.x.leftAt.IsZero() {
				soon(c.x.leftAt.Add(watchAfter))
			}
		case now.Sub(c.since) >= idleTimeout:
			l.close(c)
		}
	}
	l.idle.sweep(now, l.p.pool.idleTimeout, l.p.pool.isClosed(), l.dropIdle)
	if len(l.addrs) > 4096 {
		clear(l.addrs)
	}
	return next
}

var (
	errDialTimeout    = errors.New("connect timed out")
	errRequestTimeout = errors.New("request timed out")
)

// drain stops accepting, closes idle callers, and has busy ones closed
// after their exchange; run returns once none is left.
func (l *evloop) drain() {
	l.draining = true
	for fd := range l.lns {
		_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, fd, nil)
		_ = unix.Close(fd)
	}
	clear(l.lns)
	for _, c := range l.conns {
		if c == nil || c.up {
			continue
		}
		c.closeAfter = true
		if !c.x.busy && len(c.out) == 0 {
			l.close(c)
		}
	}
}

// stop ends run: busy exchanges are aborted (their slots given back).
func (l *evloop) stop() {
	l.stopped = true
}

// closeAll closes everything the loop holds (run's end).
func (l *evloop) closeAll() {
	for _, c := range l.conns {
		if c != nil && !c.up {
			l.close(c)
		}
	}
	for _, c := range l.conns {
		if c != nil {
			l.close(c)
		}
	}
	l.idle = idleShard[*lconn]{} // empty already: close unpooled each
	for fd := range l.lns {
		_ = unix.Close(fd)
	}
	clear(l.lns)
	l.mu.Lock()
	l.ended = true
	// Posts left run now, so that nothing they own is lost (a listener's
	// fd).
	for _, f := range l.posts {
		f()
	}
	l.posts = nil
	_ = unix.Close(l.wake)
	l.mu.Unlock()
	_ = unix.Close(l.ep)
	l.s.loopDone()
}
