package ratelimit

// The usage meter: the response-writer wrapper tees every byte of an admitted
// response body into a usageMeter, and when the body ends the meter says how
// many tokens the upstream reported, so that exactly those are charged.
//
// What is read, by Content-Type (the request is never looked at):
//
//   - application/json and any */*+json: one JSON body (or several top-level
//     values, or one top-level array of them, as Gemini's streamGenerateContent
//     answers without alt=sse). Each top-level object is a document.
//   - text/event-stream: each event's data payload is a document.
//
// In a document, the usage object is the value of the top-level key "usage"
// or "usageMetadata", or of the "usage" key inside the top-level "message"
// (Anthropic's message_start) or "response" (the Responses API's
// response.completed) object. Only its numeric members are read:
//
//	OpenAI chat/completions/embeddings  prompt_tokens completion_tokens total_tokens
//	OpenAI Responses                    input_tokens output_tokens total_tokens
//	Anthropic messages                  input_tokens output_tokens
//	                                    cache_creation_input_tokens cache_read_input_tokens
//	Gemini                              promptTokenCount candidatesTokenCount totalTokenCount
//	                                    thoughtsTokenCount toolUsePromptTokenCount
//	                                    (cachedContentTokenCount is part of promptTokenCount)
//
// Streams report usage more than once (Anthropic's message_start and its
// cumulative message_delta, Gemini's running usageMetadata on every chunk), so
// the meter keeps the largest value seen per field over the whole response.
// The charge is what the provider says the request cost, cached input
// included: the reported total where there is one (OpenAI total_tokens,
// Gemini totalTokenCount), and the sum of the parts where there is not
// (Anthropic). A total smaller than the sum of its own parts is not believed:
// the sum is charged then. See usageTally.tokens.
//
// Memory per response is bounded whatever the body: the JSON scanner is a
// byte-at-a-time state machine that holds no part of the body (a few dozen
// bytes of state), the SSE scanner holds one event of at most maxUsageEvent
// bytes, and a compressed body adds its decoder's window (32 KiB for
// gzip/deflate, at most 8 MiB for zstd, at most 16 MiB for brotli).
//
// Compressed bodies (Content-Encoding gzip, x-gzip, deflate, br, zstd) are
// decoded from the meter's own copy. Decoders pull their input while Write is
// pushed bytes, so each compressed body runs its decoder in a coroutine
// (iter.Pull): Write hands p to the decoder and switches to it on the calling
// goroutine; the decoder runs until it has consumed all of p and asks for more,
// which switches back, and Write returns. There is no buffering of the
// compressed input, no lock, no channel and no second goroutine running
// concurrently: the decoding is done synchronously on the client path and costs
// what decoding len(p) bytes costs, and the decoded bytes are capped per
// response (maxDecodedBody) so that a decompression bomb cannot make a Write
// slow. Finish ends the coroutine (its goroutine exits), so nothing outlives
// Finish. An unknown or layered encoding, or corrupt compressed data, leaves
// the response unmetered; a compressed body cut short (client gone, upstream
// reset) is metered with what was decoded by then.

