package noderouter

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// deferConn is an instance connection whose last write before a read (a
// request) is put off into that read: the read resets the connection's
// readiness, writes, and then waits for the answer before it reads. A
// plain write and read costs a read syscall more: Go tries the read at
// once, gets EAGAIN (the instance has not answered yet) and only then
// waits. Issue 14: on the router's 2-core VMs each syscall takes a
// hypervisor path, and this read was one of six syscalls per warm request.
//
// Waiting before the first read is safe only because the write comes
// after the reset and the peer sends nothing unasked: whatever it sends
// (the answer, or a reset of a connection it had closed while idle) comes
// after the request, and wakes the wait. Written before the reset, an
// answer arriving in between would be forgotten and the wait would last
// for good; a peer that may have sent bytes before (a caller pipelining
// requests) must be read at once, so callers' connections are plain. The
// forwarder arms it (deferNext) just before the flush that ends a request;
// Close writes what is pending first.
type deferConn struct {
	*net.TCPConn
	rc      syscall.RawConn
	armed   bool   // the next Write is put off
	pending []byte // put off, written at the next Read
	step    func(fd uintptr) bool

	// Read's state for step.
	buf            []byte
	first, blocked bool
	n              int
	rerr, werr     error
}

// newDeferConn wraps nc when it is a TCP connection; otherwise it returns
// nc and nil.
func newDeferConn(nc net.Conn) (net.Conn, *deferConn) {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nc, nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nc, nil
	}
	d := &deferConn{TCPConn: tc, rc: rc}
	d.step = d.readStep
	return d, d
}

// deferNext puts the next Write off to the next Read. Nil-safe.
func (c *deferConn) deferNext() {
	if c != nil {
		c.armed = true
	}
}

func (c *deferConn) Write(p []byte) (int, error) {
	if c.armed && len(c.pending) == 0 {
		c.armed = false
		c.pending = append(c.pending[:0], p...)
		return len(p), nil
	}
	c.armed = false
	if err := c.flushPending(); err != nil {
		return 0, err
	}
	return c.TCPConn.Write(p)
}

// flushPending writes what a deferred Write left, blocking.
func (c *deferConn) flushPending() error {
	if len(c.pending) == 0 {
		return nil
	}
	_, err := c.TCPConn.Write(c.pending)
	c.pending = c.pending[:0]
	return err
}

func (c *deferConn) Read(p []byte) (int, error) {
	if len(c.pending) == 0 {
		return c.TCPConn.Read(p)
	}
	c.buf, c.first, c.blocked, c.n, c.rerr, c.werr = p, true, false, 0, nil, nil
	err := c.rc.Read(c.step)
	n, rerr, werr := c.n, c.rerr, c.werr
	c.buf = nil
	switch {
	case werr != nil:
		return 0, &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("write", werr)}
	case c.blocked:
		if err := c.flushPending(); err != nil {
			return 0, err
		}
		return c.TCPConn.Read(p)
	case err != nil:
		return 0, err // the read deadline, a closed connection
	case rerr != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("read", rerr)}
	case n == 0 && len(p) > 0:
		return 0, io.EOF
	}
	return n, nil
}

// readStep is Read's function for RawConn.Read (a method value made once:
// a closure per Read would allocate): first the write, then, once the
// connection is readable, the read.
func (c *deferConn) readStep(fd uintptr) bool {
	if !c.first {
		c.n, c.rerr = ignoringEINTRRead(int(fd), c.buf)
		return c.rerr != syscall.EAGAIN
	}
	c.first = false
	for len(c.pending) > 0 {
		m, e := syscall.Write(int(fd), c.pending)
		switch {
		case m > 0 && m == len(c.pending):
			c.pending = c.pending[:0] // keeps the buffer for the next request
		case m > 0:
			c.pending = c.pending[m:]
		case e == syscall.EINTR:
		case e == syscall.EAGAIN:
			c.blocked = true // the send buffer is full: finish outside
			return true
		default:
			c.werr = e
			c.pending = c.pending[:0]
			return true
		}
	}
	return false // wait for the answer (see the type's doc)
}

func ignoringEINTRRead(fd int, p []byte) (int, error) {
	for {
		n, err := syscall.Read(fd, p)
		if err != syscall.EINTR {
			if n < 0 {
				n = 0
			}
			return n, err
		}
	}
}

// Close writes what is pending, then closes.
func (c *deferConn) Close() error {
	werr := c.flushPending()
	return errors.Join(c.TCPConn.Close(), werr)
}
