package tokenest

import (
	"encoding/binary"
	"math/bits"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth is the deepest nesting read, as in encoding/json: more is bad JSON.
const maxDepth = 10000

// parser reads one JSON text in one pass, holding none of it: the walkers of
// tokenest.go descend into the members they count and skip the rest, and
// every byte, counted or skipped, is checked to be JSON, so that the body is
// accepted exactly when json.Valid accepts it. After a fault the cursor is at
// the end and every read fails at once, so no walker loops on it.
type parser struct {
	b     []byte
	i     int
	depth int // containers open, whoever opened them
	bad   bool
	objs  [maxDepth/64 + 1]uint64 // for skip: which open containers are objects
}

func (p *parser) fail() {
	p.bad = true
	p.i = len(p.b)
}

// ws skips whitespace and reports whether a byte follows.
func (p *parser) ws() bool {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return true
		}
	}
	return false
}

// peek is the first byte of the value at the cursor, 0 at the end.
func (p *parser) peek() byte {
	if !p.ws() {
		return 0
	}
	return p.b[p.i]
}

// push opens a container at the cursor.
func (p *parser) push(obj bool) bool {
	p.i++
	p.depth++
	if p.depth > maxDepth {
		p.fail()
		return false
	}
	w, bit := p.depth/64, uint64(1)<<(p.depth%64)
	if obj {
		p.objs[w] |= bit
	} else {
		p.objs[w] &^= bit
	}
	return true
}

// enter opens the container at the cursor if it is one with this opening
// ('{' or '['); if the value is anything else it skips it and reports false.
func (p *parser) enter(open byte) bool {
	if p.peek() == open {
		return p.push(open == '{')
	}
	p.skip()
	return false
}

// more reads up to the next element of the container entered, consuming
// the comma before it, or reads the container's end and reports false.
// first is true before the first element.
func (p *parser) more(end byte, first *bool) bool {
	if !p.ws() {
		p.fail()
		return false
	}
	switch c := p.b[p.i]; {
	case c == end:
		p.i++
		p.depth--
		return false
	case *first:
		*first = false
		return true
	case c == ',':
		p.i++
		return true
	}
	p.fail()
	return false
}

// nextMember reads up to the next member's value of the object entered, its
// key in k (see short), or reads the object's end and reports false.
func (p *parser) nextMember(first *bool, k *word) bool {
	if !p.more('}', first) {
		return false
	}
	*k = p.short()
	if !p.ws() || p.b[p.i] != ':' {
		p.fail()
		return false
	}
	p.i++
	return true
}

// each reads the array at the cursor, calling elem at each element, which
// must read it; any other value is skipped.
func (p *parser) each(elem func()) {
	if !p.enter('[') {
		return
	}
	for first := true; p.more(']', &first); {
		elem()
	}
}

// members reads the object at the cursor, calling member with each key at
// its value, which member must read; any other value is skipped.
func (p *parser) members(member func(key word)) {
	if !p.enter('{') {
		return
	}
	var k word
	for first := true; p.nextMember(&first, &k); {
		member(k)
	}
}

// plain marks the bytes a string holds as themselves.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// plainRun is how many bytes from the start of b are plain, read eight at a
// time (the strings worth the trouble are long base64 data), and whether
// they are all ASCII (false may mean only that a byte just past them is not).
func plainRun(b []byte) (n int, ascii bool) {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	var seen uint64 // the bits of every byte read
	for ; n+8 <= len(b); n += 8 {
		w := binary.LittleEndian.Uint64(b[n:])
		seen |= w
		q := w ^ (ones * '"')
		s := w ^ (ones * '\\')
		// A byte of x is marked when it was below 0x20, a quote or a
		// backslash; the first one marked is exact.
		x := ((w - ones*0x20) | (q - ones) | (s - ones)) &^ w & highs
		if x != 0 {
			return n + bits.TrailingZeros64(x)/8, seen&highs == 0
		}
	}
	for n < len(b) && plain[b[n]] {
		seen |= uint64(b[n])
		n++
	}
	return n, seen&highs == 0
}

