package tokenest

import (
	"bytes"
	"encoding/json"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
)

// reference is Of written the plain way, for FuzzOf to hold Of to: the body
// decoded by encoding/json into maps, and the counting rules of the package
// documentation applied to them. It is not defined for bodies that give a
// member twice (a map keeps one), which FuzzOf leaves to the unit tests.
func reference(path string, body []byte) Estimate {
	return refEstimate(path, refDecode(body))
}

// refDecode is the body decoded if it is a JSON object, else nil.
func refDecode(body []byte) map[string]any {
	if !json.Valid(body) {
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return nil
	}
	m, _ := v.(map[string]any)
	return m
}

// refEstimate is reference's estimate of the decoded body m.
func refEstimate(path string, m map[string]any) Estimate {
	call := llmapi.Of(path)
	if call.API == llmapi.Unknown || m == nil {
		return Estimate{}
	}
	var r refReading
	switch call.API {
	case llmapi.Chat:
		r = refChat(m)
	case llmapi.Completions:
		r = refCompletions(m)
	case llmapi.Embeddings:
		r.t = refPrompt(m["input"])
	case llmapi.Responses:
		r = refResponses(m)
	case llmapi.Messages:
		r = refMessages(m)
	case llmapi.Gemini:
		r = refGemini(m)
	case llmapi.Converse:
		r = refConverse(m)
	case llmapi.Invoke:
		r = refInvoke(m)
	case llmapi.CohereChat:
		r = refCohere(m)
	}
	in := (r.t.chars+3)/4 + r.t.tokens + r.t.media*MediaTokens
	e := Estimate{Input: min(in, limit), Known: true, Choices: max(r.mult, 1)}
	switch {
	case call.NoOutput:
		e.Capped = true
	case r.capped:
		e.Capped = true
		// In float64 the product is exact below limit, and cannot overflow.
		e.Output = limit
		if float64(r.cap)*float64(r.mult) < limit {
			e.Output = r.cap * r.mult
		}
	}
	return e
}

type refReading struct {
	t         tally
	cap, mult int64
	capped    bool
}

// refCap caps r at the first of caps given (not null), times mult, if it
// is a count, no other of caps is given, respelled is false (one is given
// under another spelling of its key too) and mult is not odd.
func (r *refReading) refCap(mult refMultiplier, respelled bool, caps ...any) {
	r.mult = mult.n
	given := 0
	var first any
	for _, c := range caps {
		if c != nil {
			if given == 0 {
				first = c
			}
			given++
		}
	}
	if n, ok := refCount(first); ok && given == 1 && !respelled && !mult.odd {
		r.cap, r.capped = n, true
	}
}

// refRespelled reports whether m gives one of keys under another spelling
// too, as a Go struct's field matches it without regard to case.
func refRespelled(m map[string]any, keys ...string) bool {
	for k := range m {
		for _, key := range keys {
			if k != key && strings.EqualFold(k, key) {
				return true
			}
		}
	}
	return false
}

// refMultiplier is a number of choices, and whether one was given as
// something else than a count.
type refMultiplier struct {
	n   int64
	odd bool
}

var countRE = regexp.MustCompile(`^([0-9]+)(\.0+)?$`)

func refCount(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	g := countRE.FindStringSubmatch(string(n))
	if g == nil {
		return 0, false
	}
	if len(g[1]) > 15 {
		return limit, true // more digits than any count below limit
	}
	c, _ := strconv.ParseInt(g[1], 10, 64)
	return min(c, limit), c > 0
}

// refMult is the largest of the multipliers vs, 1 if none is a count.
func refMult(vs ...any) refMultiplier {
	m := refMultiplier{n: 1}
	for _, v := range vs {
		if n, ok := refCount(v); ok {
			m.n = max(m.n, n)
		} else if v != nil {
			m.odd = true
		}
	}
	return m
}

func refText(v any) int64 {
	s, _ := v.(string)
	return int64(utf8.RuneCountInString(s))
}

// refJSON is the characters of v as compact JSON.
func refJSON(v any) int64 {
	switch v := v.(type) {
	case nil:
		return 4
	case bool:
		if v {
			return 4
		}
		return 5
	case json.Number:
		return int64(len(v))
	case string:
		return refText(v) + 2
	case []any:
		n := int64(2 + max(len(v)-1, 0))
		for _, e := range v {
			n += refJSON(e)
		}
		return n
	case map[string]any:
		n := int64(2 + max(len(v)-1, 0))
		for k, e := range v {
			n += refText(k) + 3 + refJSON(e)
		}
		return n
	}
	panic("not decoded JSON")
}

func refJSONEach(v any) (n int64) {
	a, _ := v.([]any)
	for _, e := range a {
		n += refJSON(e)
	}
	return n
}

