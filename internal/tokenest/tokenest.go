package tokenest

import "github.com/rolter/caddy-ratelimit/internal/llmapi"

// Estimate is what a request body asks of the model, in tokens.
type Estimate struct {
	// Input is the estimate of the request's input: the characters of the
	// text it sends to the model divided by 4, rounded up, plus MediaTokens
	// for each media part.
	Input int64
	// Output is the output the request caps itself at, times the number of
	// choices it asks for; meaningful only when Capped.
	Output int64
	// Choices is the number of choices the request asks for (n, the
	// larger of n and best_of, candidateCount), at least 1, whether it
	// names an output cap or not: each choice is generated, and billed,
	// up to the cap. 0 when not Known.
	Choices int64
	// Capped says whether the request names its own output cap (an
	// embeddings request is capped at 0: it produces no output tokens).
	Capped bool
	// Known says whether the body was JSON of an API this package reads;
	// when false, Input and Output are 0 and Capped is false.
	Known bool
}

// MediaTokens is the fixed estimate of one media part (an image, audio, a
// file, inline base64 data), whatever its size. It is about the most one
// image costs at a provider's default sizing, so that a reservation rarely
// falls short for images: Anthropic bills w×h/750 tokens and scales images
// down to about 1.15 megapixels, so at most about 1600 (1092×1092 is 1590);
// an OpenAI high-detail 1024×1024 image is 765 tokens (85 + 170 per 512px
// tile, at most 1445); Gemini 3 at high media resolution is 1120 per image.
// Audio, video and multi-page documents usually cost more; what they really
// cost is settled from the usage the provider reports.
const MediaTokens = 1600

// limit is where every count saturates.
const limit = 1 << 40

// Of reads the JSON body of a request of the call.
func Of(call llmapi.Call, body []byte) Estimate {
	r, ok := read(call, body, false)
	if !ok {
		return Estimate{}
	}
	// Each count is of distinct bytes of the body, so the sum cannot
	// overflow; only the product with MediaTokens and the caps can pass limit.
	e := Estimate{Known: true, Choices: r.choices}
	e.Input = inputOf(r.tally)
	switch {
	case call.NoOutput:
		e.Capped = true
	case r.capped:
		e.Capped, e.Output = true, r.out
	}
	return e
}

// OfPrefix reads the first bytes of a longer body, cut short at a read
// limit: its Input is the estimate of the text and media those bytes hold
// (a string cut short counts up to the cut), so that a body longer than the
// limit is estimated at least as what was read of it. Its output cap is not
// known: a cap written after the cut would be missed, so Capped is false.
// Its Choices are those the bytes name, if any.
func OfPrefix(call llmapi.Call, prefix []byte) Estimate {
	r, ok := read(call, prefix, true)
	if !ok {
		return Estimate{}
	}
	return Estimate{Known: true, Input: inputOf(r.tally), Choices: r.choices}
}

func inputOf(t tally) int64 {
	return min((t.chars+3)/4+t.tokens+mul(t.media, MediaTokens), limit)
}

// read reads the body of a request of the call's API, and reports whether
// it is one this package reads. A prefix is read as far as it goes: it ends
// where a JSON text would go on.
func read(call llmapi.Call, body []byte, prefix bool) (r reading, ok bool) {
	p := parser{b: body}
	if call.API == llmapi.Unknown || p.peek() != '{' {
		return r, false
	}
	switch call.API {
	case llmapi.Chat:
		r = chat(&p)
	case llmapi.Completions:
		r = completions(&p)
	case llmapi.Embeddings:
		r = embeddings(&p)
	case llmapi.Responses:
		r = oneCap(&p, responsesMembers)
	case llmapi.Messages:
		r = oneCap(&p, messagesMembers)
	case llmapi.Gemini:
		r = gemini(&p)
	case llmapi.Converse:
		r = oneCap(&p, converseMembers)
	case llmapi.Invoke:
		r = invoke(&p)
	case llmapi.CohereChat:
		r = oneCap(&p, cohereMembers)
	}
	if !prefix && (p.bad || p.ws()) {
		return reading{}, false
	}
	r.choices = max(r.choices, 1)
	return r, true
}

// tally is what part of a request sends the model.
type tally struct {
	chars  int64 // characters of text
	tokens int64 // token ids
	media  int64 // media parts
}

func (t *tally) add(u tally) {
	t.chars += u.chars
	t.tokens += u.tokens
	t.media += u.media
}

