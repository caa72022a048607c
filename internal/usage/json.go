package usage

import "bytes"

// --- the JSON scanner ---

// role is what an open container that the scanner follows is.
type role uint8

const (
	roleNone       role = iota // nothing in it matters: it is skipped
	roleRoot                   // a document: its usage, usageMetadata, amazon-bedrock-invocationMetrics, message, response, delta, type, choices and candidates keys matter
	roleWrapper                // a root's "message", "response" or "delta": its usage key matters
	roleUsage                  // a usage object: its numeric members are tallied, its iterations and details keys followed
	roleDetails                // one of a usage object's details objects: its numeric members are tallied as parts
	roleList                   // a top-level array: its objects are documents
	roleIterations             // a usage object's "iterations" array: its objects are iterations
	roleIteration              // one of them: its numeric members are summed
	roleChoices                // a root's "choices" or "candidates" array: its objects are choices
	roleChoice                 // one of them: its finish reason matters
)

// isList reports whether a followed container is an array.
func (r role) isList() bool { return r == roleList || r == roleIterations || r == roleChoices }

// elem is what a followed array's elements are.
func (r role) elem() role {
	switch r {
	case roleIterations:
		return roleIteration
	case roleChoices:
		return roleChoice
	}
	return roleRoot
}

// jsonState is where the JSON scanner is.
type jsonState uint8

const (
	jsonValue     jsonState = iota // before a value (at the top level, after ':' or in a list)
	jsonKeyOrEnd                   // in a followed object, before a key or '}'
	jsonKey                        // in a key
	jsonKeyEsc                     // after a backslash in a key
	jsonType                       // in a document's "type" string, which is read as a key is
	jsonColon                      // after a key, before ':'
	jsonAfter                      // after a value in a followed container, before ',' or its end
	jsonString                     // in a string that is skipped
	jsonStringEsc                  // after a backslash in a skipped string
	jsonSkip                       // in containers that are skipped
	jsonScalar                     // in a number or a literal
	jsonDead                       // malformed: nothing more is read until reset
)

// jsonScanner streams through JSON text and tallies the counts of its
// usage objects, holding none of the text: its state is the few containers it
// follows (at most six deep: list, document, wrapper, usage, iterations,
// iteration; or list, document, wrapper, usage, details), a depth count of
// the containers it skips, and the current key or number (at most 32 bytes
// each). It tells the tally where documents, usage objects, iterations
// arrays and iterations open and close, since what a report replaces
// depends on them, and whether a document is its response's final report
// (terminal). Skipped strings and containers are crossed with
// bytes.IndexByte and a lookup table. Malformed JSON stops the scan (what was
// tallied stays). Keys are compared as written: an escaped key never matches.
type jsonScanner struct {
	tally *tally

	state jsonState
	stack [6]role // the containers followed, outermost first
	whole bool    // the text is a whole body, not an event's data: its top-level value read whole is final
	n     int     // len(stack) in use
	skip  int     // depth of skipped containers (jsonSkip and strings in them)

	key  [32]byte
	keyN int // bytes in key; -1 once it cannot match (too long, escaped)

	valRole    role    // what the value about to start is, if a container
	valField   field   // which count the value about to start is, if a number
	valDetails details // which details object the value about to start is, if roleDetails
	valMark    mark    // what the value about to start marks of its document, if a string
	details    details // the details object open, if any (they do not nest)

	doc      documentMarks // of the document being read
	reported bool          // the document being read reported a count
	final    bool          // the latest count was a final report's, read whole (final.go)

	num  [32]byte
	numN int // bytes in num; -1 once it is too long to be a count
}

// reset readies the scanner for a new text.
func (s *jsonScanner) reset() {
	s.state = jsonValue
	s.n = 0
	s.skip = 0
	s.valRole = roleRoot
	s.valField = fieldNone
	s.valMark = markNone
}

// skipTable marks the bytes that matter inside skipped containers.
var skipTable = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

// scalarTable marks the bytes of numbers and literals.
var scalarTable = func() (t [256]bool) {
	for _, c := range []byte("0123456789+-.eEtrufalsn") {
		t[c] = true
	}
	return t
}()

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

// skipSpace returns the index of the first byte at or after b[i] that is not
// JSON whitespace, or len(b).
func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

func (s *jsonScanner) top() role {
	if s.n == 0 {
		return roleNone
	}
	return s.stack[s.n-1]
}