// refSum adds up f over the elements of v if it is an array of objects.
func refSum(v any, f func(map[string]any) tally) (t tally) {
	a, _ := v.([]any)
	for _, e := range a {
		if m, ok := e.(map[string]any); ok {
			t.add(f(m))
		}
	}
	return t
}

func refObject(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func refPrompt(v any) (t tally) {
	switch v := v.(type) {
	case string:
		t.chars = refText(v)
	case []any:
		for _, e := range v {
			switch e := e.(type) {
			case string:
				t.chars += refText(e)
			case json.Number:
				t.tokens++
			case []any:
				for _, id := range e {
					if _, ok := id.(json.Number); ok {
						t.tokens++
					}
				}
			}
		}
	}
	return t
}

func refChat(m map[string]any) (r refReading) {
	r.t = refSum(m["messages"], refMessage)
	r.t.chars += refJSONEach(m["tools"]) + refJSONEach(m["functions"])
	mult := refMult(m["n"])
	mult.odd = mult.odd || refRespelled(m, "n")
	r.refCap(mult, refRespelled(m, "max_completion_tokens", "max_tokens"), m["max_completion_tokens"], m["max_tokens"])
	return r
}

func refCompletions(m map[string]any) (r refReading) {
	r.t = refPrompt(m["prompt"])
	r.t.chars += refText(m["suffix"])
	mult := refMult(m["n"], m["best_of"])
	mult.odd = mult.odd || refRespelled(m, "n", "best_of")
	r.refCap(mult, refRespelled(m, "max_tokens"), m["max_tokens"])
	return r
}

func refResponses(m map[string]any) (r refReading) {
	if s, ok := m["input"].(string); ok {
		r.t.chars = refText(s)
	} else {
		r.t = refSum(m["input"], refItem)
	}
	r.t.chars += refText(m["instructions"]) + refJSONEach(m["tools"])
	r.refCap(refMult(), refRespelled(m, "max_output_tokens"), m["max_output_tokens"])
	return r
}

func refMessages(m map[string]any) (r refReading) {
	r.t = refContent(m["system"])
	r.t.add(refSum(m["messages"], refMessage))
	r.t.chars += refJSONEach(m["tools"])
	r.refCap(refMult(), refRespelled(m, "max_tokens"), m["max_tokens"])
	return r
}

func refGemini(m map[string]any) (r refReading) {
	r.t = refSum(m["contents"], refGeminiContent)
	for _, k := range []string{"systemInstruction", "system_instruction"} {
		if c, ok := m[k].(map[string]any); ok {
			r.t.add(refGeminiContent(c))
		}
	}
	for _, k := range []string{"generateContentRequest", "generate_content_request"} {
		if g, ok := m[k].(map[string]any); ok {
			r.t.add(refGemini(g).t)
		}
	}
	r.t.chars += refJSONEach(m["tools"])
	camel, snake := refObject(m["generationConfig"]), refObject(m["generation_config"])
	config := refRespelled(m, "generationConfig", "generation_config")
	mult, given := refMult(), 0
	for _, c := range []any{camel["candidateCount"], camel["candidate_count"], snake["candidateCount"], snake["candidate_count"]} {
		if c != nil {
			if given == 0 {
				mult = refMult(c)
			}
			given++
		}
	}
	mult.odd = mult.odd || given > 1 || config || refRespelled(camel, "candidateCount", "candidate_count") || refRespelled(snake, "candidateCount", "candidate_count")
	respelled := config || refRespelled(camel, "maxOutputTokens", "max_output_tokens") || refRespelled(snake, "maxOutputTokens", "max_output_tokens")
	r.refCap(mult, respelled, camel["maxOutputTokens"], camel["max_output_tokens"], snake["maxOutputTokens"], snake["max_output_tokens"])
	return r
}

func refConverse(m map[string]any) (r refReading) {
	r.t = refSum(m["messages"], func(message map[string]any) tally { return refBlocks(message["content"]) })
	r.t.add(refBlocks(m["system"]))
	if v, ok := m["toolConfig"]; ok {
		r.t.chars += refJSON(v)
	}
	config := refObject(m["inferenceConfig"])
	r.refCap(refMult(), refRespelled(m, "inferenceConfig") || refRespelled(config, "maxTokens"), config["maxTokens"])
	return r
}

// refBlocks counts Converse's content blocks: each a union, whose members
// say what it is.
func refBlocks(v any) tally {
	return refSum(v, func(b map[string]any) (t tally) {
		t.chars += refText(b["text"])
		for _, k := range []string{"image", "document", "video"} {
			if _, ok := b[k]; ok {
				t.media++
			}
		}
		if use, ok := b["toolUse"].(map[string]any); ok {
			t.chars += refText(use["name"])
			if in, ok := use["input"]; ok {
				t.chars += refJSON(in)
			}
		}
		t.add(refBlocks(refObject(b["toolResult"])["content"]))
		if v, ok := b["json"]; ok {
			t.chars += refJSON(v)
		}
		if v, ok := b["guardContent"]; ok {
			t.add(refGuard(v))
		}
		return t
	})
}

// refGuard counts a guardContent: its text, itself {"text": …}, and its
// image.
func refGuard(v any) (t tally) {
	if s, ok := v.(string); ok {
		return tally{chars: refText(s)}
	}
	m := refObject(v)
	if text, ok := m["text"]; ok {
		t = refGuard(text)
	}
	if _, ok := m["image"]; ok {
		t.media++
	}
	return t
}

func refInvoke(m map[string]any) (r refReading) {
	r.t = refContent(m["system"])
	r.t.add(refSum(m["messages"], refMessage))
	r.t.chars += refJSONEach(m["tools"]) + refText(m["prompt"]) + refText(m["inputText"])
	titan := refObject(m["textGenerationConfig"])
	respelled := refRespelled(m, "max_tokens", "max_gen_len", "textGenerationConfig") || refRespelled(titan, "maxTokenCount")
	r.refCap(refMult(), respelled, m["max_tokens"], m["max_gen_len"], titan["maxTokenCount"])
	return r
}

func refCohere(m map[string]any) (r refReading) {
	r.t = refSum(m["messages"], refMessage)
	r.t.chars += refJSONEach(m["tools"]) + refJSONEach(m["documents"])
	r.refCap(refMult(), refRespelled(m, "max_tokens"), m["max_tokens"])
	return r
}

func refGeminiContent(m map[string]any) tally {
	return refSum(m["parts"], func(part map[string]any) (t tally) {
		for _, m := range geminiPartMembers {
			v, ok := part[m.key]
			switch {
			case !ok:
			case m.shape == shapeText:
				t.chars += refText(v)
			case m.shape == shapeJSON:
				t.chars += refJSON(v)
			case m.shape == shapeMedia:
				t.media++
			default:
				panic("a shape of part the reference does not know")
			}
		}
		return t
	})
}

func refMessage(m map[string]any) tally {
	t := refContent(m["content"])
	t.chars += refText(m["name"]) + refCall(m["function_call"]) + refText(m["tool_plan"])
	calls, _ := m["tool_calls"].([]any)
	for _, c := range calls {
		c := refObject(c)
		t.chars += refCall(c["function"]) + refCall(c["custom"])
	}
	return t
}

func refCall(v any) int64 {
	m := refObject(v)
	return refText(m["name"]) + refText(m["arguments"]) + refText(m["input"])
}

func refContent(v any) tally {
	if s, ok := v.(string); ok {
		return tally{chars: refText(s)}
	}
	return refSum(v, refPart)
}

func refPart(m map[string]any) tally {
	typ, _ := m["type"].(string)
	switch typ {
	case "text", "input_text", "output_text":
		return tally{chars: refText(m["text"])}
	case "refusal":
		return tally{chars: refText(m["refusal"])}
	case "image_url", "input_audio", "file", "input_image", "input_file", "image":
		return tally{media: 1}
	case "document":
		src := refObject(m["source"])
		switch src["type"] {
		case "text":
			return tally{chars: refText(src["data"])}
		case "content":
			return refContent(src["content"])
		}
		_, sourced := m["source"]
		if doc, ok := m["document"]; ok && !sourced {
			return tally{chars: refJSON(doc)} // Cohere's
		}
		return tally{media: 1}
	case "tool_use", "server_tool_use":
		t := tally{chars: refText(m["name"])}
		if in, ok := m["input"]; ok {
			t.chars += refJSON(in)
		}
		return t
	case "tool_result":
		return refContent(m["content"])
	}
	return tally{}
}

func refItem(m map[string]any) tally {
	typ, typed := m["type"]
	if !typed {
		typ = "message"
	}
	switch typ {
	case "message":
		return refContent(m["content"])
	case "function_call":
		return tally{chars: refText(m["name"]) + refText(m["arguments"])}
	case "custom_tool_call":
		return tally{chars: refText(m["name"]) + refText(m["input"])}
	case "function_call_output", "custom_tool_call_output":
		return refContent(m["output"])
	}
	return tally{}
}

// hasDuplicateKeys reports whether some object of the valid JSON body gives
// a member twice.
func hasDuplicateKeys(body []byte) bool {
	d := json.NewDecoder(bytes.NewReader(body))
	type frame struct {
		keys  map[string]bool
		isKey bool // the next token of this object is a key
	}
	var stack []*frame
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return false
		}
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.keys != nil && top.isKey {
			if k, ok := tok.(string); ok {
				if top.keys[k] {
					return true
				}
				top.keys[k] = true
				top.isKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{keys: map[string]bool{}, isKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the object it is in (if any) wants a key next.
		if len(stack) > 0 && stack[len(stack)-1].keys != nil {
			stack[len(stack)-1].isKey = true
		}
	}
}