// reading is what a request sends the model, the output it caps itself
// at and the choices it asks for.
type reading struct {
	tally
	out     int64
	capped  bool
	choices int64
}

// setCap reads mult choices, and caps the reading at c times them if c is
// a count and mult is not given as something else: an upstream may read a
// multiplier of "8" or 1e1 as a count (protobuf's JSON does), and a cap
// times a multiplier this package cannot read would be less than what the
// request asks for.
func (r *reading) setCap(c opt, mult opt) {
	r.choices = mult.or1()
	if c.ok && !c.odd && !mult.odd {
		r.capped = true
		r.out = mul(c.v, mult.or1())
	}
}

// opt is a count that may be absent (or null), or given as something else
// or in two ways (odd: see respelled and oneOf).
type opt struct {
	v   int64
	ok  bool
	odd bool
}

func (o *opt) read(p *parser) {
	null := p.peek() == 'n'
	o.v, o.ok = p.count()
	o.odd = !o.ok && !null
}

// oneOf is the first of the spellings of one count that is given,
// given in two ways (odd) if another is given too: the spellings of a
// field that protobuf's JSON reads alike (maxOutputTokens and
// max_output_tokens), or OpenAI's two caps of a chat's output, which a
// limiter that read one would trust where the upstream may read the other.
func oneOf(spellings ...opt) opt {
	var first opt
	given := 0
	for _, o := range spellings {
		if o.ok || o.odd {
			if given == 0 {
				first = o
			}
			given++
		}
	}
	first.odd = first.odd || given > 1
	return first
}

// larger is the larger of two multipliers, given as something else if
// either is.
func larger(a, b opt) opt {
	return opt{v: max(a.or1(), b.or1()), ok: true, odd: a.odd || b.odd}
}

func (o opt) or1() int64 {
	if o.ok {
		return o.v
	}
	return 1
}

// mul is a×b saturated at limit, for a and b in [0, limit].
func mul(a, b int64) int64 {
	if a != 0 && b > limit/a {
		return limit
	}
	return a * b
}

// chat reads an OpenAI chat completions request.
func chat(p *parser) (r reading) {
	var c [3]opt
	r.tally = p.object(chatMembers, c[:])
	r.setCap(oneOf(c[0], c[1]), c[2])
	return r
}

// completions reads an OpenAI legacy completions request.
func completions(p *parser) (r reading) {
	var c [3]opt
	r.tally = p.object(completionsMembers, c[:])
	r.setCap(c[0], larger(c[1], c[2]))
	return r
}

// embeddings reads an OpenAI embeddings request.
func embeddings(p *parser) (r reading) {
	r.tally = p.object(embeddingsMembers, nil)
	return r
}

// oneCap reads a request whose members have one count, its output cap, for
// one choice: an OpenAI Responses request (max_output_tokens), an Anthropic
// Messages request and a Cohere v2 chat request (max_tokens), a Bedrock
// Converse request (inferenceConfig.maxTokens, one shape for every model).
func oneCap(p *parser, members []member) (r reading) {
	var c [1]opt
	r.tally = p.object(members, c[:])
	r.setCap(c[0], opt{})
	return r
}

// gemini reads a Gemini generateContent or countTokens request. Its counts
// are those of generationConfig (0 to 3) and of generation_config (4 to 7),
// each under its camelCase and its snake_case spelling: a count given under
// two of them is not one it can be sure of (oneOf).
func gemini(p *parser) (r reading) {
	var c [8]opt
	r.tally = p.object(geminiMembers, c[:])
	r.setCap(oneOf(c[0], c[1], c[4], c[5]), oneOf(c[2], c[3], c[6], c[7]))
	return r
}

// invoke reads a Bedrock InvokeModel request, whose body is the model's
// own: Anthropic's Messages (max_tokens), or Meta's, Mistral's and
// DeepSeek's prompt (max_gen_len, max_tokens), or Amazon Titan's inputText
// (textGenerationConfig.maxTokenCount). Bedrock checks each body against
// its model's schema and refuses a member it does not know, so a cap read
// is one the model takes; a cap given under two names is not one this
// package can be sure of all the same.
func invoke(p *parser) (r reading) {
	var c [3]opt
	r.tally = p.object(invokeMembers, c[:])
	r.setCap(oneOf(c[0], c[1], c[2]), opt{})
	return r
}

// shape is what the value of a member counts.
type shape uint8

