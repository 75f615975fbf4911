package dataplane

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// sock is a TCP connection of the h1 forwarder (a caller's or an
// instance's) whose reads and writes are raw system calls on its
// non-blocking socket, made from the net poller's RawConn callbacks.
//
// Issue 14: Go's own socket I/O enters every read and write through
// entersyscall. On the router's 2-core VMs a socket call takes a
// hypervisor path long enough that the runtime's sysmon thread, which
// wakes every 20 µs while it finds a P sitting in a system call, keeps
// finding one: it hands the P to another thread (a futex wake-up), and
// never backs off to its 10 ms sleep. perf put a fifth of the router's CPU
// in sysmon's nanosleep loop under load. A call on a non-blocking socket
// never blocks, so it needs none of that: made raw, the P stays with its
// goroutine, sysmon finds nothing to retake and sleeps, and a socket that
// is not ready parks the goroutine on the net poller as Go's own read
// does (deadlines included, the RawConn honours them).
//
// A sock can also put a write off into the next read (deferNext): the
// read resets the connection's readiness, writes, and then waits for the
// answer before it reads. A plain write and read costs a read syscall
// more: the read is tried at once, gets EAGAIN (the instance has not
// answered yet) and only then waits. Waiting before the first read is safe
// only because the write comes after the reset and the peer sends nothing
// unasked: whatever it sends (the answer, or a reset of a connection it
// had closed while idle) comes after the request, and wakes the wait.
// Written before the reset, an answer arriving in between would be
// forgotten and the wait would last for good; a peer that may have sent
// bytes before (a caller pipelining requests) must be read at once, so
// only instance connections are armed. The forwarder arms it just before
// the flush that ends a request; Close writes what is pending first.
//
// It holds its *net.TCPConn rather than embedding it, so that none of the
// TCPConn's own I/O (ReadFrom, WriteTo, which io.Copy and bufio prefer)
// can bypass a pending write or the raw calls.
type sock struct {
	tc         *net.TCPConn
	rc         syscall.RawConn
	deferrable bool   // see newSock; the fields below up to rstep are its
	armed      bool   // the next Write is put off
	pending    []byte // put off, written at the next Read
	// wrote: bytes went to the socket since the last Read; a write is
	// then not put off (the peer may be answering already).
	wrote bool

	// Method values made once (a closure per call would allocate).
	rstep, dstep, wstep func(fd uintptr) bool

	// Read's and Write's state for their steps.
	rbuf           []byte
	first, blocked bool
	rn             int
	rerr, derr     error // the read's, the deferred write's
	wbuf           []byte
	wn             int
	werr           error
}

// newSock wraps nc when it is a TCP connection; otherwise it returns nc
// and nil. deferrable allows deferNext (an instance connection); a sock without it
// keeps no state that its Read and Write share, so that one goroutine may
// read it while another writes (a caller's connection while its watch
// reads).
func newSock(nc net.Conn, deferrable bool) (net.Conn, *sock) {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nc, nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nc, nil
	}
	s := &sock{tc: tc, rc: rc, deferrable: deferrable}
	s.rstep, s.dstep, s.wstep = s.readStep, s.deferredStep, s.writeStep
	return s, s
}

// deferNext puts the next Write off to the next Read, unless bytes went
// to the socket since the last Read: a peer that already has part of the
// request (a body's first bytes) may answer before the rest, and an answer
// that came before the readiness reset would never wake the wait. Arm it
// only right before a write (a Flush of a non-empty buffer): an armed sock
// holds back whatever is written next. Nil-safe.
func (s *sock) deferNext() {
	if s != nil && s.deferrable && !s.wrote {
		s.armed = true
	}
}

// SyscallConn is the connection's RawConn (alive peeks through it).
func (s *sock) SyscallConn() (syscall.RawConn, error) { return s.rc, nil }

func (s *sock) Write(p []byte) (int, error) {
	if !s.deferrable {
		return s.write(p)
	}
	if s.armed && len(s.pending) == 0 {
		s.armed = false
		s.pending = append(s.pending[:0], p...)
		return len(p), nil
	}
	s.armed = false
	if err := s.flushPending(); err != nil {
		return 0, err
	}
	s.wrote = true
	return s.write(p)
}

// write writes all of p, waiting on the poller while the send buffer is
// full.
func (s *sock) write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.wbuf, s.wn, s.werr = p, 0, nil
	err := s.rc.Write(s.wstep)
	n, werr := s.wn, s.werr
	s.wbuf = nil
	switch {
	case err != nil:
		return n, s.opError("write", err)
	case werr != nil:
		return n, s.opError("write", os.NewSyscallError("write", werr))
	}
	return n, nil
}

