package ratelimit

import "bytes"

// --- the JSON scanner ---

// usageRole is what an open container that the scanner follows is.
type usageRole uint8

const (
	usageRoleNone       usageRole = iota // nothing in it matters: it is skipped
	usageRoleRoot                        // a document: its usage, usageMetadata, message and response keys matter
	usageRoleWrapper                     // a root's "message" or "response": its usage key matters
	usageRoleUsage                       // a usage object: its numeric members are tallied, its iterations key followed
	usageRoleList                        // a top-level array: its objects are documents
	usageRoleIterations                  // a usage object's "iterations" array: its objects are iterations
	usageRoleIteration                   // one of them: its numeric members are summed
)

// isList reports whether a followed container is an array.
func (r usageRole) isList() bool { return r == usageRoleList || r == usageRoleIterations }

// elem is what a followed array's elements are.
func (r usageRole) elem() usageRole {
	if r == usageRoleIterations {
		return usageRoleIteration
	}
	return usageRoleRoot
}

// usageJSONState is where the JSON scanner is.
type usageJSONState uint8

const (
	ujValue     usageJSONState = iota // before a value (at the top level, after ':' or in a list)
	ujKeyOrEnd                        // in a followed object, before a key or '}'
	ujKey                             // in a key
	ujKeyEsc                          // after a backslash in a key
	ujColon                           // after a key, before ':'
	ujAfter                           // after a value in a followed container, before ',' or its end
	ujString                          // in a string that is skipped
	ujStringEsc                       // after a backslash in a skipped string
	ujSkip                            // in containers that are skipped
	ujScalar                          // in a number or a literal
	ujDead                            // malformed: nothing more is read until reset
)

// usageJSONScanner streams through JSON text and tallies the counts of its
// usage objects, holding none of the text: its state is the few containers it
// follows (at most six deep: list, document, wrapper, usage, iterations,
// iteration), a depth count of the containers it skips, and the current key
// or number (at most 32 bytes each). It tells the tally where usage objects,
// iterations arrays and iterations open and close, since what a report
// replaces depends on them. Skipped strings and containers are crossed with
// bytes.IndexByte and a lookup table. Malformed JSON stops the scan (what was
// tallied stays). Keys are compared as written: an escaped key never matches.
type usageJSONScanner struct {
	tally *usageTally

	state usageJSONState
	stack [6]usageRole // the containers followed, outermost first
	n     int          // len(stack) in use
	skip  int          // depth of skipped containers (ujSkip and strings in them)

	key  [32]byte
	keyN int // bytes in key; -1 once it cannot match (too long, escaped)

	valRole  usageRole  // what the value about to start is, if a container
	valField usageField // which count the value about to start is, if a number

	num  [32]byte
	numN int // bytes in num; -1 once it is too long to be a count
}

// reset readies the scanner for a new text.
func (s *usageJSONScanner) reset() {
	s.state = ujValue
	s.n = 0
	s.skip = 0
	s.valRole = usageRoleRoot
	s.valField = usageFieldNone
}

// usageSkipTable marks the bytes that matter inside skipped containers.
var usageSkipTable = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

// usageScalarTable marks the bytes of numbers and literals.
var usageScalarTable = func() (t [256]bool) {
	for _, c := range []byte("0123456789+-.eEtrufalsn") {
		t[c] = true
	}
	return t
}()

func usageIsSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func (s *usageJSONScanner) top() usageRole {
	if s.n == 0 {
		return usageRoleNone
	}
	return s.stack[s.n-1]
}

// valueDone moves on after a value at a followed level.
func (s *usageJSONScanner) valueDone() {
	if s.n == 0 {
		s.state = ujValue
		s.valRole = usageRoleRoot
		s.valField = usageFieldNone
		return
	}
	s.state = ujAfter
}

// keyDone decides what the coming value is, from the key and its object.
func (s *usageJSONScanner) keyDone() {
	s.valRole, s.valField = usageRoleNone, usageFieldNone
	if s.keyN <= 0 {
		return
	}
	k := s.key[:s.keyN]
	switch s.top() {
	case usageRoleRoot:
		switch string(k) {
		case "usage", "usageMetadata":
			s.valRole = usageRoleUsage
		case "message", "response":
			s.valRole = usageRoleWrapper
		}
	case usageRoleWrapper:
		switch string(k) {
		case "usage", "usageMetadata":
			s.valRole = usageRoleUsage
		}
	case usageRoleUsage:
		if string(k) == "iterations" {
			s.valRole = usageRoleIterations
		} else {
			s.valField = usageFieldOf(k)
		}
	case usageRoleIteration:
		s.valField = usageFieldOf(k)
	}
}

// push opens a followed container, and tells the tally where usage objects
// and iterations begin.
func (s *usageJSONScanner) push(r usageRole) {
	if s.n == len(s.stack) {
		s.state = ujDead // cannot happen: roles nest at most six deep
		return
	}
	s.stack[s.n] = r
	s.n++
	switch r {
	case usageRoleUsage:
		s.tally.openUsage()
	case usageRoleIterations:
		s.tally.openIterations()
	case usageRoleIteration:
		s.tally.openIteration()
	}
}

