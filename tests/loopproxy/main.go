package main

import (
	"bytes"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18084", "address to serve on (each loop binds it with SO_REUSEPORT)")
	upstream := flag.String("upstream", "127.0.0.1:18080", "the one instance every request goes to")
	procs := flag.Int("procs", 0, "GOMAXPROCS; 0: the runtime's default")
	loops := flag.Int("loops", 0, "event loops, one per locked OS thread; 0: one fewer than GOMAXPROCS, at least one (see loop.wait)")
	flag.Parse()
	if *procs > 0 {
		runtime.GOMAXPROCS(*procs)
	}
	if *loops <= 0 {
		*loops = max(1, runtime.GOMAXPROCS(0)-1)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	la, err := netip.ParseAddrPort(*listen)
	if err != nil {
		log.Error("bad -listen", "err", err)
		os.Exit(2)
	}
	ua, err := netip.ParseAddrPort(*upstream)
	if err != nil {
		log.Error("bad -upstream", "err", err)
		os.Exit(2)
	}
	var wg sync.WaitGroup
	errs := make(chan error, *loops)
	var ls []*loop
	for i := range *loops {
		l, err := newLoop(la, ua)
		if err != nil {
			log.Error("loop", "n", i, "err", err)
			os.Exit(1)
		}
		ls = append(ls, l)
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			errs <- l.run()
		}()
	}
	log.Info("serving", "listen", la, "upstream", ua, "loops", *loops)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	code := 0
	select {
	case <-sig:
	case err := <-errs:
		log.Error("loop ended", "err", err)
		code = 1
	}
	for _, l := range ls {
		l.stop()
	}
	wg.Wait()
	os.Exit(code)
}

const bufSize = 16 << 10

// conn is a caller's connection or an instance's, by fd.
type conn struct {
	fd       int
	upstream bool
	peer     *conn // the instance connection serving this caller, or the caller
	in       []byte
	n        int  // bytes in in
	ready    bool // readable as far as we know (nginx's rev->ready)
	want     int  // upstream: bytes of the response still to come, -1 head not complete
}

type loop struct {
	ep, ln   int
	stopFD   int // an eventfd: written, the loop returns
	upstream unix.Sockaddr
	conns    map[int]*conn
	idle     []*conn // instance connections, LIFO
	out      []byte
	events   []unix.EpollEvent
}

func newLoop(la, ua netip.AddrPort) (*loop, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	_ = unix.SetsockoptInt(ln, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.SetsockoptInt(ln, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		return nil, fmt.Errorf("SO_REUSEPORT: %w", err)
	}
	if err := unix.Bind(ln, &unix.SockaddrInet4{Port: int(la.Port()), Addr: la.Addr().As4()}); err != nil {
		return nil, fmt.Errorf("bind %s: %w", la, err)
	}
	if err := unix.Listen(ln, 4096); err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	l := &loop{ep: ep, ln: ln, upstream: &unix.SockaddrInet4{Port: int(ua.Port()), Addr: ua.Addr().As4()},
		conns: map[int]*conn{}, out: make([]byte, 0, bufSize), events: make([]unix.EpollEvent, 128)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, ln, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ln)}); err != nil {
		return nil, fmt.Errorf("epoll_ctl listener: %w", err)
	}
	if l.stopFD, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, l.stopFD, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(l.stopFD)}); err != nil {
		return nil, fmt.Errorf("epoll_ctl eventfd: %w", err)
	}
	return l, nil
}

// addr is the address the loop's listener is bound to.
func (l *loop) addr() (netip.AddrPort, error) {
	sa, err := unix.Getsockname(l.ln)
	if err != nil {
		return netip.AddrPort{}, err
	}
	in, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("listener is not IPv4: %T", sa)
	}
	return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port)), nil
}

// stop ends run (from another goroutine) and closes what the loop holds
// once it returned.
func (l *loop) stop() {
	_, _ = unix.Write(l.stopFD, []byte{1, 0, 0, 0, 0, 0, 0, 0})
}

func (l *loop) closeAll() {
	for _, c := range l.conns {
		_ = unix.Close(c.fd)
	}
	clear(l.conns)
	l.idle = nil
	_ = unix.Close(l.ln)
	_ = unix.Close(l.stopFD)
	_ = unix.Close(l.ep)
}

// wait is epoll_wait: at once without giving up the P when something is
// ready, else blocking (the P goes to other goroutines meanwhile). A loop
// blocked there is a P in a system call; when no P is idle, sysmon takes
// it back after 20 µs and the runtime starts a spinning thread to look for
// work that is not there (a futex wake-up and a context switch each
// time). Measured with two loops at GOMAXPROCS 2 that cost more than the
// loops saved, so by default one P is left idle.
func (l *loop) wait() (int, error) {
	ev := l.events
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.ep), uintptr(unsafe.Pointer(&ev[0])), uintptr(len(ev)), 0, 0, 0)
	if e == 0 && n > 0 {
		return int(n), nil
	}
	for {
		m, err := unix.EpollWait(l.ep, ev, -1)
		if err == unix.EINTR {
			continue
		}
		return m, err
	}
}