import (
	"bytes"
	"errors"
	"io"
	"iter"
	"net/http"
	"strconv"
	"strings"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

const (
	// maxUsageEvent bounds the bytes of one SSE event (all its lines and line
	// ends). A larger event is skipped; if it was the one carrying usage, the
	// response is unmetered.
	maxUsageEvent = 1 << 20

	// maxDecodedBody bounds the decoded bytes of one compressed body. Past it
	// the meter stops decoding and keeps what it had found: it bounds the CPU
	// a decompression bomb can cost on the client path. An embeddings answer
	// for 2048 inputs of 3072 float dimensions is about 130 MB of JSON.
	maxDecodedBody = 256 << 20

	// maxUsageValue caps each reported count so that sums cannot overflow.
	maxUsageValue = 1 << 40

	// usageDecodeBuffer is the size of the buffer decoded bytes are read into.
	usageDecodeBuffer = 16 << 10

	// usageZstdMaxWindow: RFC 9659 limits the window of the "zstd" content
	// coding to 8 MB, and browsers refuse more; so does the meter (a frame
	// written as a single segment has its whole content as its window, so
	// such a frame of more than 8 MiB is refused: unmetered).
	usageZstdMaxWindow = 8 << 20
)

// usageBody is how a response body is read.
type usageBody uint8

const (
	usageBodyNone usageBody = iota // not metered: Write does nothing
	usageBodyJSON
	usageBodySSE
)

// usageCoding is a response's Content-Encoding.
type usageCoding uint8

const (
	usageCodingIdentity usageCoding = iota
	usageCodingGzip
	usageCodingDeflate
	usageCodingBrotli
	usageCodingZstd
	usageCodingUnsupported
)

// usageMeter reads one response body for the usage its upstream reports. It
// is not safe for concurrent use: Write and Finish are called in sequence (from
// any goroutines, one after another).
type usageMeter struct {
	body   usageBody
	coding usageCoding

	tally usageTally
	json  usageJSONScanner // the JSON body, or one SSE event's data at a time
	sse   *sseScanner      // SSE bodies only

	oversize int  // SSE events skipped for their size
	failed   bool // corrupt data or an internal fault: unmetered whatever was found
	panicked any  // the internal fault, if any (tests look at it)
	stopped  bool // nothing more is read (Finish was called, or decoding ended)
	finished bool

	// compressed bodies only
	src     usageSource
	next    func() (struct{}, bool) // resumes the decoder coroutine
	stop    func()                  // ends it
	decoded int64                   // decoded bytes so far
}

// newUsageMeter starts metering a response with the given response header
// (Content-Type, Content-Encoding are what matter).
func newUsageMeter(h http.Header) *usageMeter {
	m := &usageMeter{}
	m.body = usageBodyOf(h)
	m.coding = usageCodingOf(h)
	if m.coding == usageCodingUnsupported {
		m.body = usageBodyNone
	}
	m.json.tally = &m.tally
	m.json.reset()
	if m.body == usageBodySSE {
		m.sse = newSSEScanner(maxUsageEvent, m.onEvent)
	}
	if m.body == usageBodyNone {
		m.stopped = true
	}
	return m
}

// usageBodyOf tells the body's shape from its Content-Type.
func usageBodyOf(h http.Header) usageBody {
	if h == nil {
		return usageBodyNone
	}
	ct := h.Get("Content-Type")
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = strings.TrimSpace(ct)
	switch {
	case strings.EqualFold(ct, "text/event-stream"):
		return usageBodySSE
	case strings.EqualFold(ct, "application/json"):
		return usageBodyJSON
	case len(ct) > len("+json") && strings.IndexByte(ct, '/') > 0 &&
		strings.EqualFold(ct[len(ct)-len("+json"):], "+json"):
		return usageBodyJSON
	}
	return usageBodyNone
}

// usageCodingOf reads Content-Encoding. Codings applied one over another
// ("gzip, br") are not decoded: such a body is unsupported.
func usageCodingOf(h http.Header) usageCoding {
	c := usageCodingIdentity
	if h == nil {
		return c
	}
	for _, v := range h.Values("Content-Encoding") {
		for part := range strings.SplitSeq(v, ",") {
			t := strings.TrimSpace(part)
			var this usageCoding
			switch {
			case t == "" || strings.EqualFold(t, "identity"):
				continue
			case strings.EqualFold(t, "gzip") || strings.EqualFold(t, "x-gzip"):
				this = usageCodingGzip
			case strings.EqualFold(t, "deflate"):
				this = usageCodingDeflate
			case strings.EqualFold(t, "br"):
				this = usageCodingBrotli
			case strings.EqualFold(t, "zstd"):
				this = usageCodingZstd
			default:
				return usageCodingUnsupported
			}
			if c != usageCodingIdentity {
				return usageCodingUnsupported
			}
			c = this
		}
	}
	return c
}

// Write takes the next body bytes as they go to the client. It never fails,
// never blocks for long, never retains p after returning, and never panics on any input.
func (m *usageMeter) Write(p []byte) (int, error) {
	if m.stopped || len(p) == 0 {
		return len(p), nil
	}
	defer m.recoverFault()
	if m.coding == usageCodingIdentity {
		m.feed(p)
	} else {
		m.decodeMore(p)
	}
	return len(p), nil
}

// Finish ends the body (also called when the client went away mid-stream)
// and returns the tokens to charge, and whether any usage was found. After a
// partial stream it returns what was reported by then.
func (m *usageMeter) Finish() (tokens int64, metered bool) {
	if !m.finished {
		m.finished = true
		m.finish()
	}
	if m.failed {
		return 0, false
	}
	return m.tally.tokens()
}

func (m *usageMeter) finish() {
	defer m.recoverFault()
	m.stopped = true
	if m.next != nil {
		// Let the decoder see the end of its input and drain what it holds.
		m.src.eof = true
		m.next()
		m.stop()
		m.next, m.stop = nil, nil
	}
	if m.sse != nil && !m.failed {
		// An event the stream ended in without its blank line still counts:
		// a truncated stream is metered with what it reported.
		m.sse.Flush()
	}
	m.sse = nil
}

// recoverFault turns a panic (a bug: no input should cause one) into an
// unmetered response rather than a crashed request.
func (m *usageMeter) recoverFault() {
	if r := recover(); r != nil {
		m.panicked = r
		m.failed = true
		m.stopped = true
	}
}

// feed reads decoded body bytes.
func (m *usageMeter) feed(p []byte) {
	if m.body == usageBodySSE {
		m.sse.Write(p)
	} else {
		m.json.write(p)
	}
}

// onEvent reads one SSE event. An event that cannot carry usage costs one
// substring search and no allocation.
func (m *usageMeter) onEvent(ev sseEvent) {
	if ev.Oversize {
		m.oversize++
		return
	}
	if !mayCarryUsage(ev.Data) {
		return
	}
	m.json.reset()
	m.json.write(ev.Data)
}

// mayCarryUsage reports whether data has a "usage" or "usageMetadata" key
// whose value is not null. OpenAI chunks of a stream with include_usage all
// carry "usage":null, so the mere substring is not enough to be worth a scan.
// It may say yes wrongly (the key in a nested object, or text that looks like
// one): the scan decides. It looks for the key's 'g', the rarest of its bytes
// in JSON and English text alike, so that most events cost one IndexByte.
func mayCarryUsage(data []byte) bool {
	const key = `"usage`
	const g = 4 // key[g] == 'g'
	for i := g; i < len(data); {
		j := bytes.IndexByte(data[i:], 'g')
		if j < 0 {
			return false
		}
		i += j + 1
		if i-1-g < 0 || string(data[i-1-g:min(i+1, len(data))]) != key {
			continue
		}
		rest := data[i+1:]
		if bytes.HasPrefix(rest, []byte("Metadata")) {
			rest = rest[len("Metadata"):]
		}
		if len(rest) == 0 || rest[0] != '"' {
			continue
		}
		rest = usageTrimSpace(rest[1:])
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		rest = usageTrimSpace(rest[1:])
		if bytes.HasPrefix(rest, []byte("null")) {
			continue
		}
		return true
	}
	return false
}

func usageTrimSpace(b []byte) []byte {
	for len(b) > 0 && usageIsSpace(b[0]) {
		b = b[1:]
	}
	return b
}

func usageIsSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

// --- compressed bodies ---

// errUsageStopped is what the decoder's input returns once the meter has
// stopped the coroutine.
var errUsageStopped = errors.New("usage meter stopped")

// usageSource is the decoder's input: the p of the Write in progress. When it
// is used up, Read suspends the decoder coroutine (yield) until the next Write
// or Finish resumes it.
type usageSource struct {
	p     []byte // the bytes of the Write in progress; nil between Writes
	eof   bool   // Finish was called: no more bytes will come
	yield func(struct{}) bool
}

func (s *usageSource) Read(b []byte) (int, error) {
	for len(s.p) == 0 {
		if s.eof {
			return 0, io.EOF
		}
		if s.yield == nil || !s.yield(struct{}{}) {
			return 0, errUsageStopped
		}
	}
	n := copy(b, s.p)
	s.p = s.p[n:]
	return n, nil
}

// decodeMore hands p to the decoder coroutine, starting it on the first
// Write, and returns once the decoder has consumed all of p.
func (m *usageMeter) decodeMore(p []byte) {
	if m.next == nil {
		m.next, m.stop = iter.Pull(m.decode)
	}
	m.src.p = p
	_, running := m.next()
	m.src.p = nil // p is not retained
	if !running {
		// The decoder ended (its stream's end, an error, or the cap): the
		// rest of the body is not read. Finish still stops the coroutine.
		m.stopped = true
	}
}

// decode is the decoder coroutine: it decodes the body and feeds the decoded
// bytes to the scanner until its input ends or fails.
func (m *usageMeter) decode(yield func(struct{}) bool) {
	m.src.yield = yield
	defer func() {
		m.src.yield = nil
		if r := recover(); r != nil {
			m.panicked = r
			m.failed = true
		}
	}()
	dec, closeDec, err := newUsageDecoder(m.coding, &m.src)
	if closeDec != nil {
		defer closeDec()
	}
	if err != nil {
		m.decodeFailed(err)
		return
	}
	buf := make([]byte, usageDecodeBuffer)
	for idle := 0; idle < 100; {
		n, err := dec.Read(buf)
		if n > 0 {
			m.decoded += int64(n)
			if m.decoded > maxDecodedBody {
				return // keep what was found: see maxDecodedBody
			}
			m.feed(buf[:n])
		}
		if err != nil {
			m.decodeFailed(err)
			return
		}
		if n == 0 {
			idle++ // a decoder that neither progresses nor fails is given up
		} else {
			idle = 0
		}
	}
}

// decodeFailed classifies the error that ended decoding: the stream's end,
// or the body cut short after Finish, keep what was found; anything else is
// corrupt data and leaves the response unmetered.
func (m *usageMeter) decodeFailed(err error) {
	switch {
	case err == io.EOF, errors.Is(err, errUsageStopped):
	case m.src.eof && errors.Is(err, io.ErrUnexpectedEOF):
	case m.coding == usageCodingBrotli && err.Error() == usageBrotliExcessInput:
		// The brotli stream reached its end: all of it was decoded. The
		// decoder says so with this error when bytes follow the end, and
		// also, wrongly, when the stream came in very small reads (its
		// internal bit buffer is then left non-empty at the end).
	default:
		m.failed = true
	}
}

// usageBrotliExcessInput is the message of andybalholm/brotli's unexported
// errExcessiveInput.
const usageBrotliExcessInput = "brotli: excessive input"

// newUsageDecoder returns a reader of the decoded body and what releases it.
func newUsageDecoder(c usageCoding, r io.Reader) (io.Reader, func(), error) {
	switch c {
	case usageCodingGzip:
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, err
		}
		return z, func() { z.Close() }, nil
	case usageCodingDeflate:
		// HTTP's deflate is zlib-wrapped (RFC 9110), but some servers send raw
		// deflate: tell them apart by the zlib header, as browsers do.
		var hdr [2]byte
		n, err := io.ReadFull(r, hdr[:])
		if err != nil {
			if n == 0 && err == io.EOF {
				return nil, nil, io.EOF
			}
			return nil, nil, err
		}
		in := io.MultiReader(bytes.NewReader(hdr[:]), r)
		if usageIsZlibHeader(hdr[0], hdr[1]) {
			z, err := zlib.NewReader(in)
			if err != nil {
				return nil, nil, err
			}
			return z, func() { z.Close() }, nil
		}
		f := flate.NewReader(in)
		return f, func() { f.Close() }, nil
	case usageCodingBrotli:
		return brotli.NewReader(r), nil, nil
	case usageCodingZstd:
		d, err := zstd.NewReader(r,
			zstd.WithDecoderConcurrency(1), // decode on the calling goroutine
			zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(usageZstdMaxWindow),
			zstd.WithDecoderMaxMemory(usageZstdMaxWindow))
		if d == nil {
			return nil, nil, err
		}
		return d, d.Close, err
	}
	return nil, nil, errors.New("unsupported content coding")
}