const (
	shapeText               shape = iota // a string: its characters
	shapeJSON                            // any value, as JSON
	shapeMedia                           // any value: one media part
	shapeDefinitions                     // an array: each element as JSON
	shapeContent                         // see content
	shapePrompt                          // see prompt
	shapeInput                           // a Responses input: a string, or items
	shapeMessages                        // an array of messageMembers
	shapeToolCalls                       // an array of toolCallMembers
	shapeCall                            // callMembers
	shapeGeminiContents                  // an array of geminiContentMembers
	shapeGeminiContent                   // geminiContentMembers
	shapeGeminiParts                     // an array of geminiPartMembers
	shapeGeminiRequest                   // geminiMembers, for their input only
	shapeCount                           // a count, read into counts[at]
	shapeConfig                          // an object of config's members, its counts read into counts[at:at+len(config)]
	shapeConverseBlocks                  // an array of converseBlockMembers
	shapeConverseMessages                // an array of converseMessageMembers
	shapeConverseToolUse                 // converseToolUseMembers
	shapeConverseToolResult              // converseToolResultMembers
	shapeConverseGuard                   // converseGuardMembers
)

// member is a member of an object that counts, and its shape.
type member struct {
	key    string
	shape  shape
	at     int      // for shapeCount and shapeConfig
	config []member // for shapeConfig: each a shapeCount
}