// str reads the string at the cursor. It returns what is between the quotes
// as written, whether that has escapes, and, when count is set, how many
// characters the string decodes to as encoding/json decodes it: an escape
// is one, a surrogate pair of escapes is one, a byte of invalid UTF-8 is one.
func (p *parser) str(count bool) (n int64, raw []byte, esc bool) {
	if p.peek() != '"' {
		p.fail()
		return 0, nil, false
	}
	start := p.i + 1
	i := start
	high := false // the last character was an escaped high surrogate
	for {
		run, ascii := plainRun(p.b[i:])
		j := i + run
		if count && run > 0 {
			if ascii {
				n += int64(run)
			} else {
				n += int64(utf8.RuneCount(p.b[i:j]))
			}
			high = false
		}
		if j >= len(p.b) {
			// Cut short: what was read still counts in a prefix (OfPrefix).
			p.fail()
			return n, nil, false
		}
		switch p.b[j] {
		case '"':
			p.i = j + 1
			return n, p.b[start:j], esc
		case '\\':
			esc = true
			r, size := escape(p.b[j:])
			if size == 0 {
				p.fail()
				return n, nil, false
			}
			if !high || r < 0xDC00 || r > 0xDFFF {
				n++
			}
			high = size == 6 && r >= 0xD800 && r < 0xDC00
			i = j + size
		default: // a control character
			p.fail()
			return 0, nil, false
		}
	}
}

// escape reads the escape at the start of b (b[0] is a backslash): what it
// stands for and its length, 0 if it is not one.
func escape(b []byte) (rune, int) {
	if len(b) < 2 {
		return 0, 0
	}
	switch b[1] {
	case '"', '\\', '/':
		return rune(b[1]), 2
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		if len(b) < 6 {
			return 0, 0
		}
		var r rune
		for _, c := range b[2:6] {
			switch {
			case '0' <= c && c <= '9':
				c -= '0'
			case 'a' <= c && c <= 'f':
				c -= 'a' - 10
			case 'A' <= c && c <= 'F':
				c -= 'A' - 10
			default:
				return 0, 0
			}
			r = r<<4 | rune(c)
		}
		return r, 6
	}
	return 0, 0
}

// word is a string that is compared, not counted (a key, a type),
// unescaped, in UTF-8. Past its length, or with a surrogate escaped, it is
// empty: no name compared is either.
type word struct {
	b [32]byte
	n uint8
}

// short reads a string into a word.
func (p *parser) short() (w word) {
	_, raw, esc := p.str(false)
	if !esc {
		if len(raw) <= len(w.b) {
			w.n = uint8(copy(w.b[:], raw))
		}
		return w
	}
	for i := 0; i < len(raw); {
		c := raw[i]
		size := 1
		if c == '\\' {
			var r rune
			r, size = escape(raw[i:])
			if r >= utf8.RuneSelf {
				if utf16.IsSurrogate(r) || int(w.n)+utf8.RuneLen(r) > len(w.b) {
					return word{}
				}
				w.n += uint8(utf8.EncodeRune(w.b[w.n:], r))
				i += size
				continue
			}
			c = byte(r)
		}
		if int(w.n) == len(w.b) {
			return word{}
		}
		w.b[w.n] = c
		w.n++
		i += size
	}
	return w
}

// name reads a value that is compared if it is a string (a type): see
// word. Any other value is skipped and is empty.
func (p *parser) name() word {
	if p.peek() != '"' {
		p.skip()
		return word{}
	}
	return p.short()
}

func (w *word) bytes() []byte { return w.b[:w.n] }

// text reads a value that counts as text if it is a string: its characters;
// any other value is skipped and counts nothing.
func (p *parser) text() int64 {
	if p.peek() != '"' {
		p.skip()
		return 0
	}
	n, _, _ := p.str(true)
	return n
}