// valueDone moves on after a value at a followed level.
func (s *jsonScanner) valueDone() {
	s.valMark = markNone
	if s.n == 0 {
		s.state = jsonValue
		s.valRole = roleRoot
		s.valField = fieldNone
		return
	}
	s.state = jsonAfter
}

// keyDone decides what the coming value is, from the key and its object.
func (s *jsonScanner) keyDone() {
	s.valRole, s.valField, s.valMark = roleNone, fieldNone, markNone
	if s.keyN <= 0 {
		return
	}
	k := s.key[:s.keyN]
	switch s.top() {
	case roleRoot:
		switch string(k) {
		case "usage", "usageMetadata", "amazon-bedrock-invocationMetrics":
			s.valRole = roleUsage
		case "message", "response", "delta": // delta: Cohere's message-end
			s.valRole = roleWrapper
		case "choices", "candidates":
			s.valRole = roleChoices
		case "type":
			s.valMark = markType
		}
	case roleChoice:
		switch string(k) {
		case "finish_reason", "finishReason":
			s.valMark = markFinished
		}
	case roleWrapper:
		switch string(k) {
		case "usage", "usageMetadata":
			s.valRole = roleUsage
		}
	case roleUsage:
		d := detailsOf(k)
		switch {
		case string(k) == "iterations":
			s.valRole = roleIterations
		case d != detailsNone:
			s.valRole, s.valDetails = roleDetails, d
		default:
			s.valField = fieldOf(k)
		}
	case roleDetails:
		s.valField = s.details.field(k)
	case roleIteration:
		s.valField = fieldOf(k)
	}
}

// push opens a followed container, and tells the tally where usage objects
// and iterations begin.
func (s *jsonScanner) push(r role) {
	if s.n == len(s.stack) {
		s.state = jsonDead // cannot happen: roles nest at most six deep
		return
	}
	if r == roleUsage && s.top() == roleRoot {
		s.doc |= markedUsage
	}
	s.stack[s.n] = r
	s.n++
	switch r {
	case roleRoot:
		s.doc, s.reported = 0, false
	case roleChoice:
		s.doc |= markedChoices
	case roleUsage:
		s.tally.openUsage()
	case roleDetails:
		s.details = s.valDetails
	case roleIterations:
		s.tally.openIterations()
	case roleIteration:
		s.tally.openIteration()
	}
}

// pop closes the innermost followed container, and tells the tally where
// usage objects and iterations end.
func (s *jsonScanner) pop() {
	s.n--
	switch s.stack[s.n] {
	case roleRoot:
		s.final = s.final || s.reported && s.doc.terminal()
	case roleUsage:
		s.tally.closeUsage()
	case roleIterations:
		s.tally.closeIterations()
	case roleIteration:
		s.tally.closeIteration()
	}
	if s.n == 0 && s.whole {
		s.final = true
	}
	s.valueDone()
}