// What each object reads; any other member counts nothing.
var (
	chatMembers = []member{
		{key: "messages", shape: shapeMessages},
		{key: "tools", shape: shapeDefinitions},
		{key: "functions", shape: shapeDefinitions},
		{key: "max_completion_tokens", shape: shapeCount, at: 0},
		{key: "max_tokens", shape: shapeCount, at: 1},
		{key: "n", shape: shapeCount, at: 2},
	}
	completionsMembers = []member{
		{key: "prompt", shape: shapePrompt},
		{key: "suffix", shape: shapeText},
		{key: "max_tokens", shape: shapeCount, at: 0},
		{key: "n", shape: shapeCount, at: 1},
		{key: "best_of", shape: shapeCount, at: 2},
	}
	embeddingsMembers = []member{{key: "input", shape: shapePrompt}}
	responsesMembers  = []member{
		{key: "input", shape: shapeInput},
		{key: "instructions", shape: shapeText},
		{key: "tools", shape: shapeDefinitions},
		{key: "max_output_tokens", shape: shapeCount, at: 0},
	}
	messagesMembers = []member{
		{key: "system", shape: shapeContent},
		{key: "messages", shape: shapeMessages},
		{key: "tools", shape: shapeDefinitions},
		{key: "max_tokens", shape: shapeCount, at: 0},
	}
	// Gemini's members are read under either spelling, lowerCamelCase or
	// snake_case: both count if both are given.
	geminiMembers = []member{
		{key: "contents", shape: shapeGeminiContents},
		{key: "systemInstruction", shape: shapeGeminiContent},
		{key: "system_instruction", shape: shapeGeminiContent},
		{key: "tools", shape: shapeDefinitions},
		{key: "generateContentRequest", shape: shapeGeminiRequest},
		{key: "generate_content_request", shape: shapeGeminiRequest},
		{key: "generationConfig", shape: shapeConfig, at: 0, config: geminiConfigMembers},
		{key: "generation_config", shape: shapeConfig, at: 4, config: geminiConfigMembers},
	}
	geminiConfigMembers = []member{
		{key: "maxOutputTokens", shape: shapeCount, at: 0},
		{key: "max_output_tokens", shape: shapeCount, at: 1},
		{key: "candidateCount", shape: shapeCount, at: 2},
		{key: "candidate_count", shape: shapeCount, at: 3},
	}

	// Bedrock's Converse request. Its content blocks are unions: each
	// block's one member says what it is.
	converseMembers = []member{
		{key: "messages", shape: shapeConverseMessages},
		{key: "system", shape: shapeConverseBlocks},
		{key: "toolConfig", shape: shapeJSON},
		{key: "inferenceConfig", shape: shapeConfig, config: []member{{key: "maxTokens", shape: shapeCount}}},
	}
	converseMessageMembers = []member{{key: "content", shape: shapeConverseBlocks}}
	converseBlockMembers   = []member{
		{key: "text", shape: shapeText},
		{key: "image", shape: shapeMedia},
		{key: "document", shape: shapeMedia},
		{key: "video", shape: shapeMedia},
		{key: "toolUse", shape: shapeConverseToolUse},
		{key: "toolResult", shape: shapeConverseToolResult},
		{key: "json", shape: shapeJSON}, // a tool result's
		{key: "guardContent", shape: shapeConverseGuard},
	}
	converseToolUseMembers    = []member{{key: "name", shape: shapeText}, {key: "input", shape: shapeJSON}}
	converseToolResultMembers = []member{{key: "content", shape: shapeConverseBlocks}}
	// guardContent's text is {"text": …, "qualifiers": […]}.
	converseGuardMembers = []member{{key: "text", shape: shapeConverseGuard}, {key: "image", shape: shapeMedia}}
	// Bedrock's InvokeModel request: Anthropic's Messages, or a prompt.
	invokeMembers = []member{
		{key: "system", shape: shapeContent},
		{key: "messages", shape: shapeMessages},
		{key: "tools", shape: shapeDefinitions},
		{key: "prompt", shape: shapeText},    // Meta, Mistral, DeepSeek
		{key: "inputText", shape: shapeText}, // Amazon Titan
		{key: "max_tokens", shape: shapeCount, at: 0},
		{key: "max_gen_len", shape: shapeCount, at: 1},
		{key: "textGenerationConfig", shape: shapeConfig, at: 2, config: titanConfigMembers},
	}
	titanConfigMembers = []member{{key: "maxTokenCount", shape: shapeCount}}
	// Cohere's v2 chat request: its messages are chat's, with a tool plan
	// beside their tool calls; its documents go to the model.
	cohereMembers = []member{
		{key: "messages", shape: shapeMessages},
		{key: "tools", shape: shapeDefinitions},
		{key: "documents", shape: shapeDefinitions},
		{key: "max_tokens", shape: shapeCount, at: 0},
	}

	// An element of messages[]: OpenAI chat's, Anthropic's, Cohere's.
	messageMembers = []member{
		{key: "content", shape: shapeContent},
		{key: "name", shape: shapeText},
		{key: "tool_calls", shape: shapeToolCalls},
		{key: "function_call", shape: shapeCall},
		{key: "tool_plan", shape: shapeText}, // Cohere
	}
	// An element of an OpenAI assistant message's tool_calls.
	toolCallMembers = []member{{key: "function", shape: shapeCall}, {key: "custom", shape: shapeCall}}
	// A call of a tool.
	callMembers = []member{
		{key: "name", shape: shapeText},
		{key: "arguments", shape: shapeText},
		{key: "input", shape: shapeText},
	}
	// A Gemini Content: an element of contents, or a systemInstruction.
	geminiContentMembers = []member{{key: "parts", shape: shapeGeminiParts}}
	// A Gemini Part, whose members say what it is.
	geminiPartMembers = []member{
		{key: "text", shape: shapeText},
		{key: "inlineData", shape: shapeMedia},
		{key: "inline_data", shape: shapeMedia},
		{key: "fileData", shape: shapeMedia},
		{key: "file_data", shape: shapeMedia},
		{key: "functionCall", shape: shapeJSON},
		{key: "function_call", shape: shapeJSON},
		{key: "functionResponse", shape: shapeJSON},
		{key: "function_response", shape: shapeJSON},
		{key: "executableCode", shape: shapeJSON},
		{key: "executable_code", shape: shapeJSON},
		{key: "codeExecutionResult", shape: shapeJSON},
		{key: "code_execution_result", shape: shapeJSON},
	}
)

// maxMembers bounds the members of an object that count.
const maxMembers = 16

// object reads an object whose members are those of members, each of its
// shape; a count is read into counts. A member given twice is read as its
// last value, as the providers' JSON decoders do, and what the members count
// is summed at the end.
func (p *parser) object(members []member, counts []opt) tally {
	var each [maxMembers]tally
	var respelled uint16 // bit at: counts[at] is given under another spelling of its key too
	p.members(func(k word) {
		for i, m := range members {
			if string(k.bytes()) != m.key {
				respelled |= m.respelled(k.bytes())
				continue
			}
			switch m.shape {
			case shapeCount:
				counts[m.at].read(p)
			case shapeConfig:
				c := counts[m.at : m.at+len(m.config)]
				clear(c)
				p.object(m.config, c)
			default:
				each[i] = p.shaped(m.shape)
			}
			return
		}
		p.skip()
	})
	for at := range counts {
		counts[at].odd = counts[at].odd || respelled&(1<<at) != 0
	}
	var t tally
	for _, u := range each[:len(members)] {
		t.add(u)
	}
	return t
}