func (s *sock) writeStep(fd uintptr) bool {
	m, full, err := writeAll(fd, s.wbuf)
	s.wn += m
	s.wbuf = s.wbuf[m:]
	if full {
		return false // wait until writable
	}
	s.werr = err
	return true
}

// writeAll writes p to fd until all of it is written (full false, err
// nil), the send buffer is full (full: n bytes went), or the write fails.
// A write of nothing without an error is io.ErrUnexpectedEOF, as Go's
// poller has it.
func writeAll(fd uintptr, p []byte) (n int, full bool, err error) {
	for n < len(p) {
		m, e := rawWrite(fd, p[n:])
		switch {
		case m > 0:
			n += m
		case e == syscall.EINTR:
		case e == syscall.EAGAIN:
			return n, true, nil
		case e == nil:
			return n, false, io.ErrUnexpectedEOF
		default:
			return n, false, e
		}
	}
	return n, false, nil
}

// flushPending writes what a deferred Write left, blocking.
func (s *sock) flushPending() error {
	if len(s.pending) == 0 {
		return nil
	}
	_, err := s.write(s.pending)
	s.pending = s.pending[:0]
	return err
}

func (s *sock) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	step := s.rstep
	if s.deferrable {
		s.armed, s.wrote = false, false
		if len(s.pending) > 0 {
			step = s.dstep
		}
	}
	s.rbuf, s.first, s.blocked, s.rn, s.rerr, s.derr = p, true, false, 0, nil, nil
	err := s.rc.Read(step)
	n, rerr, derr := s.rn, s.rerr, s.derr
	s.rbuf = nil
	switch {
	case derr != nil:
		return 0, s.opError("write", os.NewSyscallError("write", derr))
	case s.blocked:
		if err := s.flushPending(); err != nil {
			return 0, err
		}
		return s.Read(p)
	case err != nil:
		return 0, s.opError("read", err) // the read deadline, a closed connection
	case rerr != nil:
		return 0, s.opError("read", os.NewSyscallError("read", rerr))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// readStep is a plain read: at once, and again each time the poller says
// the socket is readable.
func (s *sock) readStep(fd uintptr) bool {
	s.rn, s.rerr = rawRead(fd, s.rbuf)
	return s.rerr != syscall.EAGAIN
}

// deferredStep is a read after a deferred write: first the write, then,
// once the connection is readable, the read.
func (s *sock) deferredStep(fd uintptr) bool {
	if !s.first {
		return s.readStep(fd)
	}
	s.first = false
	m, full, err := writeAll(fd, s.pending)
	// What is left stays at the front (the buffer keeps its capacity for
	// the next request).
	s.pending = s.pending[:copy(s.pending, s.pending[m:])]
	switch {
	case err != nil:
		s.derr = err
		s.pending = s.pending[:0]
		return true
	case full:
		s.blocked = true // the send buffer is full: finish outside
		return true
	}
	return false // wait for the answer (see the type's doc)
}

// opError gives err the shape Go's own socket errors have (the RawConn's
// say "raw-read" and "raw-write"): a *net.OpError whose Err is the cause,
// so errors.Is(err, os.ErrDeadlineExceeded), net.ErrClosed and syscall
// errnos match as they do on a net.TCPConn.
func (s *sock) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: s.LocalAddr(), Addr: s.RemoteAddr(), Err: err}
}

// Close writes what is pending, then closes.
func (s *sock) Close() error {
	werr := s.flushPending()
	return errors.Join(s.tc.Close(), werr)
}

// abort closes the connection from another goroutine than the one using
// it: nothing pending is written.
func (s *sock) abort() error { return s.tc.Close() }

func (s *sock) CloseWrite() error                  { return s.tc.CloseWrite() }
func (s *sock) LocalAddr() net.Addr                { return s.tc.LocalAddr() }
func (s *sock) RemoteAddr() net.Addr               { return s.tc.RemoteAddr() }
func (s *sock) SetDeadline(t time.Time) error      { return s.tc.SetDeadline(t) }
func (s *sock) SetReadDeadline(t time.Time) error  { return s.tc.SetReadDeadline(t) }
func (s *sock) SetWriteDeadline(t time.Time) error { return s.tc.SetWriteDeadline(t) }
