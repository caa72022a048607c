package tokenest

// Span is where a JSON value is in a text: text[Start:End]. The zero Span is
// no value.
type Span struct{ Start, End int }

// Found reports whether the value is there.
func (s Span) Found() bool { return s.End > 0 }

// Of is the value's bytes in text; none if it is not there.
func (s Span) Of(text []byte) []byte { return text[s.Start:s.End] }

// Object is where a JSON object's members are in its text, so that a caller
// can edit the text and leave the rest of its bytes as they are.
type Object struct {
	Values []Span // of each key asked for, its last value's
	Close  int    // the object's closing brace
	Empty  bool   // it has no members
}

// ReadObject reads text, which must be one JSON object (as json.Valid has
// it; whitespace around it is allowed), with the estimator's parser: in one
// pass, checking every byte. Keys are compared as the estimator compares
// them: exactly, after unescaping, and of a member given twice the last
// counts, as encoding/json reads it into a map. Each key asked for must be
// ASCII of at most 32 bytes.
func ReadObject(text []byte, keys ...string) (Object, bool) {
	o := Object{Values: make([]Span, len(keys)), Empty: true}
	p := parser{b: text}
	if p.peek() != '{' {
		return Object{}, false
	}
	p.members(func(key word) {
		o.Empty = false
		p.ws()
		v := Span{Start: p.i}
		p.skip()
		v.End = p.i
		for i, k := range keys {
			if string(key.bytes()) == k {
				o.Values[i] = v
			}
		}
	})
	o.Close = p.i - 1
	if p.bad || p.ws() {
		return Object{}, false
	}
	return o, true
}
