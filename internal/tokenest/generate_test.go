package tokenest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestOfAgreesWithReferenceOnGeneratedBodies holds Of to reference on bodies
// that random mutation rarely reaches: requests built by the shapes the APIs
// read (see shapes), with now and then a value of another shape, strings
// escaped at random and whitespace anywhere.
func TestOfAgreesWithReferenceOnGeneratedBodies(t *testing.T) {
	g := generator{rand.New(rand.NewPCG(1, 2)), &bytes.Buffer{}}
	n := 10000
	if testing.Short() {
		n = 1000
	}
	var counted, media, capped int
	for range n {
		g.out.Reset()
		g.object("request", 0)
		body := g.out.Bytes()
		m := refDecode(body)
		for _, p := range apiPaths {
			e, want := ofPath(p, body), refEstimate(p, m)
			if e != want {
				t.Fatalf("%s: %+v, reference %+v, body:\n%s", p, e, want, body)
			}
			if e.Input > 0 {
				counted++
			}
			if e.Input >= MediaTokens {
				media++
			}
			if e.Capped && e.Output > 0 {
				capped++
			}
		}
	}
	t.Logf("of %d estimates, %d count input, %d media, %d a cap", n*len(apiPaths), counted, media, capped)
	// The bodies reach what they are for.
	if total := n * len(apiPaths); counted < total/4 || media < total/20 || capped < total/20 {
		t.Errorf("of %d estimates, %d count input, %d media, %d a cap", total, counted, media, capped)
	}
}

type generator struct {
	r   *rand.Rand
	out *bytes.Buffer
}

// shapes are, for each shape of object, its members and their shapes. A
// shape in brackets is an array of it; "word" is a string of words, "count"
// a number of counts, "any" any value; "content", "prompt" and "input" are a
// string or an array (of parts; of strings, token ids and arrays of them; of
// items or as prompt).
var shapes = map[string][]struct{ key, shape string }{
	"request": {{"messages", "[message]"}, {"tools", "[any]"}, {"functions", "[any]"},
		{"max_completion_tokens", "count"}, {"max_tokens", "count"}, {"n", "count"}, {"best_of", "count"},
		{"prompt", "prompt"}, {"suffix", "word"}, {"input", "input"}, {"instructions", "word"},
		{"max_output_tokens", "count"}, {"system", "content"}, {"contents", "[geminiContent]"},
		{"systemInstruction", "geminiContent"}, {"system_instruction", "geminiContent"},
		{"generationConfig", "config"}, {"generation_config", "config"},
		{"generateContentRequest", "request"}, {"generate_content_request", "request"}, {"model", "word"},
		{"toolConfig", "any"}, {"inferenceConfig", "converseConfig"}, {"documents", "[any]"}, {"inputText", "word"},
		{"max_gen_len", "count"}, {"textGenerationConfig", "titanConfig"}},
	"message": {{"role", "word"}, {"content", "content"}, {"name", "word"}, {"tool_calls", "[toolCall]"},
		{"function_call", "call"}, {"tool_plan", "word"}},
	// Bedrock Converse's content blocks.
	"block": {{"text", "word"}, {"image", "any"}, {"document", "any"}, {"video", "any"}, {"toolUse", "toolUse"},
		{"toolResult", "toolResult"}, {"json", "any"}, {"guardContent", "guard"}, {"cachePoint", "any"}},
	"toolUse":        {{"toolUseId", "word"}, {"name", "word"}, {"input", "any"}},
	"toolResult":     {{"toolUseId", "word"}, {"content", "[block]"}, {"status", "word"}},
	"guard":          {{"text", "guardText"}, {"image", "any"}},
	"converseConfig": {{"maxTokens", "count"}, {"temperature", "count"}},
	"titanConfig":    {{"maxTokenCount", "count"}, {"temperature", "count"}},
	"toolCall":       {{"id", "word"}, {"type", "word"}, {"function", "call"}, {"custom", "call"}},
	"call":           {{"name", "word"}, {"arguments", "word"}, {"input", "word"}},
	"part": {{"type", "word"}, {"type", "word"}, {"text", "word"}, {"refusal", "word"}, {"name", "word"},
		{"input", "any"}, {"content", "content"}, {"source", "source"}, {"image_url", "any"}, {"document", "any"}},
	"source": {{"type", "word"}, {"data", "word"}, {"content", "content"}, {"media_type", "word"}},
	"item": {{"type", "word"}, {"role", "word"}, {"content", "content"}, {"output", "content"},
		{"name", "word"}, {"arguments", "word"}, {"input", "word"}},
	"geminiContent": {{"role", "word"}, {"parts", "[geminiPart]"}},
	"geminiPart": {{"text", "word"}, {"functionCall", "any"}, {"function_response", "any"},
		{"executableCode", "any"}, {"inlineData", "any"}, {"inline_data", "any"}, {"fileData", "any"}, {"thought", "any"}},
	"config": {{"maxOutputTokens", "count"}, {"max_output_tokens", "count"}, {"candidateCount", "count"},
		{"candidate_count", "count"}, {"temperature", "count"}},
}