// usageIsZlibHeader reports whether two bytes open a zlib stream (RFC 1950):
// method 8 (deflate), a window of at most 32 KiB, and a valid check value.
func usageIsZlibHeader(cmf, flg byte) bool {
	return cmf&0x0f == 8 && cmf>>4 <= 7 && (uint16(cmf)<<8|uint16(flg))%31 == 0
}

// --- the tally ---

// usageField is one of the usage counts the meter reads.
type usageField uint8

const (
	usageFieldNone usageField = iota
	// OpenAI chat completions, completions, embeddings
	usageFieldPromptTokens
	usageFieldCompletionTokens
	usageFieldTotalTokens // also the Responses API
	// OpenAI Responses, Anthropic
	usageFieldInputTokens
	usageFieldOutputTokens
	// Anthropic
	usageFieldCacheCreationInputTokens
	usageFieldCacheReadInputTokens
	// Gemini
	usageFieldPromptTokenCount
	usageFieldCandidatesTokenCount
	usageFieldTotalTokenCount
	usageFieldThoughtsTokenCount
	usageFieldToolUsePromptTokenCount
	usageFieldCachedContentTokenCount
	usageFieldCount
)

// usageFieldOf names the field a usage object's key is, if any.
func usageFieldOf(key []byte) usageField {
	switch string(key) {
	case "prompt_tokens":
		return usageFieldPromptTokens
	case "completion_tokens":
		return usageFieldCompletionTokens
	case "total_tokens":
		return usageFieldTotalTokens
	case "input_tokens":
		return usageFieldInputTokens
	case "output_tokens":
		return usageFieldOutputTokens
	case "cache_creation_input_tokens":
		return usageFieldCacheCreationInputTokens
	case "cache_read_input_tokens":
		return usageFieldCacheReadInputTokens
	case "promptTokenCount":
		return usageFieldPromptTokenCount
	case "candidatesTokenCount":
		return usageFieldCandidatesTokenCount
	case "totalTokenCount":
		return usageFieldTotalTokenCount
	case "thoughtsTokenCount":
		return usageFieldThoughtsTokenCount
	case "toolUsePromptTokenCount":
		return usageFieldToolUsePromptTokenCount
	case "cachedContentTokenCount":
		return usageFieldCachedContentTokenCount
	}
	return usageFieldNone
}