// number reads the number at the cursor and returns it as written.
func (p *parser) number() []byte {
	b, start := p.b, p.i
	i := start
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i)
	default:
		p.fail()
		return nil
	}
	if i < len(b) && b[i] == '.' {
		if j := digits(b, i+1); j > i+1 {
			i = j
		} else {
			p.fail()
			return nil
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if j := digits(b, i); j > i {
			i = j
		} else {
			p.fail()
			return nil
		}
	}
	p.i = i
	return b[start:i]
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// count reads a count (a cap, a multiplier): a number whose value is a whole
// number of at least 1, written without an exponent (a fraction of zeros, as
// in 256.0, is allowed), saturated at limit. Any other value is skipped and
// is not a count.
func (p *parser) count() (int64, bool) {
	if c := p.peek(); c != '-' && (c < '0' || c > '9') {
		p.skip()
		return 0, false
	}
	raw := p.number()
	var v int64
	i := 0
	for ; i < len(raw) && raw[i] != '.'; i++ {
		c := raw[i]
		if c < '0' || c > '9' {
			return 0, false // a sign or an exponent
		}
		v = min(v*10+int64(c-'0'), limit)
	}
	for i++; i < len(raw); i++ {
		if raw[i] != '0' {
			return 0, false
		}
	}
	return v, v > 0
}

// literal reads true, false or null, and returns its length.
func (p *parser) literal() int64 {
	var want string
	switch p.b[p.i] {
	case 't':
		want = "true"
	case 'f':
		want = "false"
	default:
		want = "null"
	}
	if len(p.b)-p.i < len(want) || string(p.b[p.i:p.i+len(want)]) != want {
		p.fail()
		return 0
	}
	p.i += len(want)
	return int64(len(want))
}

// skip reads the value at the cursor and counts nothing of it.
func (p *parser) skip() { p.value(false) }

// jsonChars reads the value at the cursor and returns its characters as
// compact JSON: its punctuation, numbers and literals as written, each
// string's decoded characters and its two quotes, no whitespace.
func (p *parser) jsonChars() int64 { return p.value(true) }

// value reads the value at the cursor, however deep, without recursion:
// p.objs says what each container it opened is. When count is set it returns
// the value's characters as compact JSON (see jsonChars); a value cut short
// counts up to the cut, so that a longer prefix never counts less.
func (p *parser) value(count bool) int64 {
	base := p.depth
	var n int64
	for {
		// At a value.
		if !p.ws() {
			p.fail()
			return n
		}
		switch c := p.b[p.i]; c {
		case '{', '[':
			if !p.push(c == '{') {
				return 0
			}
			n++
			if !p.ws() {
				p.fail()
				return n
			}
			if e := p.b[p.i]; e == '}' && c == '{' || e == ']' && c == '[' {
				p.i++
				p.depth--
				n++
				break
			}
			if c == '{' {
				n += p.key(count)
			}
			continue
		case '"':
			s, _, _ := p.str(count)
			n += s + 2
		case 't', 'f', 'n':
			n += p.literal()
		default:
			n += int64(len(p.number()))
		}
		// After a value: close what ends here, then on to the next value.
		for {
			if p.depth == base || p.bad {
				return n
			}
			if !p.ws() {
				p.fail()
				return n
			}
			obj := p.objs[p.depth/64]&(1<<(p.depth%64)) != 0
			c := p.b[p.i]
			if c == ',' {
				p.i++
				n++
				if obj {
					n += p.key(count)
				}
				break
			}
			if obj && c == '}' || !obj && c == ']' {
				p.i++
				p.depth--
				n++
				continue
			}
			p.fail()
			return 0
		}
	}
}

// key reads a member's key and its colon inside value, and returns their
// characters as compact JSON.
func (p *parser) key(count bool) int64 {
	n, _, _ := p.str(count)
	if !p.ws() || p.b[p.i] != ':' {
		p.fail()
		return 0
	}
	p.i++
	return n + 3
}

// sameFolded reports whether key is name but for case, as encoding/json
// matches a key to a Go struct's field: rune by rune, in Unicode's simple
// folding (so the Kelvin sign is a k, and the long s an s). name is ASCII.
func sameFolded(key []byte, name string) bool {
	if len(key) < len(name) || len(key) > utf8.UTFMax*len(name) {
		return false
	}
	for j := range len(name) {
		r, size := utf8.DecodeRune(key)
		if size == 0 || foldRune(r) != foldRune(rune(name[j])) {
			return false
		}
		key = key[size:]
	}
	return len(key) == 0
}

// foldRune is the smallest rune of r's case folding orbit, as
// encoding/json folds the runes of keys.
func foldRune(r rune) rune {
	if r < utf8.RuneSelf && r != 'k' && r != 'K' && r != 's' && r != 'S' {
		if 'a' <= r && r <= 'z' {
			r -= 'a' - 'A'
		}
		return r
	}
	for {
		next := unicode.SimpleFold(r)
		if next <= r {
			return next
		}
		r = next
	}
}
