package usage

import "bytes"

// SSEEvent is one server-sent event, as an SSEScanner reports it.
type SSEEvent struct {
	// Data is the values of the event's "data" lines joined by "\n" (each
	// value without the one space that may follow "data:"). It is only
	// valid during the callback: copy what must outlive it.
	Data []byte
	// Name is the value of the event's last "event" line, or empty. Valid
	// only during the callback.
	Name []byte
	// Oversize is set, and Data is nil, when the event's bytes passed the
	// scanner's maximum: the event was skipped.
	Oversize bool
	// Start and End are offsets in the stream fed to the scanner: the event's
	// bytes are stream[Start:End], from the start of its first line (a
	// comment or any field) through the line end of the blank line that ended
	// it (End is the stream's length for an event that Flush ended). Events
	// do not overlap; what lies between them is extra blank lines and blocks
	// without data.
	Start, End int64
}

// SSEScanner splits a text/event-stream byte stream into events, following
// the WHATWG HTML "event stream interpretation": lines end in LF, CRLF or a
// lone CR, in any mix (a CRLF split between two Writes is still one line
// end); a blank line ends an event; a line starting with ':' is a comment;
// "field:value" drops one space after the colon, and a line without a colon
// is a field with an empty value; "data" values are joined by "\n"; "id" and
// "retry" lines are ignored; a UTF-8 BOM at the start is dropped. As the
// spec says, an event that has no data line is not reported, except an
// oversize one.
//
// Use it push-style:
//
//	s := NewSSEScanner(MaxEvent, func(ev SSEEvent) { ... })
//	s.Write(p) // any number of times, with any split of the stream
//	s.Flush()  // at the end of the stream
//
// onEvent is called synchronously from Write (or Flush), once per complete
// event, in stream order, as soon as its blank line has been fed (or, when
// that line's CR was the last byte of a Write, once the next byte tells
// whether an LF belongs to it: in the next non-empty Write); the slices
// it gets are only valid during the call. What it gets does not depend on how
// the stream is split into Writes.
//
// A filter that drops events (say, the chunk that stream_options.include_usage
// added, see IsUsageOnlyChunk) can hold back the bytes of the event in
// progress and, from onEvent, pass on or drop stream[ev.Start:ev.End]; bytes
// outside any event are passed on as they are. The scanner keeps no raw bytes
// itself.
//
// Memory is bounded by maxEvent: an event's bytes (its lines and line ends,
// its blank line excluded) are held only until it ends (scratch buffers of
// up to sseKeepBuffer are reused, bigger ones let go), and an event that
// grows past maxEvent is reported once, with Oversize set, when it ends; its
// bytes are not kept. Write does not retain p. Events without data, or whose
// data fits the scratch buffers already grown, cost no allocation.
//
// Flush is lenient where the spec is not: see Flush.
//
// Not safe for concurrent use.
type SSEScanner struct {
	onEvent  func(SSEEvent)
	maxEvent int

	// the event being read
	inEvent bool   // a line of it was read
	start   int64  // the offset of its first line
	data    []byte // data values so far, joined by "\n"
	name    []byte // its "event" value
	hasData bool
	size    int  // its bytes so far: lines and line ends
	over    bool // size passed maxEvent: its lines are not read

	off        int64  // the bytes fed so far
	line       []byte // the start of a line that the previous Write cut
	lineN      int    // its length (line is empty instead once the event is over)
	lineStart  int64  // its offset
	inLine     bool   // a line was cut
	cr         bool   // the last byte was a CR ending a line: an LF right after it is part of that line end
	pending    bool   // that line was the blank line ending an event, not reported yet
	pendingEnd int64  // that event's end so far
	started    bool   // a line was read (for the BOM)
}

// sseKeepBuffer is the most scratch memory an SSEScanner keeps between
// events; a bigger event's buffers are let go once it is read.
const sseKeepBuffer = 64 << 10

// NewSSEScanner returns a scanner that calls onEvent for each event and
// skips (reporting them as Oversize) events of more than maxEvent bytes.
func NewSSEScanner(maxEvent int, onEvent func(SSEEvent)) *SSEScanner {
	return &SSEScanner{onEvent: onEvent, maxEvent: maxEvent}
}