// pop closes the innermost followed container, and tells the tally where
// usage objects and iterations end.
func (s *usageJSONScanner) pop() {
	s.n--
	switch s.stack[s.n] {
	case usageRoleUsage:
		s.tally.closeUsage()
	case usageRoleIterations:
		s.tally.closeIterations()
	case usageRoleIteration:
		s.tally.closeIteration()
	}
	s.valueDone()
}

// write scans the next bytes of the text.
func (s *usageJSONScanner) write(p []byte) {
	i := 0
	for i < len(p) {
		switch s.state {
		case ujSkip:
			i = s.skipContainers(p, i)
		case ujString:
			i = s.skipString(p, i)
		case ujStringEsc:
			i++
			s.state = ujString
		case ujValue:
			c := p[i]
			switch {
			case usageIsSpace(c):
				i++
			case c == '{':
				i++
				switch s.valRole {
				case usageRoleRoot, usageRoleWrapper, usageRoleUsage, usageRoleIteration:
					s.state = ujKeyOrEnd
					s.push(s.valRole)
				default:
					s.skip = 1
					s.state = ujSkip
				}
			case c == '[':
				i++
				switch {
				case s.n == 0:
					s.push(usageRoleList)
					s.valRole, s.valField = usageRoleRoot, usageFieldNone
				case s.valRole == usageRoleIterations:
					s.push(usageRoleIterations)
					s.valRole, s.valField = usageRoleIteration, usageFieldNone
				default:
					s.skip = 1
					s.state = ujSkip
				}
			case c == ']' && s.top().isList(): // [] or a trailing comma
				i++
				s.pop()
			case c == '"':
				i++
				s.state = ujString
			case usageScalarTable[c]:
				s.numN = 0
				s.state = ujScalar
			default:
				s.state = ujDead
			}
		case ujScalar:
			for i < len(p) && usageScalarTable[p[i]] {
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
				if s.valField != usageFieldNone && s.numN > 0 {
					if v, ok := parseUsageCount(s.num[:s.numN]); ok {
						if s.top() == usageRoleIteration {
							s.tally.recordIteration(s.valField, v)
						} else {
							s.tally.record(s.valField, v)
						}
					}
				}
				s.valueDone()
			}
		case ujKeyOrEnd:
			c := p[i]
			switch {
			case usageIsSpace(c):
				i++
			case c == '"':
				i++
				s.keyN = 0
				s.state = ujKey
			case c == '}':
				i++
				s.pop()
			default:
				s.state = ujDead
			}
		case ujKey:
			for i < len(p) {
				c := p[i]
				i++
				if c == '"' {
					s.state = ujColon
					break
				}
				if c == '\\' {
					s.keyN = -1
					s.state = ujKeyEsc
					break
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
		case ujKeyEsc:
			i++
			s.state = ujKey
		case ujColon:
			c := p[i]
			switch {
			case usageIsSpace(c):
				i++
			case c == ':':
				i++
				s.keyDone()
				s.state = ujValue
			default:
				s.state = ujDead
			}
		case ujAfter:
			c := p[i]
			top := s.top()
			switch {
			case usageIsSpace(c):
				i++
			case c == ',':
				i++
				if top.isList() {
					s.valRole, s.valField = top.elem(), usageFieldNone
					s.state = ujValue
				} else {
					s.state = ujKeyOrEnd
				}
			case c == '}' && !top.isList(), c == ']' && top.isList():
				i++
				s.pop()
			default:
				s.state = ujDead
			}
		default: // ujDead
			return
		}
	}
}

// skipContainers crosses skipped containers from p[i] and returns where it
// stopped: at the end of p, after a '"' (in ujString), or after the closing
// bracket of the outermost skipped container.
func (s *usageJSONScanner) skipContainers(p []byte, i int) int {
	for ; i < len(p); i++ {
		c := p[i]
		if !usageSkipTable[c] {
			continue
		}
		switch c {
		case '"':
			s.state = ujString
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

// skipString crosses a skipped string from p[i] (after its opening quote)
// and returns where it stopped: at the end of p, or after the closing quote.
// Each byte is looked at a bounded number of times however many escapes the
// string has.
func (s *usageJSONScanner) skipString(p []byte, i int) int {
	q := -1 // the next '"' at or after i, or len(p) if none
	for {
		if q < i {
			if r := bytes.IndexByte(p[i:], '"'); r >= 0 {
				q = i + r
			} else {
				q = len(p)
			}
		}
		b := bytes.IndexByte(p[i:q], '\\')
		if b < 0 {
			if q == len(p) {
				return q // the string goes on in the next bytes
			}
			if s.skip > 0 {
				s.state = ujSkip
			} else {
				s.valueDone()
			}
			return q + 1
		}
		i += b + 2 // the backslash and the byte it escapes
		if i > len(p) {
			s.state = ujStringEsc
			return len(p)
		}
	}
}