// usageTally is the largest value reported for each field over a response.
type usageTally struct {
	v    [usageFieldCount]int64
	seen uint32 // bit f: field f was reported
}

func (t *usageTally) record(f usageField, n int64) {
	if f == usageFieldNone || f >= usageFieldCount {
		return
	}
	t.seen |= 1 << f
	if n > t.v[f] {
		t.v[f] = n
	}
}

// tokens is the charge: the largest of what each provider family's fields
// add up to, so that a usage object that mixes families (some compatible
// backends echo OpenAI and Anthropic names) is not charged twice.
//
//	OpenAI     total_tokens, or prompt_tokens + completion_tokens
//	Responses  total_tokens, or input_tokens + output_tokens
//	Anthropic  input_tokens + output_tokens + cache_creation_input_tokens + cache_read_input_tokens
//	Gemini     totalTokenCount, or promptTokenCount + candidatesTokenCount +
//	           thoughtsTokenCount + toolUsePromptTokenCount (the prompt count
//	           includes cachedContentTokenCount already)
//
// Where a total is reported it is what the provider charges; a total smaller
// than the parts reported beside it is taken to have left some out, and the
// parts are charged instead.
func (t *usageTally) tokens() (int64, bool) {
	if t.seen == 0 {
		return 0, false
	}
	v := &t.v
	openai := max(v[usageFieldTotalTokens], v[usageFieldPromptTokens]+v[usageFieldCompletionTokens])
	anthropic := max(v[usageFieldTotalTokens], v[usageFieldInputTokens]+v[usageFieldOutputTokens]+
		v[usageFieldCacheCreationInputTokens]+v[usageFieldCacheReadInputTokens])
	gemini := max(v[usageFieldTotalTokenCount], v[usageFieldPromptTokenCount]+v[usageFieldCandidatesTokenCount]+
		v[usageFieldThoughtsTokenCount]+v[usageFieldToolUsePromptTokenCount])
	return max(openai, anthropic, gemini), true
}