// Write feeds the next bytes of the stream.
func (s *SSEScanner) Write(p []byte) {
	off := s.off // the offset of p[0]
	s.off += int64(len(p))
	if s.cr && len(p) > 0 {
		// The previous Write ended in a CR: an LF now is part of its line end.
		s.cr = false
		if p[0] == '\n' {
			p = p[1:]
			off++
			if s.pending {
				s.pendingEnd++
			} else if s.inEvent {
				s.size++
				s.over = s.over || s.size > s.maxEvent
			}
		}
	}
	if s.pending && !s.cr {
		s.pending = false
		s.dispatch(s.pendingEnd)
	}
	for len(p) > 0 {
		// The line ends at the first CR or LF.
		end := bytes.IndexByte(p, '\n')
		if end < 0 {
			end = len(p)
		}
		if r := bytes.IndexByte(p[:end], '\r'); r >= 0 {
			end = r
		}
		if end == len(p) {
			// A line that the next Write goes on with.
			if !s.inLine {
				s.lineStart = off
			}
			s.appendLine(p)
			return
		}
		term := 1
		if p[end] == '\r' {
			if end+1 < len(p) {
				if p[end+1] == '\n' {
					term = 2
				}
			} else {
				s.cr = true // an LF at the start of the next Write ends nothing
			}
		}
		next := off + int64(end+term)
		if s.inLine {
			s.appendLine(p[:end])
			s.endCutLine(term, next)
		} else {
			s.lineEnded(p[:end], end, term, off, next)
		}
		off = next
		p = p[end+term:]
	}
}

// Flush ends the stream. An event that the stream ended in before its blank
// line, even in the middle of a line, is dispatched as if it had ended: the
// spec discards it, but a stream cut short still reported what it carried.
func (s *SSEScanner) Flush() {
	s.cr = false
	if s.pending {
		s.pending = false
		s.dispatch(s.pendingEnd)
	}
	if s.inLine {
		s.endCutLine(0, s.off)
	}
	s.dispatch(s.off)
}

// appendLine keeps the start of a line cut by the end of a Write.
func (s *SSEScanner) appendLine(b []byte) {
	s.inLine = true
	s.lineN += len(b)
	if s.over {
		return
	}
	if s.size+s.lineN > s.maxEvent {
		s.over = true
		s.line = s.line[:0]
		return
	}
	s.line = append(s.line, b...)
}

// endCutLine reads the line that appendLine kept; next is the offset after
// its line end.
func (s *SSEScanner) endCutLine(term int, next int64) {
	s.lineEnded(s.line, s.lineN, term, s.lineStart, next)
	s.line = s.line[:0]
	if cap(s.line) > sseKeepBuffer {
		s.line = nil
	}
	s.lineN = 0
	s.inLine = false
}

// lineEnded reads one complete line of n bytes (line holds them unless the
// event is over its size) with a line end of term bytes; the line starts at
// offset start and its line end ends before offset next.
func (s *SSEScanner) lineEnded(line []byte, n, term int, start, next int64) {
	if !s.started {
		s.started = true
		if bytes.HasPrefix(line, []byte("\xef\xbb\xbf")) {
			line = line[3:]
			n -= 3
		}
	}
	if n == 0 {
		if s.cr {
			// A blank line whose CR ended the Write: its event is reported
			// when the next byte tells whether an LF belongs to its end.
			s.pending, s.pendingEnd = true, next
			return
		}
		s.dispatch(next)
		return
	}
	if !s.inEvent {
		s.inEvent = true
		s.start = start
	}
	s.size += n + term
	if s.over || s.size > s.maxEvent {
		s.over = true
		return
	}
	if line[0] == ':' {
		return
	}
	field, value := line, []byte(nil)
	if c := bytes.IndexByte(line, ':'); c >= 0 {
		field, value = line[:c], line[c+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
		if s.hasData {
			s.data = append(s.data, '\n')
		}
		s.data = append(s.data, value...)
		s.hasData = true
	case "event":
		s.name = append(s.name[:0], value...)
	}
}

// dispatch reports the event read so far, if any, as ending before offset
// end, and starts the next.
func (s *SSEScanner) dispatch(end int64) {
	switch {
	case s.over:
		s.onEvent(SSEEvent{Name: s.name, Oversize: true, Start: s.start, End: end})
	case s.hasData:
		s.onEvent(SSEEvent{Data: s.data, Name: s.name, Start: s.start, End: end})
	}
	s.inEvent = false
	s.data = s.data[:0]
	if cap(s.data) > sseKeepBuffer {
		s.data = nil // one big event does not pin its memory for the rest of the stream
	}
	s.name = s.name[:0]
	s.hasData = false
	s.size = 0
	s.over = false
}
