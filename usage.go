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
// response.completed) object. Only its numeric members are read, and the
// objects of its "iterations" array (Anthropic's server-side compaction):
//
//	OpenAI chat/completions/embeddings  prompt_tokens completion_tokens total_tokens
//	OpenAI Responses                    input_tokens output_tokens total_tokens
//	Anthropic messages                  input_tokens output_tokens
//	                                    cache_creation_input_tokens cache_read_input_tokens
//	                                    iterations[]: the same four, per sampling iteration
//	Gemini                              promptTokenCount candidatesTokenCount totalTokenCount
//	                                    thoughtsTokenCount toolUsePromptTokenCount
//	                                    (cachedContentTokenCount is part of promptTokenCount)
//
// A response may report usage more than once, and each shape says what a
// later report means; the meter follows the shape, not the largest number:
//
//   - Per field, the latest reported value wins. Anthropic's message_delta
//     is cumulative: the fields it reports are final, the ones it omits keep
//     message_start's. OpenAI reports once, so latest is the only value.
//   - A usage object with Gemini counts (usageMetadata) is a whole snapshot
//     of them: Gemini's running usageMetadata can go down from one chunk to
//     the next, and its last report is the count. Once the object closes,
//     the Gemini fields it did not report are dropped.
//   - An "iterations" array lists every sampling iteration of a compacted
//     Anthropic response, whose top-level fields cover only the last one;
//     billing and rate limits count them all, so the sum over the latest
//     such array (input + output + cache creation + cache read of each) is
//     the Anthropic charge. A later usage object without the array leaves it.
//
// Reports are applied as they are read, not held until their object closes:
// a value counts as soon as its number ends, so a stream cut anywhere is
// charged what it had reported by then. What a report replaces is let go
// only once it is known to be replaced: an earlier Gemini field when the new
// snapshot closes without it, an earlier iterations sum when the new array
// closes (until then the larger of the two is charged: a cut array lists
// only the first iterations).
//
// The charge is what the provider says the request cost, cached input
// included: the reported total where there is one (OpenAI total_tokens,
// Gemini totalTokenCount, the iterations sum), and the sum of the parts where
// there is not (Anthropic). A total smaller than the sum of its own parts is
// not believed: the sum is charged then. A usage object that mixes families
// is charged its largest family, once. See usageTally.tokens.
//
// Memory per response is bounded whatever the body: the JSON scanner is a
// byte-at-a-time state machine that holds no part of the body (a few dozen
// bytes of state), the SSE scanner holds one event of at most maxUsageEvent
// bytes, and a compressed body adds its decoder's window (32 KiB for
// gzip/deflate, at most 8 MiB for zstd, at most 16 MiB for brotli).
//
// Compressed bodies are decoded from the meter's own copy: see usage_decode.go.

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
)

const (
	// maxUsageEvent bounds the bytes of one SSE event (all its lines and line
	// ends). A larger event is skipped; if it was the one carrying usage, the
	// response is unmetered.
	maxUsageEvent = 1 << 20

	// maxUsageValue caps each reported count so that sums cannot overflow.
	maxUsageValue = 1 << 40
)

// usageBody is how a response body is read.
type usageBody uint8