// words are the strings the APIs compare, and others.
var words = []string{
	"text", "input_text", "output_text", "refusal", "image_url", "input_audio", "file", "input_image",
	"input_file", "image", "document", "tool_use", "server_tool_use", "tool_result", "message",
	"function_call", "custom_tool_call", "function_call_output", "custom_tool_call_output",
	"base64", "content", "thinking", "", "héllo wörld", "日本", "😀 ok", "a\"b\\c\n", "\x01\x7f",
}

var counts = []string{"0", "1", "7", "-3", "256.0", "1.5", "1e3", "-0", "4096", "1099511627777", "99999999999999999999", "12.000"}

func (g *generator) ws() {
	if g.r.IntN(4) == 0 {
		g.out.WriteString([]string{" ", "\n", "\t", "\r\n  "}[g.r.IntN(4)])
	}
}

// object writes an object of the shape: some of its members, each of its
// shape or now and then of any.
func (g *generator) object(shape string, depth int) {
	fields := shapes[shape]
	g.out.WriteByte('{')
	used := map[string]bool{}
	for range g.r.IntN(len(fields) + 1) {
		f := fields[g.r.IntN(len(fields))]
		if used[f.key] {
			continue
		}
		if len(used) > 0 {
			g.out.WriteByte(',')
		}
		used[f.key] = true
		g.ws()
		g.str(f.key)
		g.ws()
		g.out.WriteByte(':')
		g.ws()
		if g.r.IntN(10) == 0 {
			g.value("any", depth+1)
		} else {
			g.value(f.shape, depth+1)
		}
		g.ws()
	}
	g.out.WriteByte('}')
}

func (g *generator) array(shape string, depth int) {
	g.out.WriteByte('[')
	for i := range g.r.IntN(4) {
		if i > 0 {
			g.out.WriteByte(',')
		}
		g.ws()
		g.value(shape, depth+1)
		g.ws()
	}
	g.out.WriteByte(']')
}

// unions are the shapes that are one of others, at random.
var unions = map[string][]string{
	"content":   {"word", "[part]", "[part]", "[block]"},
	"guardText": {"word", "guard"},
	"prompt":    {"word", "[word]", "[count]", "[[count]]"},
	"input":     {"prompt", "[item]", "[item]"},
	"any":       {"object", "[any]", "word", "count", "literal", "literal"},
}

func (g *generator) value(shape string, depth int) {
	if depth > 6 {
		shape = "word"
	}
	for alts, ok := unions[shape]; ok; alts, ok = unions[shape] {
		shape = alts[g.r.IntN(len(alts))]
	}
	switch {
	case shape == "word":
		g.str(words[g.r.IntN(len(words))])
	case shape == "count":
		g.out.WriteString(counts[g.r.IntN(len(counts))])
	case shape == "literal":
		g.out.WriteString([]string{"true", "false", "null"}[g.r.IntN(3)])
	case shape == "object":
		g.object(g.anyShape(), depth)
	case strings.HasPrefix(shape, "["):
		g.array(shape[1:len(shape)-1], depth)
	default:
		g.object(shape, depth)
	}
}

// anyShape is a shape of object at random.
func (g *generator) anyShape() string {
	names := []string{"request", "message", "toolCall", "call", "part", "source", "item", "geminiContent", "geminiPart", "config",
		"block", "toolUse", "toolResult", "guard", "converseConfig", "titanConfig"}
	return names[g.r.IntN(len(names))]
}

// str writes s as a JSON string, escaping characters at random (and always
// those that must be), with now and then a lone surrogate.
func (g *generator) str(s string) {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		must := r < 0x20 || r == '"' || r == '\\'
		switch {
		case !must && g.r.IntN(5) != 0:
			b.WriteRune(r)
		case r >= 0x10000:
			r1, r2 := 0xD800+(r-0x10000)>>10, 0xDC00+(r-0x10000)&0x3FF
			fmt.Fprintf(&b, `\u%04x\u%04X`, r1, r2)
		case r == '"' || r == '\\' || r == '/':
			b.WriteString(`\` + string(r))
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	if g.r.IntN(20) == 0 {
		b.WriteString(`\ud800`)
	}
	if g.r.IntN(20) == 0 {
		b.WriteString("\xff")
	}
	b.WriteByte('"')
	if !utf8.ValidString(s) {
		panic("generator words are UTF-8")
	}
	g.out.WriteString(b.String())
}