// write scans the next bytes of the text.
func (s *jsonScanner) write(p []byte) {
	i := 0
	for i < len(p) {
		switch s.state {
		case jsonSkip:
			i = s.skipContainers(p, i)
		case jsonString:
			var closed, escaped bool
			i, closed, escaped = skipString(p, i)
			switch {
			case escaped:
				s.state = jsonStringEsc
			case !closed: // the string goes on in the next bytes
			case s.skip > 0:
				s.state = jsonSkip
			default:
				s.valueDone()
			}
		case jsonStringEsc:
			i++
			s.state = jsonString
		case jsonValue:
			c := p[i]
			switch {
			case isSpace(c):
				i++
			case c == '{':
				i++
				switch s.valRole {
				case roleRoot, roleWrapper, roleUsage, roleDetails, roleIteration, roleChoice:
					s.state = jsonKeyOrEnd
					s.push(s.valRole)
				default:
					s.skip = 1
					s.state = jsonSkip
				}
			case c == '[':
				i++
				switch {
				case s.n == 0:
					s.push(roleList)
					s.valRole, s.valField = roleRoot, fieldNone
				case s.valRole == roleIterations, s.valRole == roleChoices:
					s.push(s.valRole)
					s.valRole, s.valField = s.valRole.elem(), fieldNone
				default:
					s.skip = 1
					s.state = jsonSkip
				}
			case c == ']' && s.top().isList(): // [] or a trailing comma
				i++
				s.pop()
			case c == '"' && s.valMark == markType:
				i++
				s.keyN = 0
				s.state = jsonType
			case c == '"':
				i++
				if s.valMark == markFinished {
					s.doc |= markedFinished
				}
				s.state = jsonString
			case scalarTable[c]:
				s.numN = 0
				s.state = jsonScalar
			default:
				s.state = jsonDead
			}
		case jsonScalar:
			for i < len(p) && scalarTable[p[i]] {
				if s.numN >= 0 {
					if s.numN < len(s.num) {
						s.num[s.numN] = p[i]
						s.numN++
					} else {
						s.numN = -1
					}
				}
				i++
			}
			if i < len(p) {
				// The scalar ended at p[i], which is read next.
				if s.valField != fieldNone && s.numN > 0 {
					if v, ok := parseCount(s.num[:s.numN]); ok {
						if s.top() == roleIteration {
							s.tally.recordIteration(s.valField, v)
						} else {
							s.tally.record(s.valField, v)
						}
						// Until its document closes as a final report, the
						// response's report is not final.
						s.final, s.reported = false, true
					}
				}
				s.valueDone()
			}
		case jsonKeyOrEnd:
			c := p[i]
			switch {
			case isSpace(c):
				i++
			case c == '"':
				i++
				s.keyN = 0
				s.state = jsonKey
			case c == '}':
				i++
				s.pop()
			default:
				s.state = jsonDead
			}
		case jsonKey:
			i = s.readKey(p, i)
		case jsonKeyEsc:
			i++
			s.state = jsonKey
		case jsonType:
			i = s.readKey(p, i)
			switch s.state {
			case jsonColon: // the string closed
				if s.keyN > 0 && isTerminalType(s.key[:s.keyN]) {
					s.doc |= markedTerminalType
				}
				s.valueDone()
			case jsonKeyEsc: // escaped: it names no type
				s.state = jsonStringEsc
			}
		case jsonColon:
			c := p[i]
			switch {
			case isSpace(c):
				i++
			case c == ':':
				i++
				s.keyDone()
				s.state = jsonValue
			default:
				s.state = jsonDead
			}
		case jsonAfter:
			c := p[i]
			top := s.top()
			switch {
			case isSpace(c):
				i++
			case c == ',':
				i++
				if top.isList() {
					s.valRole, s.valField = top.elem(), fieldNone
					s.state = jsonValue
				} else {
					s.state = jsonKeyOrEnd
				}
			case c == '}' && !top.isList(), c == ']' && top.isList():
				i++
				s.pop()
			default:
				s.state = jsonDead
			}
		default: // jsonDead
			return
		}
	}
}

// readKey reads a key's bytes from p[i] into s.key, and returns where it
// stopped: at the end of p, or after the closing quote (then in
// jsonColon) or a backslash (then in jsonKeyEsc, the key unmatchable).
func (s *jsonScanner) readKey(p []byte, i int) int {
	for i < len(p) {
		c := p[i]
		i++
		if c == '"' {
			s.state = jsonColon
			return i
		}
		if c == '\\' {
			s.keyN = -1
			s.state = jsonKeyEsc
			return i
		}
		if s.keyN >= 0 {
			if s.keyN < len(s.key) {
				s.key[s.keyN] = c
				s.keyN++
			} else {
				s.keyN = -1
			}
		}
	}
	return i
}

// skipContainers crosses skipped containers from p[i] and returns where it
// stopped: at the end of p, after a '"' (in jsonString), or after the closing
// bracket of the outermost skipped container.
func (s *jsonScanner) skipContainers(p []byte, i int) int {
	for ; i < len(p); i++ {
		c := p[i]
		if !skipTable[c] {
			continue
		}
		switch c {
		case '"':
			s.state = jsonString
			return i + 1
		case '{', '[':
			s.skip++
		default:
			s.skip--
			if s.skip == 0 {
				s.valueDone()
				return i + 1
			}
		}
	}
	return i
}

// skipString crosses the contents of a JSON string from b[i] (just after its
// opening quote, or just after an escape) and returns where it stopped: just
// after the closing quote, with closed set; or len(b) when the string goes on
// past b, with escaped set if b ended in a backslash (the byte after b is
// escaped). Each byte is looked at a bounded number of times however many
// escapes the string has.
func skipString(b []byte, i int) (end int, closed, escaped bool) {
	q := -1 // the next '"' at or after i, or len(b) if none
	for {
		if q < i {
			if r := bytes.IndexByte(b[i:], '"'); r >= 0 {
				q = i + r
			} else {
				q = len(b)
			}
		}
		bs := bytes.IndexByte(b[i:q], '\\')
		if bs < 0 {
			if q == len(b) {
				return q, false, false
			}
			return q + 1, true, false
		}
		i += bs + 2 // the backslash and the byte it escapes
		if i > len(b) {
			return len(b), false, true
		}
	}
}