// respelled is the counts that key gives under another spelling of m's key
// ("MAX_TOKENS" for max_tokens), as bits of their positions, if it does:
// an upstream that decodes JSON into a Go struct matches keys without
// regard to case and reads the last of them, where this package reads m's
// key alone, so such a count is not one it can be sure of.
func (m member) respelled(key []byte) uint16 {
	if !sameFolded(key, m.key) {
		return 0
	}
	switch m.shape {
	case shapeCount:
		return 1 << m.at
	case shapeConfig:
		return (1<<len(m.config) - 1) << m.at
	}
	return 0
}

// shaped reads a value of the shape.
func (p *parser) shaped(s shape) tally {
	switch s {
	case shapeText:
		return tally{chars: p.text()}
	case shapeJSON:
		return tally{chars: p.jsonChars()}
	case shapeMedia:
		p.skip()
		return tally{media: 1}
	case shapeDefinitions:
		var n int64
		p.each(func() { n += p.jsonChars() })
		return tally{chars: n}
	case shapeContent:
		return p.content()
	case shapePrompt:
		return p.prompt()
	case shapeInput:
		if p.peek() == '"' {
			return tally{chars: p.text()}
		}
		return p.eachTally(p.item)
	case shapeMessages:
		return p.eachObject(messageMembers)
	case shapeToolCalls:
		return p.eachObject(toolCallMembers)
	case shapeCall:
		return p.object(callMembers, nil)
	case shapeGeminiContents:
		return p.eachObject(geminiContentMembers)
	case shapeGeminiContent:
		return p.object(geminiContentMembers, nil)
	case shapeGeminiParts:
		return p.eachObject(geminiPartMembers)
	case shapeGeminiRequest:
		var c [8]opt
		return p.object(geminiMembers, c[:])
	case shapeConverseBlocks:
		return p.eachObject(converseBlockMembers)
	case shapeConverseMessages:
		return p.eachObject(converseMessageMembers)
	case shapeConverseToolUse:
		return p.object(converseToolUseMembers, nil)
	case shapeConverseToolResult:
		return p.object(converseToolResultMembers, nil)
	case shapeConverseGuard:
		if p.peek() == '"' {
			return tally{chars: p.text()}
		}
		return p.object(converseGuardMembers, nil)
	}
	p.skip()
	return tally{}
}

// eachTally reads an array whose elements read adds up.
func (p *parser) eachTally(read func() tally) (t tally) {
	p.each(func() { t.add(read()) })
	return t
}

// eachObject reads an array of objects of members.
func (p *parser) eachObject(members []member) tally {
	return p.eachTally(func() tally { return p.object(members, nil) })
}

// prompt reads a legacy prompt or an embeddings input: a string, an array of
// strings, an array of token ids, or an array of arrays of token ids. A
// token id counts one token.
func (p *parser) prompt() (t tally) {
	if p.peek() == '"' {
		return tally{chars: p.text()}
	}
	p.each(func() {
		switch p.peek() {
		case '"':
			t.chars += p.text()
		case '[':
			p.each(func() { t.tokens += p.tokenID() })
		default:
			t.tokens += p.tokenID()
		}
	})
	return t
}

// tokenID reads a value that is a token id if it is a number: 1 if it is.
func (p *parser) tokenID() int64 {
	c := p.peek()
	p.skip()
	if c == '-' || '0' <= c && c <= '9' {
		return 1
	}
	return 0
}

// content reads the content of a message, a system prompt, a tool result or
// a function call output: a string is text, an array is parts (see part),
// anything else counts nothing.
func (p *parser) content() tally {
	if p.peek() == '"' {
		return tally{chars: p.text()}
	}
	return p.eachTally(p.part)
}

// partKind is what a content part is, by its type.
type partKind uint8

const (
	partOther      partKind = iota
	partText                // counts its text
	partRefusal             // counts its refusal
	partMedia               // counts MediaTokens
	partDocument            // counts by its source, or its document as JSON
	partToolUse             // counts its name and its input as JSON
	partToolResult          // counts its content
)

