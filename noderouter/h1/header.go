package h1

import (
	"bufio"
	"fmt"
	"io"
)

// span is a range [off, end) of a Header's buffer.
type span struct{ off, end int32 }

// field is one header field line: its name and its value with the
// surrounding whitespace trimmed, both spans of the buffer.
type field struct {
	name, value span
	drop        bool
}

// Header is a parsed field section (a head's header fields, or a chunked
// body's trailers). It holds the section's raw bytes in one buffer and each
// field as offsets into it, both reused by the next message: once the
// buffer and the field slice have grown to the largest head seen, parsing
// and lookups allocate nothing. Its byte slices alias the buffer and are
// valid until the next parse.
type Header struct {
	buf    []byte
	fields []field
}

func (h *Header) reset() {
	h.buf = h.buf[:0]
	h.fields = h.fields[:0]
}

func (h *Header) bytes(s span) []byte { return h.buf[s.off:s.end:s.end] }

// Len returns the number of field lines, in the order received.
func (h *Header) Len() int { return len(h.fields) }

// Name returns the i-th field's name as received.
func (h *Header) Name(i int) []byte { return h.bytes(h.fields[i].name) }

// Value returns the i-th field's value, without leading and trailing
// whitespace.
func (h *Header) Value(i int) []byte { return h.bytes(h.fields[i].value) }

// Dropped reports whether the i-th field is marked to be left out when the
// head is written.
func (h *Header) Dropped(i int) bool { return h.fields[i].drop }

// Index returns the index of the first field at or after from whose name
// equals name, ASCII case-insensitively, or -1.
func (h *Header) Index(name string, from int) int {
	for i := from; i < len(h.fields); i++ {
		if equalFold(h.bytes(h.fields[i].name), name) {
			return i
		}
	}
	return -1
}

// Get returns the value of the first field named name and whether there is
// one.
func (h *Header) Get(name string) ([]byte, bool) {
	i := h.Index(name, 0)
	if i < 0 {
		return nil, false
	}
	return h.Value(i), true
}

// Count returns how many fields are named name.
func (h *Header) Count(name string) int {
	n := 0
	for i := h.Index(name, 0); i >= 0; i = h.Index(name, i+1) {
		n++
	}
	return n
}

// HasToken reports whether a field named name lists token among its
// comma-separated elements, ASCII case-insensitively (as net/http's
// httpguts.HeaderValuesContainsToken).
func (h *Header) HasToken(name, token string) bool {
	for i := h.Index(name, 0); i >= 0; i = h.Index(name, i+1) {
		if hasToken(h.Value(i), token) {
			return true
		}
	}
	return false
}

// Drop marks every field named name to be left out when the head is
// written and returns how many it marked.
func (h *Header) Drop(name string) int {
	n := 0
	for i := h.Index(name, 0); i >= 0; i = h.Index(name, i+1) {
		h.fields[i].drop = true
		n++
	}
	return n
}

// hopByHop are the fields that describe one connection (RFC 9110 §7.6.1),
// as httputil.ReverseProxy removes them.
var hopByHop = [...]string{
	"Connection",
	"Proxy-Connection", // non-standard but still sent by libcurl and rejected by e.g. google
	"Keep-Alive",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",      // canonicalized version of "TE"
	"Trailer", // not Trailers per URL above; https://www.rfc-editor.org/errata_search.php?eid=4522
	"Transfer-Encoding",
	"Upgrade",
}

// DropHopByHop marks the hop-by-hop fields to be left out: the fixed list
// httputil.ReverseProxy removes (Connection, Proxy-Connection, Keep-Alive,
// Proxy-Authenticate, Proxy-Authorization, TE, Trailer, Transfer-Encoding,
// Upgrade) and every field the Connection fields name. The forwarder writes
// the framing (Transfer-Encoding: chunked) and an upgrade's Connection and
// Upgrade fields itself.
func (h *Header) DropHopByHop() {
	for i := h.Index("Connection", 0); i >= 0; i = h.Index("Connection", i+1) {
		v := h.Value(i)
		for len(v) > 0 {
			var elem []byte
			elem, v = nextElement(v)
			if len(elem) == 0 {
				continue
			}
			for j := range h.fields {
				if equalFoldBytes(h.bytes(h.fields[j].name), elem) {
					h.fields[j].drop = true
				}
			}
		}
	}
	for _, name := range hopByHop {
		h.Drop(name)
	}
}