const (
	usageBodyNone usageBody = iota // not metered: Write does nothing
	usageBodyJSON
	usageBodySSE
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

// mediaType is a Content-Type's media type, in the case it was sent (compare
// with strings.EqualFold): what mime.ParseMediaType returns for a valid one,
// without parsing and allocating the parameters.
func mediaType(contentType string) string {
	if i := strings.IndexByte(contentType, ';'); i >= 0 {
		contentType = contentType[:i]
	}
	return strings.TrimSpace(contentType)
}

// usageBodyOf tells the body's shape from its Content-Type.
func usageBodyOf(h http.Header) usageBody {
	if h == nil {
		return usageBodyNone
	}
	ct := mediaType(h.Get("Content-Type"))
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

// --- the tally ---

// usageField is one of the usage counts the meter reads.
type usageField uint8

const (
	usageFieldNone usageField = iota
	// OpenAI chat completions, completions, embeddings
	usageFieldPromptTokens
	usageFieldCompletionTokens
	usageFieldTotalTokens // also the Responses API
	// OpenAI Responses, Anthropic (these four in this order: an iteration's
	// counts are kept by them, see usageTally.recordIteration)
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

// usageFieldsGemini are the Gemini fields: a usage object that reports any
// of them is a snapshot of them all.
const usageFieldsGemini = 1<<usageFieldPromptTokenCount | 1<<usageFieldCandidatesTokenCount |
	1<<usageFieldTotalTokenCount | 1<<usageFieldThoughtsTokenCount |
	1<<usageFieldToolUsePromptTokenCount | 1<<usageFieldCachedContentTokenCount

// usageTally is what a response has reported so far, by the rules in the
// comment at the top of this file. The JSON scanner tells it where usage
// objects and iterations open and close, and each count it reads.
type usageTally struct {
	v    [usageFieldCount]int64 // the latest value of each field
	seen uint32                 // bit f: field f was reported (and not dropped since)
	snap uint32                 // bit f: field f was reported in the usage object being read

	iter usageIterations
}

// usageIterations sums Anthropic's usage.iterations arrays.
type usageIterations struct {
	seen bool     // an iterations array was opened
	open bool     // the latest array has not closed (yet, or ever: a cut body)
	sum  int64    // the latest closed array's sum; while one is open, the sum it replaces
	run  int64    // the open array: the sum of its closed iterations
	cur  [4]int64 // the open iteration: input, output, cache creation, cache read
}

// openUsage starts a usage object.
func (t *usageTally) openUsage() { t.snap = 0 }

// closeUsage ends a usage object: if it was a Gemini snapshot, the Gemini
// fields it did not report are gone.
func (t *usageTally) closeUsage() {
	if t.snap&usageFieldsGemini == 0 {
		return
	}
	drop := usageFieldsGemini &^ t.snap
	t.seen &^= drop
	for f := range usageFieldCount {
		if drop&(1<<f) != 0 {
			t.v[f] = 0
		}
	}
}

// record takes a usage object's count: the latest value of a field wins.
func (t *usageTally) record(f usageField, n int64) {
	if f == usageFieldNone || f >= usageFieldCount {
		return
	}
	t.seen |= 1 << f
	t.snap |= 1 << f
	t.v[f] = n
}

// openIterations starts an iterations array, which replaces any earlier one
// once it closes. An earlier one that never closed (its event was cut) is
// what it had summed by then.
func (t *usageTally) openIterations() {
	it := &t.iter
	it.sum = it.charge()
	it.seen, it.open = true, true
	it.run, it.cur = 0, [4]int64{}
}

func (t *usageTally) closeIterations() {
	it := &t.iter
	it.sum, it.open = it.run, false
}

func (t *usageTally) openIteration() { t.iter.cur = [4]int64{} }

func (t *usageTally) closeIteration() {
	it := &t.iter
	it.run = min(it.summed(), maxUsageValue)
	it.cur = [4]int64{}
}

// recordIteration takes an iteration's count: the latest value of a field in
// the iteration wins. Only Anthropic's four counts are summed (the nested
// cache_creation breakdown is not read: it is part of
// cache_creation_input_tokens).
func (t *usageTally) recordIteration(f usageField, n int64) {
	switch f {
	case usageFieldInputTokens, usageFieldOutputTokens,
		usageFieldCacheCreationInputTokens, usageFieldCacheReadInputTokens:
		t.iter.cur[f-usageFieldInputTokens] = n
	}
}

// charge is the iterations sum to charge: the latest array's, or while it
// is open, the larger of what it has summed so far and the sum it replaces.
func (it *usageIterations) charge() int64 {
	if it.open {
		return max(it.sum, it.summed())
	}
	return it.sum
}

// summed is what the open array has summed so far.
func (it *usageIterations) summed() int64 {
	return it.run + it.cur[0] + it.cur[1] + it.cur[2] + it.cur[3]
}

// tokens is the charge: the largest of what each provider family's fields
// add up to, so that a usage object that mixes families (some compatible
// backends echo OpenAI and Anthropic names) is not charged twice.
//
//	OpenAI     total_tokens, or prompt_tokens + completion_tokens
//	Responses  total_tokens, or input_tokens + output_tokens
//	Anthropic  the iterations sum, or input_tokens + output_tokens +
//	           cache_creation_input_tokens + cache_read_input_tokens
//	Gemini     totalTokenCount, or promptTokenCount + candidatesTokenCount +
//	           thoughtsTokenCount + toolUsePromptTokenCount (the prompt count
//	           includes cachedContentTokenCount already)
//
// Where a total is reported it is what the provider charges; a total smaller
// than the parts reported beside it is taken to have left some out, and the
// parts are charged instead. The iterations sum is such a total: the
// top-level fields of a compacted response are its last iteration.
func (t *usageTally) tokens() (int64, bool) {
	if t.seen == 0 && !t.iter.seen {
		return 0, false
	}
	v := &t.v
	openai := max(v[usageFieldTotalTokens], v[usageFieldPromptTokens]+v[usageFieldCompletionTokens])
	anthropic := max(v[usageFieldTotalTokens], t.iter.charge(), v[usageFieldInputTokens]+v[usageFieldOutputTokens]+
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