// partKinds are the types of the content parts of all the APIs; a part of
// another type counts nothing.
var partKinds = map[string]partKind{
	"text":            partText, // OpenAI chat, Anthropic
	"input_text":      partText, // Responses
	"output_text":     partText, // Responses
	"refusal":         partRefusal,
	"image_url":       partMedia,    // OpenAI chat, Cohere
	"input_audio":     partMedia,    // OpenAI chat, Responses
	"file":            partMedia,    // OpenAI chat
	"input_image":     partMedia,    // Responses
	"input_file":      partMedia,    // Responses
	"image":           partMedia,    // Anthropic
	"document":        partDocument, // Anthropic, Cohere
	"tool_use":        partToolUse,
	"server_tool_use": partToolUse,
	"tool_result":     partToolResult,
}

// part reads one element of a content array.
func (p *parser) part() tally {
	o := p.typed()
	switch partKinds[string(o.typ.bytes())] {
	case partText:
		return tally{chars: o.text}
	case partRefusal:
		return tally{chars: o.refusal}
	case partMedia:
		return tally{media: 1}
	case partDocument:
		switch {
		case o.source.kind == sourceText:
			return tally{chars: o.source.data}
		case o.source.kind == sourceContent:
			return o.source.content
		case o.documented && !o.source.given:
			return tally{chars: o.document}
		case p.bad:
			// A prefix cut before the source says what it is: counting it
			// as media now would count more than the text it may turn out
			// to be.
			return tally{}
		}
		return tally{media: 1}
	case partToolUse:
		return tally{chars: o.name + o.inputJSON}
	case partToolResult:
		return o.content
	}
	return tally{}
}

// typedObject is what may count of a content part or a Responses item.
// Its members may come in any order, so each is read, and its type then
// picks which count.
type typedObject struct {
	typ                            word
	typed                          bool // it has a type
	text, refusal, name, arguments int64
	input                          int64 // if a string, its characters
	inputJSON                      int64 // as JSON
	content, output                tally
	source                         source
	document                       int64 // Cohere's, as JSON
	documented                     bool  // it has a document
}

func (p *parser) typed() (o typedObject) {
	p.members(func(k word) {
		switch string(k.bytes()) {
		case "type":
			o.typ, o.typed = p.name(), true
		case "text":
			o.text = p.text()
		case "refusal":
			o.refusal = p.text()
		case "name":
			o.name = p.text()
		case "arguments":
			o.arguments = p.text()
		case "input":
			if p.peek() == '"' {
				o.input = p.text()
				o.inputJSON = o.input + 2
			} else {
				o.input, o.inputJSON = 0, p.jsonChars()
			}
		case "content":
			o.content = p.content()
		case "output":
			o.output = p.content()
		case "source":
			o.source = p.source()
		case "document":
			o.document, o.documented = p.jsonChars(), true
		default:
			p.skip()
		}
	})
	return o
}

// source is an Anthropic document's source: a plain text one counts its
// data, a content one its content, any other (base64, url, file) is media.
type source struct {
	kind    sourceKind
	data    int64
	content tally
	given   bool // the part has a source, of whatever kind
}

type sourceKind uint8

const (
	sourceMedia sourceKind = iota
	sourceText
	sourceContent
)

func (p *parser) source() (s source) {
	s.given = true
	p.members(func(k word) {
		switch string(k.bytes()) {
		case "type":
			switch t := p.name(); string(t.bytes()) {
			case "text":
				s.kind = sourceText
			case "content":
				s.kind = sourceContent
			default:
				s.kind = sourceMedia
			}
		case "data":
			s.data = p.text()
		case "content":
			s.content = p.content()
		default:
			p.skip()
		}
	})
	return s
}

// itemKind is what an element of a Responses input is, by its type.
type itemKind uint8

const (
	itemOther   itemKind = iota
	itemMessage          // counts its content (no type is a message)
	itemCall             // counts its name and arguments
	itemCustom           // counts its name and input
	itemOutput           // counts its output
)

var itemKinds = map[string]itemKind{
	"message":                 itemMessage,
	"function_call":           itemCall,
	"custom_tool_call":        itemCustom,
	"function_call_output":    itemOutput,
	"custom_tool_call_output": itemOutput,
}

// item reads an element of a Responses input.
func (p *parser) item() tally {
	o := p.typed()
	kind := itemMessage
	if o.typed {
		kind = itemKinds[string(o.typ.bytes())]
	}
	switch kind {
	case itemMessage:
		return o.content
	case itemCall:
		return tally{chars: o.name + o.arguments}
	case itemCustom:
		return tally{chars: o.name + o.input}
	case itemOutput:
		return o.output
	}
	return tally{}
}