// parseUsageCount reads a JSON number as a token count: a non-negative
// integer (a fraction is dropped), capped at maxUsageValue. Anything else (a
// negative number, a literal, a malformed number) is not a count.
func parseUsageCount(b []byte) (int64, bool) {
	if len(b) == 0 || b[0] == '-' {
		return 0, false
	}
	var n int64
	i := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if n < maxUsageValue {
			n = n*10 + int64(b[i]-'0')
		}
	}
	if i == 0 {
		return 0, false
	}
	if i < len(b) {
		// 12.0, 1.2e3: rare enough to go through strconv.
		f, err := strconv.ParseFloat(string(b), 64)
		if err != nil || f < 0 {
			return 0, false
		}
		if f >= maxUsageValue {
			return maxUsageValue, true
		}
		return int64(f), true
	}
	return min(n, maxUsageValue), true
}

// --- the JSON scanner ---

// usageRole is what an open container that the scanner follows is.
type usageRole uint8

const (
	usageRoleNone    usageRole = iota // nothing in it matters: it is skipped
	usageRoleRoot                     // a document: its usage, usageMetadata, message and response keys matter
	usageRoleWrapper                  // a root's "message" or "response": its usage key matters
	usageRoleUsage                    // a usage object: its numeric members are tallied
	usageRoleList                     // a top-level array: its objects are documents
)

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
// follows (at most four deep: list, document, wrapper, usage), a depth count
// of the containers it skips, and the current key or number (at most 32 bytes
// each). Skipped strings and containers are crossed with bytes.IndexByte and
// a lookup table. Malformed JSON stops the scan (what was tallied stays).
// Keys are compared as written: an escaped key never matches.
type usageJSONScanner struct {
	tally *usageTally

	state usageJSONState
	stack [4]usageRole // the containers followed, outermost first
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
		s.valField = usageFieldOf(k)
	}
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
				case usageRoleRoot, usageRoleWrapper, usageRoleUsage:
					if s.n == len(s.stack) {
						s.state = ujDead // cannot happen: roles nest at most four deep
						break
					}
					s.stack[s.n] = s.valRole
					s.n++
					s.state = ujKeyOrEnd
				default:
					s.skip = 1
					s.state = ujSkip
				}
			case c == '[':
				i++
				if s.n == 0 {
					s.stack[0] = usageRoleList
					s.n = 1
					s.valRole, s.valField = usageRoleRoot, usageFieldNone
				} else {
					s.skip = 1
					s.state = ujSkip
				}
			case c == ']' && s.top() == usageRoleList: // [] or a trailing comma
				i++
				s.n--
				s.valueDone()
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
						s.tally.record(s.valField, v)
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
				s.n--
				s.valueDone()
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
				if top == usageRoleList {
					s.valRole, s.valField = usageRoleRoot, usageFieldNone
					s.state = ujValue
				} else {
					s.state = ujKeyOrEnd
				}
			case c == '}' && top != usageRoleList:
				i++
				s.n--
				s.valueDone()
			case c == ']' && top == usageRoleList:
				i++
				s.n--
				s.valueDone()
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

