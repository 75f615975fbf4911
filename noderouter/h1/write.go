package h1

import "bufio"

// Field is a header field to add when writing a head.
type Field struct {
	Name  string
	Value []byte
}

// writeFields writes the fields of h not marked dropped, each as
// "name: value" CRLF (so a bare LF received goes out as CRLF).
func (h *Header) writeFields(w *bufio.Writer) {
	for i := range h.fields {
		f := &h.fields[i]
		if f.drop {
			continue
		}
		w.Write(h.bytes(f.name))
		w.WriteString(": ")
		w.Write(h.bytes(f.value))
		w.WriteString("\r\n")
	}
}

func writeAdded(w *bufio.Writer, add []Field) error {
	for _, f := range add {
		w.WriteString(f.Name)
		w.WriteString(": ")
		w.Write(f.Value)
		w.WriteString("\r\n")
	}
	_, err := w.WriteString("\r\n")
	return err
}

// WriteRequest writes r's head to w as it goes upstream: the request line
// in origin-form with HTTP/1.1 (an absolute-form target's path and query,
// "/" when empty), the fields not marked dropped, the fields of add, and
// the blank line. For an absolute-form target the caller drops the Host
// field and adds Host: r.Host() (see Absolute). Nothing is flushed; it
// allocates nothing. The error is w's.
func WriteRequest(w *bufio.Writer, r *Request, add []Field) error {
	w.Write(r.Method())
	w.WriteByte(' ')
	path := r.bytes(r.path)
	if len(path) == 0 || (path[0] != '/' && string(path) != "*") {
		w.WriteByte('/')
	}
	w.Write(path)
	w.WriteString(" HTTP/1.1\r\n")
	r.writeFields(w)
	return writeAdded(w, add)
}

// WriteResponse writes r's head to w as it goes back to the caller: the
// status line with HTTP/1.1 and r's code and reason, the fields not marked
// dropped, the fields of add, and the blank line. Nothing is flushed; it
// allocates nothing. The error is w's.
func WriteResponse(w *bufio.Writer, r *Response, add []Field) error {
	w.WriteString("HTTP/1.1 ")
	w.WriteByte(byte('0' + r.status/100))
	w.WriteByte(byte('0' + r.status/10%10))
	w.WriteByte(byte('0' + r.status%10))
	w.WriteByte(' ')
	w.Write(r.Reason())
	w.WriteString("\r\n")
	r.writeFields(w)
	return writeAdded(w, add)
}
