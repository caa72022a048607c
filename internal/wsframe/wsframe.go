// Package wsframe reads WebSocket frames (RFC 6455) from bytes as they
// come, split anywhere: the one reader of frames that the realtime tap
// (what a server sends) and the session gate (what a client sends) share.
package wsframe

import "encoding/binary"

// Opcodes of RFC 6455.
const (
	OpContinuation = 0
	OpText         = 1
	OpBinary       = 2
	OpClose        = 8
)

// Frame is what a frame's header says.
type Frame struct {
	Fin, RSV1 bool
	// Reserved: RSV2 or RSV3 is set, which no extension defines.
	Reserved bool
	Op       byte
	Length   uint64 // of the payload
	Masked   bool
	Key      [4]byte // the masking key, when Masked
}

// Control reports a control frame (close, ping, pong).
func (f Frame) Control() bool { return f.Op >= 8 }

// Corrupt reports what RFC 6455 (and RFC 7692 for RSV1) tells an endpoint
// to fail the connection for, inMessage saying whether a fragmented
// message is open: past it, nothing can be trusted to be a frame.
func (f Frame) Corrupt(inMessage bool) bool {
	switch op := f.Op; {
	case f.Length>>63 != 0, // "the most significant bit MUST be 0"
		f.Reserved,
		op >= 3 && op <= 7, op > 10, // reserved opcodes
		f.Control() && (!f.Fin || f.Length > 125 || f.RSV1),
		op == OpContinuation && (!inMessage || f.RSV1), // a continuation of nothing; RSV1 is for first frames
		(op == OpText || op == OpBinary) && inMessage:  // a new message inside one
		return true
	}
	return false
}

// Header gathers a frame header from the bytes that come, however they
// are split. Its zero value is ready for a frame.
type Header struct {
	b [14]byte // 2 + 8 (length) + 4 (mask key) at most
	n int
}

// Read takes header bytes from p and returns the rest of p; once the
// header is whole, done is set with its frame, and the Header is ready
// for the next (Bytes are the whole header until then).
func (h *Header) Read(p []byte) (rest []byte, f Frame, done bool) {
	for h.n < 2 && len(p) > 0 {
		h.b[h.n] = p[0]
		h.n++
		p = p[1:]
	}
	if h.n < 2 {
		return p, f, false
	}
	need := h.size()
	c := copy(h.b[h.n:need], p)
	h.n += c
	if h.n < need {
		return p[c:], f, false
	}
	b0, b1 := h.b[0], h.b[1]
	f = Frame{Fin: b0&0x80 != 0, RSV1: b0&0x40 != 0, Reserved: b0&0x30 != 0, Op: b0 & 0x0f, Length: uint64(b1 & 0x7f), Masked: b1&0x80 != 0}
	switch f.Length {
	case 126:
		f.Length = uint64(binary.BigEndian.Uint16(h.b[2:4]))
	case 127:
		f.Length = binary.BigEndian.Uint64(h.b[2:10])
	}
	if f.Masked {
		copy(f.Key[:], h.b[need-4:need])
	}
	h.n = 0
	return p[c:], f, true
}

// Started reports whether some bytes of a header are gathered.
func (h *Header) Started() bool { return h.n > 0 }

// Bytes is the last whole header read, until the next Read.
func (h *Header) Bytes() []byte { return h.b[:h.size()] }

// size is the length of the header whose first two bytes are gathered.
func (h *Header) size() int {
	n := 2
	switch h.b[1] & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if h.b[1]&0x80 != 0 {
		n += 4
	}
	return n
}

// Reader follows a stream of frames. Its zero value is at the start of
// one.
type Reader struct {
	hdr       Header
	inPayload bool
	remaining uint64 // payload bytes of the frame not yet read
	masked    bool
	key       [4]byte
	pos       int // payload offset in the frame, modulo 4
}

// Step is what Reader.Next read.
type Step struct {
	// Begins: a header is whole, Frame's.
	Begins bool
	Frame  Frame
	// Chunk is payload bytes, as they came; Ends: the frame's last (with
	// Begins, for a frame without payload).
	Chunk []byte
	Ends  bool
}

// Next reads from b the rest of a header, or payload bytes of the frame
// begun, and returns the rest of b. The payload bytes are appended,
// unmasked, to *unmasked if it is not nil. Whoever reads a header it
// finds corrupt (Frame.Corrupt) stops calling Next.
func (r *Reader) Next(b []byte, unmasked *[]byte) (rest []byte, s Step) {
	if !r.inPayload {
		rest, s.Frame, s.Begins = r.hdr.Read(b)
		if s.Begins {
			r.inPayload, r.remaining = s.Frame.Length > 0, s.Frame.Length
			r.masked, r.key, r.pos = s.Frame.Masked, s.Frame.Key, 0
			s.Ends = s.Frame.Length == 0
		}
		return rest, s
	}
	n := int(min(uint64(len(b)), r.remaining))
	s.Chunk = b[:n]
	if unmasked != nil {
		start := len(*unmasked)
		*unmasked = append(*unmasked, s.Chunk...)
		if r.masked {
			u := (*unmasked)[start:]
			for i := range u {
				u[i] ^= r.key[(r.pos+i)&3]
			}
		}
	}
	r.pos = (r.pos + n) & 3
	r.remaining -= uint64(n)
	r.inPayload = r.remaining > 0
	s.Ends = !r.inPayload
	return b[n:], s
}

// Between reports whether the bytes read end a frame (or nothing yet).
func (r *Reader) Between() bool { return !r.inPayload && !r.hdr.Started() }

// Header is the last whole header read, until the next call of Next.
func (r *Reader) Header() []byte { return r.hdr.Bytes() }

// AppendHeader appends the header of an unmasked frame whose first byte
// is b0 (FIN, RSV and opcode) and whose payload is n bytes long, as a
// server sends it.
func AppendHeader(b []byte, b0 byte, n int) []byte {
	switch {
	case n <= 125:
		return append(b, b0, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, b0, 126), uint16(n))
	}
	return binary.BigEndian.AppendUint64(append(b, b0, 127), uint64(n))
}
