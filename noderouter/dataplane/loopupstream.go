package dataplane

import (
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// upstream returns a kept-alive connection to addr from the loop's shard
// of the instance pool, the one used last, or a new one.
func (l *evloop) upstream(addr string, now time.Time) (*lconn, error) {
	if up, ok := l.idle.take(addr, now, l.p.pool.idleTimeout, l.dropIdle); ok {
		up.pooled = false
		up.reused = true
		return up, nil
	}
	return l.dial(addr, now)
}

// putIdle keeps up for the next request to its address, unless the
// loop's shard holds as many as it may for the address.
func (l *evloop) putIdle(up *lconn, now time.Time) {
	if l.draining || l.p.pool.isClosed() {
		l.close(up)
		return
	}
	up.since, up.n = now, 0
	if !l.idle.put(up.addr, up, l.p.pool.maxIdle) {
		l.close(up)
		return
	}
	up.pooled = true
}

// unpool takes up out of the loop's shard (closed while idle).
func (l *evloop) unpool(up *lconn) {
	l.idle.remove(up.addr, up)
	up.pooled = false
}

// closeIdle closes up, which the loop's shard has let go.
func (l *evloop) closeIdle(up *lconn) {
	up.pooled = false
	l.close(up)
}

// dial starts a connect to addr (non-blocking: the request waits in the
// connection's out until it is made).
func (l *evloop) dial(addr string, now time.Time) (*lconn, error) {
	ap, sa, err := l.sockaddr(addr)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
	}
	opErr := func(call string, err error) error {
		return &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(ap), Err: os.NewSyscallError(call, err)}
	}
	domain := unix.AF_INET
	if ap.Addr().Is6() {
		domain = unix.AF_INET6
	}
	fd, err := unix.Socket(domain, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, opErr("socket", err)
	}
	if mark := l.p.dialMark; mark != 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(mark)); err != nil {
			_ = unix.Close(fd)
			return nil, opErr("setsockopt SO_MARK", err)
		}
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	keepAliveProbes(fd, 30) // as the goroutine path's dialer sends them
	up := &lconn{fd: fd, up: true, in: make([]byte, loopBufSize), addr: addr, since: now}
	switch err := unix.Connect(fd, sa); err {
	case nil:
	case unix.EINPROGRESS:
		up.connecting = true
		up.dialBy = now.Add(l.p.pool.dialer.Timeout)
	default:
		_ = unix.Close(fd)
		return nil, opErr("connect", err)
	}
	if err := l.add(up); err != nil {
		_ = unix.Close(fd)
		return nil, opErr("epoll_ctl", err)
	}
	return up, nil
}

// sockaddr parses an instance address (cached: a function's few
// instances are dialled again and again).
func (l *evloop) sockaddr(addr string) (netip.AddrPort, unix.Sockaddr, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return ap, nil, err
	}
	if sa, ok := l.addrs[addr]; ok {
		return sa.ap, sa.sa, nil
	}
	var sa unix.Sockaddr
	if a := ap.Addr().Unmap(); a.Is4() {
		ap = netip.AddrPortFrom(a, ap.Port())
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}
	} else {
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
	}
	l.addrs[addr] = sockaddr{ap, sa}
	return ap, sa, nil
}

// sockaddr is a parsed instance address (an IPv4-mapped one unmapped).
type sockaddr struct {
	ap netip.AddrPort
	sa unix.Sockaddr
}

// keepAliveProbes turns TCP keep-alive on for fd, probing every secs
// seconds once it idled as long.
func keepAliveProbes(fd, secs int) {
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, secs)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, secs)
}

// connected finishes a connect once epoll says the socket is writable.
func (l *evloop) connected(up *lconn) {
	up.connecting = false
	v, err := unix.GetsockoptInt(up.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err == nil && v != 0 {
		err = syscall.Errno(v)
	}
	if err != nil {
		ap, _, _ := l.sockaddr(up.addr)
		l.instanceFailed(up, &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(ap), Err: os.NewSyscallError("connect", err)})
	}
}

// instanceFailed closes up, which failed before a whole answer came (see
// failed).
func (l *evloop) instanceFailed(up *lconn, err error) {
	c := up.peer
	if c != nil {
		c.peer, up.peer = nil, nil
	}
	l.close(up)
	if c != nil {
		l.failed(c, err, up.reused)
	}
}