func (l *loop) run() error {
	defer l.closeAll()
	for {
		n, err := l.wait()
		if err != nil {
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for i := range n {
			fd := int(l.events[i].Fd)
			if fd == l.stopFD {
				return nil
			}
			if fd == l.ln {
				l.accept()
				continue
			}
			c := l.conns[fd]
			if c == nil {
				continue
			}
			c.ready = true
			l.readable(c)
		}
	}
}

func (l *loop) accept() {
	for {
		fd, _, err := unix.Accept4(l.ln, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN, or a failed accept: the next edge retries
		}
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		c := &conn{fd: fd, in: make([]byte, bufSize)}
		if l.add(c) != nil {
			_ = unix.Close(fd)
		}
	}
}

func (l *loop) add(c *conn) error {
	l.conns[c.fd] = c
	return unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, c.fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(c.fd)})
}

func (l *loop) close(c *conn) {
	if c == nil || l.conns[c.fd] != c {
		return
	}
	delete(l.conns, c.fd)
	_ = unix.Close(c.fd) // also leaves the epoll set
	if p := c.peer; p != nil {
		c.peer, p.peer = nil, nil
		l.close(p)
	}
}

// fill reads what the socket has into c.in; false: nothing more now (or
// closed, then c is closed).
func (l *loop) fill(c *conn) bool {
	if !c.ready || c.n == len(c.in) {
		return false
	}
	m, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(c.fd), uintptr(unsafe.Pointer(&c.in[c.n])), uintptr(len(c.in)-c.n))
	switch {
	case e == unix.EAGAIN:
		c.ready = false
		return false
	case e != 0 || m == 0:
		l.close(c)
		return false
	}
	if int(m) < len(c.in)-c.n {
		c.ready = false // drained: the next edge says when there is more
	}
	c.n += int(m)
	return true
}

func (l *loop) readable(c *conn) {
	if c.upstream {
		l.fromInstance(c)
		return
	}
	l.fromCaller(c)
}

var (
	crlf2  = []byte("\r\n\r\n")
	clName = []byte("\ncontent-length:")
)

// fromCaller forwards each complete request head to an instance
// connection (one request at a time per caller).
func (l *loop) fromCaller(c *conn) {
	for l.conns[c.fd] == c {
		if c.peer == nil {
			if end := bytes.Index(c.in[:c.n], crlf2); end >= 0 {
				if !l.forward(c, end+4) {
					l.close(c)
				}
				continue
			}
		}
		if !l.fill(c) {
			return
		}
	}
}

// forward writes the head of c's request (head bytes) to an instance
// connection with an X-Forwarded-For field added.
func (l *loop) forward(c *conn, head int) bool {
	req := c.in[:head]
	if !bytes.HasPrefix(req, []byte("GET ")) {
		return false
	}
	up := l.instance()
	if up == nil {
		return false
	}
	line := bytes.IndexByte(req, '\n') + 1
	out := append(l.out[:0], req[:line]...)
	out = append(out, "X-Forwarded-For: 198.51.100.1\r\n"...)
	out = append(out, req[line:]...)
	l.out = out
	if !writeFull(up.fd, out) {
		l.close(up)
		return false
	}
	c.n = copy(c.in, c.in[head:c.n])
	c.peer, up.peer = up, c
	up.want = -1
	// The answer cannot be there yet: wait for its edge rather than read.
	up.ready = false
	return true
}

// instance is a kept-alive instance connection or a new one.
func (l *loop) instance() *conn {
	if n := len(l.idle); n > 0 {
		up := l.idle[n-1]
		l.idle = l.idle[:n-1]
		return up
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	if err := unix.Connect(fd, l.upstream); err != nil { // blocking: new connections are rare
		_ = unix.Close(fd)
		return nil
	}
	_ = unix.SetNonblock(fd, true)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	up := &conn{fd: fd, upstream: true, in: make([]byte, bufSize)}
	if l.add(up) != nil {
		_ = unix.Close(fd)
		return nil
	}
	return up
}

// fromInstance relays a response once it is complete (head and
// Content-Length body in the buffer) to the caller and returns the
// connection to the pool.
func (l *loop) fromInstance(up *conn) {
	for l.conns[up.fd] == up {
		if up.peer == nil {
			// An idle connection readable: closed by the instance, or
			// stray bytes.
			l.close(up)
			return
		}
		if up.want < 0 {
			if end := bytes.Index(up.in[:up.n], crlf2); end >= 0 {
				i := bytes.Index(bytes.ToLower(up.in[:end+2]), clName) // a prototype may allocate here
				if i < 0 {
					l.close(up)
					return
				}
				v := up.in[i+len(clName):]
				v = v[:bytes.IndexByte(v, '\r')]
				cl, err := strconv.Atoi(string(bytes.TrimSpace(v)))
				if err != nil || end+4+cl > len(up.in) {
					l.close(up)
					return
				}
				up.want = end + 4 + cl
			}
		}
		if up.want >= 0 && up.n >= up.want {
			c := up.peer
			ok := writeFull(c.fd, up.in[:up.want])
			up.n = copy(up.in, up.in[up.want:up.n])
			up.peer, c.peer = nil, nil
			if up.n == 0 {
				l.idle = append(l.idle, up)
			} else {
				l.close(up)
			}
			if !ok {
				l.close(c)
				return
			}
			// A pipelined request may wait in the caller's buffer.
			l.fromCaller(c)
			return
		}
		if !l.fill(up) {
			return
		}
	}
}

// writeFull writes p to a non-blocking socket; a full send buffer fails it
// (a prototype's responses are small).
func writeFull(fd int, p []byte) bool {
	for len(p) > 0 {
		m, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e == unix.EINTR {
			continue
		}
		if e != 0 || m == 0 {
			return false
		}
		p = p[m:]
	}
	return true
}