// ReservedPrefix starts the names of the router's own fields
// (X-Skipper-Function, X-Skipper-Caller, ...): no Connection field may
// name one, and a trailer section's are dropped (Body).
const ReservedPrefix = "X-Skipper-"

// checkConnection refuses a head whose Connection fields name a field
// that frames or routes it: Content-Length, Transfer-Encoding, Host or a
// field of ReservedPrefix. DropHopByHop would drop them, and the message
// then goes on without its length, its host or the router's own fields.
func (h *Header) checkConnection() error {
	for i := h.Index("Connection", 0); i >= 0; i = h.Index("Connection", i+1) {
		if BadConnection(h.Value(i)) {
			return wrapf(ErrBadConnection, "Connection", h.Value(i))
		}
	}
	return nil
}

// BadConnection reports whether a Connection field's value names a field
// that frames or routes the message (ErrBadConnection's rule). Forwarders
// that read heads with net/http apply the rule with it.
//
// "upgrade" is allowed with or without an Upgrade field: nothing frames
// or routes by it (an upgrade needs both, Request.Upgrade), and nginx's
// own WebSocket example (proxy_set_header Connection "upgrade") sends it
// on every request it proxies, where the Upgrade field is then absent.
func BadConnection(value []byte) bool {
	for v := value; len(v) > 0; {
		var elem []byte
		elem, v = nextElement(v)
		if equalFold(elem, "Content-Length") || equalFold(elem, "Transfer-Encoding") || equalFold(elem, "Host") || isReserved(elem) {
			return true
		}
	}
	return false
}

// isReserved reports a field name of ReservedPrefix.
func isReserved(name []byte) bool {
	return len(name) >= len(ReservedPrefix) && equalFold(name[:len(ReservedPrefix)], ReservedPrefix)
}

// dropReserved marks the fields named with ReservedPrefix dropped.
func (h *Header) dropReserved() {
	for i := range h.fields {
		if isReserved(h.bytes(h.fields[i].name)) {
			h.fields[i].drop = true
		}
	}
}

// AppendValues appends the values of the fields named name to dst,
// separated by sep, and returns it; dst is returned unchanged when there is
// none. A caller-owned dst makes it allocation-free once dst has grown.
func (h *Header) AppendValues(dst []byte, name, sep string) []byte {
	first := true
	for i := h.Index(name, 0); i >= 0; i = h.Index(name, i+1) {
		if !first {
			dst = append(dst, sep...)
		}
		first = false
		dst = append(dst, h.Value(i)...)
	}
	return dst
}

// readHead reads a whole head into h, its buffer emptied first: the start
// line, which parseLine parses as h.buf[:end] (its content, without the line
// ending), then the field lines up to and including the blank line. A
// request and a response head differ only in their start line. Like
// readLine it returns io.EOF, unwrapped, when br ends before the first byte.
func (h *Header) readHead(br *bufio.Reader, max int, parseLine func(end int) error) error {
	h.reset()
	start, err := h.readLine(br, max, true)
	if err != nil {
		return err
	}
	if err := parseLine(h.lineEnd(start)); err != nil {
		return err
	}
	return h.readFields(br, max)
}

// readLine appends the next line of br, up to and including its LF, to
// h.buf and returns its start offset. The section may grow to max bytes.
// A line cut short by EOF is io.ErrUnexpectedEOF, or io.EOF when
// eofOK and nothing at all was read.
func (h *Header) readLine(br *bufio.Reader, max int, eofOK bool) (int, error) {
	start := len(h.buf)
	for {
		chunk, err := br.ReadSlice('\n')
		if len(h.buf)+len(chunk) > max {
			return start, fmt.Errorf("%w: more than %d bytes", ErrHeadTooLarge, max)
		}
		h.buf = append(h.buf, chunk...)
		switch err {
		case nil:
			return start, nil
		case bufio.ErrBufferFull:
			continue
		case io.EOF:
			if eofOK && len(h.buf) == 0 {
				return start, io.EOF
			}
			return start, fmt.Errorf("read head: %w", io.ErrUnexpectedEOF)
		default:
			return start, fmt.Errorf("read head: %w", err)
		}
	}
}