// --- SSE framing ---

// sseEvent is one server-sent event, as an sseScanner reports it.
type sseEvent struct {
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

// sseScanner splits a text/event-stream byte stream into events, following
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
//	s := newSSEScanner(maxUsageEvent, func(ev sseEvent) { ... })
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
// added, see isUsageOnlyChunk) can hold back the bytes of the event in
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
type sseScanner struct {
	onEvent  func(sseEvent)
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

// sseKeepBuffer is the most scratch memory an sseScanner keeps between
// events; a bigger event's buffers are let go once it is read.
const sseKeepBuffer = 64 << 10

// newSSEScanner returns a scanner that calls onEvent for each event and
// skips (reporting them as Oversize) events of more than maxEvent bytes.
func newSSEScanner(maxEvent int, onEvent func(sseEvent)) *sseScanner {
	return &sseScanner{onEvent: onEvent, maxEvent: maxEvent}
}

// Write feeds the next bytes of the stream.
func (s *sseScanner) Write(p []byte) {
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
func (s *sseScanner) Flush() {
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
func (s *sseScanner) appendLine(b []byte) {
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
func (s *sseScanner) endCutLine(term int, next int64) {
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
func (s *sseScanner) lineEnded(line []byte, n, term int, start, next int64) {
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
func (s *sseScanner) dispatch(end int64) {
	switch {
	case s.over:
		s.onEvent(sseEvent{Name: s.name, Oversize: true, Start: s.start, End: end})
	case s.hasData:
		s.onEvent(sseEvent{Data: s.data, Name: s.name, Start: s.start, End: end})
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

// --- the usage-only chunk ---

// isUsageOnlyChunk reports whether an SSE data payload is an OpenAI chat-completions chunk with an empty "choices" array and a non-null "usage" (the chunk that stream_options.include_usage adds).
//
// The payload must be one well-formed JSON object whose "choices" is [] and
// whose "usage" is an object; nothing else about it is required (compatible
// backends differ in "object", "id" and the like). It does not allocate.
func isUsageOnlyChunk(data []byte) bool {
	if !bytes.Contains(data, []byte(`"choices"`)) || !bytes.Contains(data, []byte(`"usage"`)) {
		return false
	}
	i := usageSkipSpaceAt(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = usageSkipSpaceAt(data, i+1)
	var emptyChoices, usageObject bool
	if i < len(data) && data[i] == '}' {
		return false
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return false
		}
		end := usageSkipJSON(data, i)
		if end < 0 {
			return false
		}
		key := data[i+1 : end-1]
		i = usageSkipSpaceAt(data, end)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		i = usageSkipSpaceAt(data, i+1)
		end = usageSkipJSON(data, i)
		if end < 0 {
			return false
		}
		val := data[i:end]
		switch string(key) {
		case "choices":
			emptyChoices = val[0] == '[' && usageSkipSpaceAt(val, 1) == len(val)-1
		case "usage":
			usageObject = val[0] == '{'
		}
		i = usageSkipSpaceAt(data, end)
		if i >= len(data) {
			return false
		}
		if data[i] == '}' {
			break
		}
		if data[i] != ',' {
			return false
		}
		i = usageSkipSpaceAt(data, i+1)
	}
	return usageSkipSpaceAt(data, i+1) == len(data) && emptyChoices && usageObject
}

func usageSkipSpaceAt(b []byte, i int) int {
	for i < len(b) && usageIsSpace(b[i]) {
		i++
	}
	return i
}

// usageSkipJSON returns the index just after the JSON value that starts at
// b[i], or -1 if there is none. Containers must nest properly (at most 64
// deep); scalars are not validated beyond their alphabet.
func usageSkipJSON(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	var stack uint64 // bit d: the container at depth d is an array
	depth := 0
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			if i = usageSkipJSONString(b, i+1); i < 0 {
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
		case usageScalarTable[c]:
			if depth == 0 {
				for i < len(b) && usageScalarTable[b[i]] {
					i++
				}
				return i
			}
			i++
			continue
		case depth > 0 && (usageIsSpace(c) || c == ',' || c == ':'):
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

// usageSkipJSONString returns the index just after the closing quote of the
// string whose contents start at b[i], or -1 if it does not close. Each byte
// is looked at a bounded number of times however many escapes there are.
func usageSkipJSONString(b []byte, i int) int {
	q := -1
	for {
		if q < i {
			r := bytes.IndexByte(b[i:], '"')
			if r < 0 {
				return -1
			}
			q = i + r
		}
		bs := bytes.IndexByte(b[i:q], '\\')
		if bs < 0 {
			return q + 1
		}
		i += bs + 2
		if i > len(b) {
			return -1
		}
	}
}
