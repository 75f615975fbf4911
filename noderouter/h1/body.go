package h1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
)

// maxChunkLine bounds a chunk-size line without its CRLF, as net/http's
// internal.chunkedReader does.
const maxChunkLine = 4096

// maxChunkExcess bounds the bytes of chunk-size lines beyond 16 per chunk
// plus twice its data (net/http's defence against a body of extensions).
const maxChunkExcess = 16 << 10

type chunkState uint8

const (
	chunkSize chunkState = iota // next: a chunk-size line
	chunkData                   // next: n bytes of chunk data
	chunkCRLF                   // next: the CRLF after chunk data
	chunkDone                   // the last chunk and the trailers were read
)

// Body reads one message body from a connection's reader, decoding its
// framing: the bytes of a Content-Length body, the data of a chunked body
// (checked as net/http checks it, trailers kept in Trailer), or everything
// up to EOF. It stops exactly at the body's end, so the next message can
// be read from the same reader. Reset it for each message; it allocates
// nothing once its trailer buffer has grown.
type Body struct {
	br      *bufio.Reader
	kind    BodyKind
	n       int64 // bytes left: of the body (BodyLength) or of the chunk
	state   chunkState
	excess  int64
	read    int64
	err     error // sticky
	trailer Header
}

// Reset makes b read the body framed by f from br.
func (b *Body) Reset(br *bufio.Reader, f Framing) {
	*b = Body{br: br, kind: f.Kind, n: f.Length, trailer: b.trailer}
	b.trailer.reset()
	if f.Kind == BodyLength && f.Length <= 0 {
		b.kind = BodyNone
	}
}

// Trailer returns the trailer fields of a chunked body, complete once Read
// has returned io.EOF. Fields named with ReservedPrefix are marked dropped:
// WriteLastChunk leaves them out.
func (b *Body) Trailer() *Header { return &b.trailer }

// N returns how many body bytes (decoded) Read has returned.
func (b *Body) N() int64 { return b.read }

// Read reads body bytes into p. It returns io.EOF at the body's end;
// io.ErrUnexpectedEOF (wrapped) when the connection ends inside it; a
// chunked body that breaks the coding is ErrBadChunk or ErrMalformed. It
// returns as soon as it has bytes rather than wait for the next chunk.
func (b *Body) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	var n int
	switch b.kind {
	case BodyNone:
		b.err = io.EOF
	case BodyLength:
		n, b.err = b.readLength(p)
	case BodyUntilClose:
		n, b.err = b.br.Read(p)
	case BodyChunked:
		n, b.err = b.readChunked(p)
	default:
		b.err = fmt.Errorf("h1: read body: unknown framing %v", b.kind)
	}
	b.read += int64(n)
	return n, b.err
}

func (b *Body) readLength(p []byte) (int, error) {
	if b.n == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.br.Read(p)
	b.n -= int64(n)
	switch {
	case err == io.EOF:
		return n, fmt.Errorf("read body: %w", io.ErrUnexpectedEOF)
	case err != nil:
		return n, fmt.Errorf("read body: %w", err)
	}
	return n, nil
}

func (b *Body) readChunked(p []byte) (int, error) {
	for {
		switch b.state {
		case chunkDone:
			return 0, io.EOF
		case chunkData:
			if len(p) == 0 {
				return 0, nil
			}
			if int64(len(p)) > b.n {
				p = p[:b.n]
			}
			n, err := b.br.Read(p)
			b.n -= int64(n)
			if b.n == 0 {
				b.state = chunkCRLF
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				return n, fmt.Errorf("read chunk: %w", err)
			}
			return n, nil
		case chunkCRLF:
			c1, err := b.br.ReadByte()
			if err == nil {
				var c2 byte
				if c2, err = b.br.ReadByte(); err == nil && (c1 != '\r' || c2 != '\n') {
					return 0, fmt.Errorf("%w: chunk data not followed by CRLF", ErrBadChunk)
				}
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				return 0, fmt.Errorf("read chunk: %w", err)
			}
			b.state = chunkSize
		case chunkSize:
			size, err := b.readChunkSize()
			if err != nil {
				return 0, err
			}
			if size == 0 {
				if err := b.readTrailer(); err != nil {
					return 0, err
				}
				b.state = chunkDone
				return 0, io.EOF
			}
			b.n, b.state = size, chunkData
		}
	}
}