// lineEnd returns the end of the content of the line at h.buf[start:],
// which ends in LF: before a CR LF or a bare LF (net/http's textproto
// accepts both in a head).
func (h *Header) lineEnd(start int) int {
	end := len(h.buf) - 1
	if end > start && h.buf[end-1] == '\r' {
		end--
	}
	return end
}

// readFields reads field lines up to and including the blank line that
// ends the section, into h. The first line read is the section's first
// field line (the start line, if any, is already in h.buf).
func (h *Header) readFields(br *bufio.Reader, max int) error {
	for {
		start, err := h.readLine(br, max, false)
		if err != nil {
			return err
		}
		end := h.lineEnd(start)
		if end == start {
			return nil // the blank line
		}
		if err := h.addField(start, end); err != nil {
			return err
		}
	}
}

// addField validates the field line h.buf[start:end] and records it. The
// rules are net/http's server (textproto.ReadMIMEHeader, then
// httpguts.ValidHeaderFieldName/Value): name a token, value of field-vchar,
// SP and HTAB after trimming SP and HTAB on both ends; bytes from 0x80 are
// allowed in values. Stricter: no obs-fold, no space in a name.
func (h *Header) addField(start, end int) error {
	line := h.buf[start:end]
	if line[0] == ' ' || line[0] == '\t' {
		return wrapf(ErrObsFold, "field line", line)
	}
	colon := -1
	for i, c := range line {
		if c == ':' {
			colon = i
			break
		}
		if !isTchar(c) {
			if c == ' ' {
				return wrapf(errNameSpace, "field line", line)
			}
			return malformed("field name", line)
		}
	}
	if colon <= 0 {
		return malformed("field line", line)
	}
	vs, ve := colon+1, len(line)
	for vs < ve && isOWS(line[vs]) {
		vs++
	}
	for ve > vs && isOWS(line[ve-1]) {
		ve--
	}
	for _, c := range line[vs:ve] {
		if !validValueByte[c] {
			return malformed("field value", line)
		}
	}
	h.fields = append(h.fields, field{
		name:  span{int32(start), int32(start + colon)},
		value: span{int32(start + vs), int32(start + ve)},
	})
	return nil
}

// nextElement splits the first element off a comma-separated list value,
// both trimmed of OWS.
func nextElement(v []byte) (elem, rest []byte) {
	i := 0
	for i < len(v) && v[i] != ',' {
		i++
	}
	elem = trimOWS(v[:i])
	if i < len(v) {
		i++
	}
	return elem, v[i:]
}

func hasToken(v []byte, token string) bool {
	for len(v) > 0 {
		var elem []byte
		elem, v = nextElement(v)
		if equalFold(elem, token) {
			return true
		}
	}
	return false
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && isOWS(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isOWS(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

func isOWS(c byte) bool { return c == ' ' || c == '\t' }

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// equalFold reports whether b equals s, ASCII case-insensitively.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		if lower(b[i]) != lower(s[i]) {
			return false
		}
	}
	return true
}

func equalFoldBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range len(a) {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}

// alnumAnd returns the byte set of ASCII letters and digits and the
// bytes of extra: the shape of both tchar and a host's bytes.
func alnumAnd(extra string) (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range extra {
		t[c] = true
	}
	return t
}

// tchar (RFC 9110 §5.6.2).
var tchar = alnumAnd("!#$%&'*+-.^_`|~")

func isTchar(c byte) bool { return tchar[c] }

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tchar[c] {
			return false
		}
	}
	return true
}

// validValueByte: field-vchar, SP, HTAB, obs-text (RFC 9110 §5.5).
var validValueByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c == '\t' || (c >= 0x20 && c != 0x7f)
	}
	return t
}()

// validHostByte is httpguts.ValidHostHeader's set.
var validHostByte = alnumAnd("!$%&()*+,-.:;=[']_~")
