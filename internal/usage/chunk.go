package usage

import "bytes"

// IsUsageOnlyChunk reports whether an SSE data payload is an OpenAI
// chat-completions chunk with an empty "choices" array and a non-null "usage"
// (the chunk that stream_options.include_usage adds).
//
// The payload must be one well-formed JSON object whose "choices" is [] and
// whose "usage" is an object; nothing else about it is required (compatible
// backends differ in "object", "id" and the like). It does not allocate.
func IsUsageOnlyChunk(data []byte) bool {
	if !bytes.Contains(data, []byte(`"choices"`)) || !bytes.Contains(data, []byte(`"usage"`)) {
		return false
	}
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = skipSpace(data, i+1)
	var emptyChoices, usageObject bool
	if i < len(data) && data[i] == '}' {
		return false
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return false
		}
		end := skipJSON(data, i)
		if end < 0 {
			return false
		}
		key := data[i+1 : end-1]
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		i = skipSpace(data, i+1)
		end = skipJSON(data, i)
		if end < 0 {
			return false
		}
		val := data[i:end]
		switch string(key) {
		case "choices":
			emptyChoices = val[0] == '[' && skipSpace(val, 1) == len(val)-1
		case "usage":
			usageObject = val[0] == '{'
		}
		i = skipSpace(data, end)
		if i >= len(data) {
			return false
		}
		if data[i] == '}' {
			break
		}
		if data[i] != ',' {
			return false
		}
		i = skipSpace(data, i+1)
	}
	return skipSpace(data, i+1) == len(data) && emptyChoices && usageObject
}

// skipJSON returns the index just after the JSON value that starts at
// b[i], or -1 if there is none. Containers must nest properly (at most 64
// deep); scalars are not validated beyond their alphabet.
func skipJSON(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	var stack uint64 // bit d: the container at depth d is an array
	depth := 0
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			var closed bool
			if i, closed, _ = skipString(b, i+1); !closed {
				return -1
			}
		case c == '{' || c == '[':
			if depth == 64 {
				return -1
			}
			if c == '[' {
				stack |= 1 << depth
			} else {
				stack &^= 1 << depth
			}
			depth++
			i++
			continue
		case c == '}' || c == ']':
			if depth == 0 || (stack>>(depth-1)&1 == 1) != (c == ']') {
				return -1
			}
			depth--
			i++
		case scalarTable[c]:
			if depth == 0 {
				for i < len(b) && scalarTable[b[i]] {
					i++
				}
				return i
			}
			i++
			continue
		case depth > 0 && (isSpace(c) || c == ',' || c == ':'):
			i++
			continue
		default:
			return -1
		}
		if depth == 0 {
			return i
		}
	}
	return -1
}