// readChunkSize reads a chunk-size line as net/http's chunkedReader does:
// CRLF-terminated (a bare LF or any other CR is an error), at most
// maxChunkLine bytes, trailing OWS and any extension (from the first ';',
// unchecked) ignored, 1 to 16 hex digits. A chunk size beyond 2^63-1 is an
// error here; net/http accepts it and fails later for want of data.
func (b *Body) readChunkSize() (int64, error) {
	line, err := b.br.ReadSlice('\n')
	switch {
	case err == io.EOF:
		return 0, fmt.Errorf("read chunk size: %w", io.ErrUnexpectedEOF)
	case err == bufio.ErrBufferFull:
		return 0, fmt.Errorf("%w: chunk-size line too long", ErrBadChunk)
	case err != nil:
		return 0, fmt.Errorf("read chunk size: %w", err)
	}
	if cr := bytes.IndexByte(line, '\r'); cr < 0 {
		return 0, wrapf(ErrBadChunk, "chunk-size line ends in bare LF", line)
	} else if cr != len(line)-2 {
		return 0, wrapf(ErrBadChunk, "CR in chunk-size line", line)
	}
	line = line[:len(line)-2]
	if len(line) >= maxChunkLine {
		return 0, fmt.Errorf("%w: chunk-size line too long", ErrBadChunk)
	}
	b.excess += int64(len(line)) + 2
	hex := trimOWSRight(line) // leading OWS stays, and is a bad digit
	if semi := bytes.IndexByte(hex, ';'); semi >= 0 {
		hex = hex[:semi]
	}
	if len(hex) == 0 || len(hex) > 16 {
		return 0, wrapf(ErrBadChunk, "chunk size", line)
	}
	var size uint64
	for _, c := range hex {
		var d byte
		switch {
		case isDigit(c):
			d = c - '0'
		case 'a' <= lower(c) && lower(c) <= 'f':
			d = lower(c) - 'a' + 10
		default:
			return 0, wrapf(ErrBadChunk, "chunk size", line)
		}
		size = size<<4 | uint64(d)
	}
	if size > 1<<63-1 {
		return 0, wrapf(ErrBadChunk, "chunk size too large", line)
	}
	b.excess -= 16 + 2*int64(size)
	b.excess = max(b.excess, 0)
	if b.excess > maxChunkExcess {
		return 0, fmt.Errorf("%w: too much non-data", ErrBadChunk)
	}
	return int64(size), nil
}

func trimOWSRight(b []byte) []byte {
	for len(b) > 0 && isOWS(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// readTrailer reads the trailer section after the last chunk into
// b.trailer, with the field rules of a head. Like net/http it must end
// within the reader's buffer size. Stricter: every line ends in CRLF
// (net/http accepts a bare LF where its CRLF CRLF search still succeeds).
func (b *Body) readTrailer() error {
	p, err := b.br.Peek(2)
	if len(p) == 2 && p[0] == '\r' && p[1] == '\n' {
		b.br.Discard(2)
		return nil
	}
	if len(p) < 2 {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("read trailer: %w", err)
	}
	t := &b.trailer
	for {
		start, err := t.readLine(b.br, b.br.Size(), false)
		if errors.Is(err, ErrHeadTooLarge) {
			return fmt.Errorf("%w: trailer section longer than %d bytes", ErrMalformed, b.br.Size())
		}
		if err != nil {
			return fmt.Errorf("trailer: %w", err)
		}
		end := len(t.buf) - 1
		if end == start || t.buf[end-1] != '\r' {
			return errTrailerLF
		}
		end--
		if end == start {
			// The router's own fields come from the router, never from a
			// peer's trailers.
			t.dropReserved()
			return nil
		}
		if err := t.addField(start, end); err != nil {
			return fmt.Errorf("trailer: %w", err)
		}
	}
}

// WriteChunk writes p as one chunk; nothing when p is empty (an empty
// chunk would end the body).
func WriteChunk(w *bufio.Writer, p []byte) error {
	if len(p) == 0 {
		return nil
	}
	writeHex(w, uint64(len(p)))
	w.WriteString("\r\n")
	w.Write(p)
	_, err := w.WriteString("\r\n")
	return err
}

// writeHex writes n in lower-case hex digits by bytes: a digit array
// handed to w.Write would escape (bufio passes large writes through).
func writeHex(w *bufio.Writer, n uint64) {
	shift := 60
	for shift > 0 && n>>shift == 0 {
		shift -= 4
	}
	for ; shift >= 0; shift -= 4 {
		w.WriteByte("0123456789abcdef"[n>>shift&0xf])
	}
}

// WriteLastChunk ends a chunked body: the last chunk, the fields of
// trailer not marked dropped (nil: none), and the blank line.
func WriteLastChunk(w *bufio.Writer, trailer *Header) error {
	w.WriteString("0\r\n")
	if trailer != nil {
		trailer.writeFields(w)
	}
	_, err := w.WriteString("\r\n")
	return err
}

// WriteError is a Copy failure on the writing side (the peer being
// written to went away), as opposed to a failure reading the body.
type WriteError struct{ Err error }

func (e *WriteError) Error() string { return "write body: " + e.Err.Error() }
func (e *WriteError) Unwrap() error { return e.Err }

// copyBufs are Copy's buffers.
var copyBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// Copy streams body to w until its end. With chunked, each read goes out
// as one chunk and the body ends with the last chunk and body's trailers
// (re-framing a chunked body chunk by chunk, or chunking one of another
// framing); otherwise the bytes go out as they are. With flush, w is
// flushed after each read, so that a stream (server-sent events, a
// response that stalls) reaches the peer as the sender wrote it; the end
// is always flushed. It returns the body bytes copied and, on failure, the
// read error or a *WriteError.
func Copy(w *bufio.Writer, body *Body, chunked, flush bool) (int64, error) {
	buf := copyBufs.Get().(*[32 << 10]byte)
	defer copyBufs.Put(buf)
	var written int64
	for {
		n, rerr := body.Read(buf[:])
		if n > 0 {
			var werr error
			if chunked {
				werr = WriteChunk(w, buf[:n])
			} else {
				_, werr = w.Write(buf[:n])
			}
			if werr == nil && flush {
				werr = w.Flush()
			}
			if werr != nil {
				return written, &WriteError{werr}
			}
			written += int64(n)
		}
		if rerr == io.EOF {
			var werr error
			if chunked {
				werr = WriteLastChunk(w, body.Trailer())
			}
			if werr == nil {
				werr = w.Flush()
			}
			if werr != nil {
				return written, &WriteError{werr}
			}
			return written, nil
		}
		if rerr != nil {
			return written, rerr
		}
	}
}
