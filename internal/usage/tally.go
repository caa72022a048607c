package usage

import "strconv"

// field is one of the usage counts the meter reads.
type field uint8

const (
	fieldNone field = iota
	// OpenAI chat completions, legacy completions and embeddings
	fieldPromptTokens
	fieldCompletionTokens
	fieldTotalTokens // also the Responses API
	// OpenAI Responses, Anthropic (these four in this order: Anthropic's
	// counts are kept by them, see anthropicCounts)
	fieldInputTokens
	fieldOutputTokens
	// Anthropic
	fieldCacheCreationInputTokens
	fieldCacheReadInputTokens
	// Gemini
	fieldPromptTokenCount
	fieldCandidatesTokenCount
	fieldTotalTokenCount
	fieldThoughtsTokenCount
	fieldToolUsePromptTokenCount
	fieldCachedContentTokenCount
	// OpenAI: the members of the usage object's nested details objects (see
	// detailsOf), never the usage object's own
	fieldPromptCachedTokens        // prompt_tokens_details.cached_tokens
	fieldPromptAudioTokens         // prompt_tokens_details.audio_tokens
	fieldCompletionReasoningTokens // completion_tokens_details.reasoning_tokens
	fieldCompletionAudioTokens     // completion_tokens_details.audio_tokens
	fieldInputCachedTokens         // input_tokens_details.cached_tokens (Responses), input_token_details.cached_tokens (Realtime)
	fieldInputAudioTokens          // input_token_details.audio_tokens
	fieldOutputReasoningTokens     // output_tokens_details.reasoning_tokens
	fieldOutputAudioTokens         // output_token_details.audio_tokens
	// Bedrock: Converse's usage (inputTokens, …) and the same counts in
	// amazon-bedrock-invocationMetrics (inputTokenCount, …) and in
	// InvokeModel's x-amzn-bedrock-*-token-count headers
	fieldBedrockInputTokens // the input read from no cache and written to none
	fieldBedrockOutputTokens
	fieldBedrockTotalTokens
	fieldBedrockCacheReadTokens
	fieldBedrockCacheWriteTokens
	// Cohere: the members of usage.billed_units (see detailsOf)
	fieldBilledInputTokens
	fieldBilledOutputTokens
	fieldCount
)

// fieldOf names the field a usage object's key is, if any.
func fieldOf(key []byte) field {
	switch string(key) {
	case "prompt_tokens":
		return fieldPromptTokens
	case "completion_tokens":
		return fieldCompletionTokens
	case "total_tokens":
		return fieldTotalTokens
	case "input_tokens":
		return fieldInputTokens
	case "output_tokens":
		return fieldOutputTokens
	case "cache_creation_input_tokens":
		return fieldCacheCreationInputTokens
	case "cache_read_input_tokens":
		return fieldCacheReadInputTokens
	case "promptTokenCount":
		return fieldPromptTokenCount
	case "candidatesTokenCount":
		return fieldCandidatesTokenCount
	case "totalTokenCount":
		return fieldTotalTokenCount
	case "thoughtsTokenCount":
		return fieldThoughtsTokenCount
	case "toolUsePromptTokenCount":
		return fieldToolUsePromptTokenCount
	case "cachedContentTokenCount":
		return fieldCachedContentTokenCount
	case "inputTokens", "inputTokenCount":
		return fieldBedrockInputTokens
	case "outputTokens", "outputTokenCount":
		return fieldBedrockOutputTokens
	case "totalTokens":
		return fieldBedrockTotalTokens
	case "cacheReadInputTokens", "cacheReadInputTokenCount":
		return fieldBedrockCacheReadTokens
	case "cacheWriteInputTokens", "cacheWriteInputTokenCount":
		return fieldBedrockCacheWriteTokens
	}
	return fieldNone
}

// details is which nested details object of a usage object is being read.
type details uint8

const (
	detailsNone       details = iota
	detailsPrompt             // prompt_tokens_details: parts of prompt_tokens
	detailsCompletion         // completion_tokens_details: parts of completion_tokens
	detailsInput              // input_tokens_details, input_token_details: parts of input_tokens
	detailsOutput             // output_tokens_details, output_token_details: parts of output_tokens
	// detailsBilled is Cohere's billed_units: what Cohere bills, beside
	// its usage.tokens (what its model read and wrote), which is not read.
	detailsBilled
)

// detailsOf names the details object a usage object's key is, if any. The
// Responses API writes "tokens" ("input_tokens_details"), the Realtime API
// and audio transcriptions "token" ("input_token_details"): the same counts.
func detailsOf(key []byte) details {
	switch string(key) {
	case "prompt_tokens_details":
		return detailsPrompt
	case "completion_tokens_details":
		return detailsCompletion
	case "input_tokens_details", "input_token_details":
		return detailsInput
	case "output_tokens_details", "output_token_details":
		return detailsOutput
	case "billed_units":
		return detailsBilled
	}
	return detailsNone
}

// field names the count a details object's key is, if any. Only the parts
// that are priced apart are read: text_tokens, image_tokens,
// accepted_prediction_tokens and the like are not; nor Cohere's billed
// search_units and classifications, which are not tokens.
func (d details) field(key []byte) field {
	if d == detailsBilled {
		switch string(key) {
		case "input_tokens":
			return fieldBilledInputTokens
		case "output_tokens":
			return fieldBilledOutputTokens
		}
		return fieldNone
	}
	switch string(key) {
	case "cached_tokens":
		switch d {
		case detailsPrompt:
			return fieldPromptCachedTokens
		case detailsInput:
			return fieldInputCachedTokens
		}
	case "audio_tokens":
		switch d {
		case detailsPrompt:
			return fieldPromptAudioTokens
		case detailsCompletion:
			return fieldCompletionAudioTokens
		case detailsInput:
			return fieldInputAudioTokens
		case detailsOutput:
			return fieldOutputAudioTokens
		}
	case "reasoning_tokens":
		switch d {
		case detailsCompletion:
			return fieldCompletionReasoningTokens
		case detailsOutput:
			return fieldOutputReasoningTokens
		}
	}
	return fieldNone
}

// fieldsDetails are the fields of OpenAI's details objects: parts of other
// fields, which alone do not make a response metered (Cohere's billed
// units are whole counts: not among them).
const fieldsDetails = 1<<fieldPromptCachedTokens | 1<<fieldPromptAudioTokens |
	1<<fieldCompletionReasoningTokens | 1<<fieldCompletionAudioTokens |
	1<<fieldInputCachedTokens | 1<<fieldInputAudioTokens |
	1<<fieldOutputReasoningTokens | 1<<fieldOutputAudioTokens

// fieldsGemini are the Gemini fields: a usage object that reports any
// of them is a snapshot of them all.
const fieldsGemini = 1<<fieldPromptTokenCount | 1<<fieldCandidatesTokenCount |
	1<<fieldTotalTokenCount | 1<<fieldThoughtsTokenCount |
	1<<fieldToolUsePromptTokenCount | 1<<fieldCachedContentTokenCount

// Usage is what a response reports: the tokens a tpm counts (Total), the
// parts of them that input and output caps count (Input, Output), and the
// parts of those that are priced apart. Which whole each part is in, and
// whether it is inside it or beside it, depends on the provider: see the
// package comment (doc.go) and tally.usage.
type Usage struct {
	Total, Input, Output int64

	// UncachedInput is the input read from no prompt cache and written to
	// none: the part of Input that a model's input price prices (Input
	// less CacheRead for OpenAI and Gemini, less CacheWrite for
	// Anthropic).
	UncachedInput int64
	// CacheRead is input read from a prompt cache: inside Input for OpenAI
	// and Gemini, beside it (in Total only) for Anthropic.
	CacheRead int64
	// CacheWrite is input written to a prompt cache (Anthropic only), inside
	// Input.
	CacheWrite int64
	// Reasoning is output spent thinking, inside Output.
	Reasoning int64
	// AudioInput and AudioOutput are audio tokens (OpenAI only), inside Input
	// and Output.
	AudioInput, AudioOutput int64
}

// max is the larger of u and v, count by count.
func (u Usage) max(v Usage) Usage {
	return Usage{
		Total: max(u.Total, v.Total), Input: max(u.Input, v.Input), Output: max(u.Output, v.Output),
		UncachedInput: max(u.UncachedInput, v.UncachedInput),
		CacheRead:     max(u.CacheRead, v.CacheRead), CacheWrite: max(u.CacheWrite, v.CacheWrite),
		Reasoning:  max(u.Reasoning, v.Reasoning),
		AudioInput: max(u.AudioInput, v.AudioInput), AudioOutput: max(u.AudioOutput, v.AudioOutput),
	}
}

// plus is u and v added, count by count.
func (u Usage) plus(v Usage) Usage {
	return Usage{
		Total: u.Total + v.Total, Input: u.Input + v.Input, Output: u.Output + v.Output,
		UncachedInput: u.UncachedInput + v.UncachedInput,
		CacheRead:     u.CacheRead + v.CacheRead, CacheWrite: u.CacheWrite + v.CacheWrite,
		Reasoning:  u.Reasoning + v.Reasoning,
		AudioInput: u.AudioInput + v.AudioInput, AudioOutput: u.AudioOutput + v.AudioOutput,
	}
}

// Within is u with each count at most ceiling's, and whether any was over
// it (or a part over its whole). A part is bounded by its whole's ceiling
// (ceiling's own parts are not read), and by what is counted of that whole,
// so that it never exceeds it: CacheWrite and AudioInput by Input, Reasoning
// and AudioOutput by Output, and CacheRead by Input where it is within u's
// Input (OpenAI, Gemini), else by Total (Anthropic's is beside Input).
func (u Usage) Within(ceiling Usage) (Usage, bool) {
	w := Usage{Total: min(u.Total, ceiling.Total), Input: min(u.Input, ceiling.Input), Output: min(u.Output, ceiling.Output)}
	if u.CacheRead <= u.Input {
		w.CacheRead = min(u.CacheRead, w.Input)
	} else {
		w.CacheRead = min(u.CacheRead, w.Total)
	}
	w.UncachedInput = min(u.UncachedInput, w.Input)
	w.CacheWrite = min(u.CacheWrite, w.Input)
	w.Reasoning = min(u.Reasoning, w.Output)
	w.AudioInput = min(u.AudioInput, w.Input)
	w.AudioOutput = min(u.AudioOutput, w.Output)
	return w, w != u
}

// capped is u with each count at most maxValue, so that sums of it cannot
// overflow.
func (u Usage) capped() Usage {
	return Usage{
		Total: min(u.Total, maxValue), Input: min(u.Input, maxValue), Output: min(u.Output, maxValue),
		UncachedInput: min(u.UncachedInput, maxValue),
		CacheRead:     min(u.CacheRead, maxValue), CacheWrite: min(u.CacheWrite, maxValue),
		Reasoning:  min(u.Reasoning, maxValue),
		AudioInput: min(u.AudioInput, maxValue), AudioOutput: min(u.AudioOutput, maxValue),
	}
}

// tally is what a response has reported so far, by the rules in the
// package comment (doc.go). The JSON scanner tells it where usage
// objects and iterations open and close, and each count it reads.
type tally struct {
	v    [fieldCount]int64 // the latest value of each field
	seen uint32            // bit f: field f was reported (and not dropped since)
	snap uint32            // bit f: field f was reported in the usage object being read

	// iter is made by the first iterations array, so that the meter of a
	// response without one (most of them) is smaller.
	iter *iterations
}

// iterations sums Anthropic's usage.iterations arrays.
type iterations struct {
	open bool            // the latest array has not closed (yet, or ever: a cut body)
	sum  Usage           // the latest closed array's sum; while one is open, the sum it replaces
	run  Usage           // the open array: the sum of its closed iterations
	cur  anthropicCounts // the open iteration
}

// anthropicCounts are Anthropic's four counts, in field order: input, output,
// cache creation, cache read.
type anthropicCounts [4]int64

// usage is what the counts charge. Cache reads are part of the total only:
// Anthropic's input tokens per minute do not count them (for current
// models), and its cache writes are input like any other. Both are also
// reported as parts: CacheWrite inside Input, CacheRead beside it.
func (c anthropicCounts) usage() Usage {
	return Usage{Total: c[0] + c[1] + c[2] + c[3], Input: c[0] + c[2], Output: c[1], UncachedInput: c[0], CacheWrite: c[2], CacheRead: c[3]}
}

// openUsage starts a usage object.
func (t *tally) openUsage() { t.snap = 0 }

// closeUsage ends a usage object: if it was a Gemini snapshot, the Gemini
// fields it did not report are gone.
func (t *tally) closeUsage() {
	if t.snap&fieldsGemini == 0 {
		return
	}
	drop := fieldsGemini &^ t.snap
	t.seen &^= drop
	for f := range fieldCount {
		if drop&(1<<f) != 0 {
			t.v[f] = 0
		}
	}
}

// record takes a usage object's count: the latest value of a field wins.
func (t *tally) record(f field, n int64) {
	if f == fieldNone || f >= fieldCount {
		return
	}
	t.seen |= 1 << f
	t.snap |= 1 << f
	t.v[f] = n
}

// openIterations starts an iterations array, which replaces any earlier one
// once it closes. An earlier one that never closed (its event was cut) is
// what it had summed by then.
func (t *tally) openIterations() {
	if t.iter == nil {
		t.iter = new(iterations)
	}
	it := t.iter
	it.sum = it.charge()
	it.open = true
	it.run, it.cur = Usage{}, anthropicCounts{}
}

// The scanner opens and closes an iteration, and records its counts, only
// inside an iterations array, which openIterations made t.iter for; an
// iteration outside one changes nothing.

func (t *tally) closeIterations() {
	if it := t.iter; it != nil {
		it.sum, it.open = it.run, false
	}
}

func (t *tally) openIteration() {
	if it := t.iter; it != nil {
		it.cur = anthropicCounts{}
	}
}

func (t *tally) closeIteration() {
	if it := t.iter; it != nil {
		it.run = it.summed().capped()
		it.cur = anthropicCounts{}
	}
}

// recordIteration takes an iteration's count: the latest value of a field in
// the iteration wins. Only Anthropic's four counts are summed (the nested
// cache_creation breakdown is not read: it is part of
// cache_creation_input_tokens).
func (t *tally) recordIteration(f field, n int64) {
	switch f {
	case fieldInputTokens, fieldOutputTokens,
		fieldCacheCreationInputTokens, fieldCacheReadInputTokens:
		if t.iter != nil {
			t.iter.cur[f-fieldInputTokens] = n
		}
	}
}

// charge is the iterations sum to charge: the latest array's, or while it
// is open, the larger of what it has summed so far and the sum it replaces,
// count by count; nothing without an array.
func (it *iterations) charge() Usage {
	if it == nil {
		return Usage{}
	}
	if it.open {
		return it.sum.max(it.summed())
	}
	return it.sum
}

// summed is what the open array has summed so far.
func (it *iterations) summed() Usage { return it.run.plus(it.cur.usage()) }

// usage is the charge: for each provider family a total, its input and
// output parts, and the priced parts of those; and of each count the
// largest over the families, so that a usage object that mixes families
// (some compatible backends echo OpenAI and Anthropic names) is not charged
// twice.
//
//	OpenAI     Total       total_tokens, or prompt_tokens + completion_tokens
//	           Input       prompt_tokens
//	           Output      completion_tokens
//	           CacheRead   prompt_tokens_details.cached_tokens
//	           AudioInput  prompt_tokens_details.audio_tokens
//	           Reasoning   completion_tokens_details.reasoning_tokens
//	           AudioOutput completion_tokens_details.audio_tokens
//	Responses  Total       total_tokens, or input_tokens + output_tokens
//	           Input       input_tokens
//	           Output      output_tokens
//	           CacheRead   input_tokens_details.cached_tokens
//	           AudioInput  input_token_details.audio_tokens (Realtime, transcriptions)
//	           Reasoning   output_tokens_details.reasoning_tokens
//	           AudioOutput output_token_details.audio_tokens
//	Anthropic  Total       the iterations sum, or input_tokens + output_tokens +
//	                       cache_creation_input_tokens + cache_read_input_tokens
//	           Input       input_tokens + cache_creation_input_tokens
//	           Output      output_tokens
//	           CacheRead   cache_read_input_tokens (beside Input)
//	           CacheWrite  cache_creation_input_tokens
//	Gemini     Total       totalTokenCount, or Input + Output
//	           Input       promptTokenCount + toolUsePromptTokenCount
//	           Output      candidatesTokenCount + thoughtsTokenCount
//	           CacheRead   cachedContentTokenCount
//	           Reasoning   thoughtsTokenCount
//	Bedrock    Total       totalTokens, or Input + Output
//	           Input       inputTokens + cacheReadInputTokens + cacheWriteInputTokens
//	                       (inputTokens is only what no cache served or took)
//	           Output      outputTokens
//	           CacheRead   cacheReadInputTokens (inside Input)
//	           CacheWrite  cacheWriteInputTokens (inside Input)
//	           (or inputTokenCount, … of amazon-bedrock-invocationMetrics and
//	           InvokeModel's headers: the same counts)
//	Cohere     Total       Input + Output
//	           Input       billed_units.input_tokens
//	           Output      billed_units.output_tokens
//
// Where a total is reported it is what the provider charges; a total smaller
// than the parts reported beside it is taken to have left some out, and the
// parts are charged instead. The iterations sum is such a total: the
// top-level fields of a compacted response are its last iteration, and each
// part is the larger of the iterations' and the top level's likewise.
//
// Input and Output are what input and output caps count, each a sum of the
// reported counts that make it up, never more: reasoning is inside
// completion_tokens and output_tokens already (completion_tokens_details is a
// breakdown of them, never added), cachedContentTokenCount inside
// promptTokenCount, and Anthropic's cache reads are left out of Input (see
// anthropicCounts.usage). Each is at most Total; both are 0 when only a total
// is reported. Total may be more than Input + Output (cache reads, a total
// that counts what the parts do not); in a usage object that mixes families
// whose counts disagree, Input and Output may come from different families
// and add up to more.
//
// A part that a provider reports inside a count is at most that count (an
// OpenAI cached_tokens above its prompt_tokens is charged as prompt_tokens;
// one reported without its prompt_tokens is 0), so that in each family
// CacheWrite and AudioInput are at most Input, Reasoning and AudioOutput at
// most Output, and CacheRead at most Input (OpenAI, Responses, Gemini) or
// Total (Anthropic); and so in the charge too, each count being the
// largest of the families'. The details objects alone do not make a
// response metered.
func (t *tally) usage() (Usage, bool) {
	if t.seen&^fieldsDetails == 0 && t.iter == nil {
		return Usage{}, false
	}
	v := &t.v
	openai := withTotal(v[fieldTotalTokens], v[fieldPromptTokens], v[fieldCompletionTokens])
	openai.CacheRead = min(v[fieldPromptCachedTokens], v[fieldPromptTokens])
	openai.UncachedInput = v[fieldPromptTokens] - openai.CacheRead
	openai.AudioInput = min(v[fieldPromptAudioTokens], v[fieldPromptTokens])
	openai.Reasoning = min(v[fieldCompletionReasoningTokens], v[fieldCompletionTokens])
	openai.AudioOutput = min(v[fieldCompletionAudioTokens], v[fieldCompletionTokens])
	// The Responses API's counts are others': its total_tokens is OpenAI's,
	// its input_tokens and output_tokens are Anthropic counts without cache
	// fields. Only its details, parts of those two, are its own.
	responses := Usage{
		CacheRead:   min(v[fieldInputCachedTokens], v[fieldInputTokens]),
		AudioInput:  min(v[fieldInputAudioTokens], v[fieldInputTokens]),
		Reasoning:   min(v[fieldOutputReasoningTokens], v[fieldOutputTokens]),
		AudioOutput: min(v[fieldOutputAudioTokens], v[fieldOutputTokens]),
	}
	anthropic := anthropicCounts(v[fieldInputTokens : fieldCacheReadInputTokens+1]).usage().max(t.iter.charge())
	// input_tokens is uncached for Anthropic, and holds the cached part
	// that input_tokens_details reports for the Responses API (which
	// Anthropic never sends).
	anthropic.UncachedInput -= responses.CacheRead
	gemini := withTotal(v[fieldTotalTokenCount],
		v[fieldPromptTokenCount]+v[fieldToolUsePromptTokenCount],
		v[fieldCandidatesTokenCount]+v[fieldThoughtsTokenCount])
	gemini.CacheRead = min(v[fieldCachedContentTokenCount], v[fieldPromptTokenCount])
	gemini.UncachedInput = gemini.Input - gemini.CacheRead
	gemini.Reasoning = v[fieldThoughtsTokenCount]
	bedrock := withTotal(v[fieldBedrockTotalTokens],
		v[fieldBedrockInputTokens]+v[fieldBedrockCacheReadTokens]+v[fieldBedrockCacheWriteTokens],
		v[fieldBedrockOutputTokens])
	bedrock.UncachedInput = v[fieldBedrockInputTokens]
	bedrock.CacheRead = v[fieldBedrockCacheReadTokens]
	bedrock.CacheWrite = v[fieldBedrockCacheWriteTokens]
	cohere := withTotal(0, v[fieldBilledInputTokens], v[fieldBilledOutputTokens])
	cohere.UncachedInput = cohere.Input
	return openai.max(responses).max(anthropic).max(gemini).max(bedrock).max(cohere), true
}

// withTotal is a family's usage from its reported total (0 if none) and its
// input and output parts: the total, unless the parts add up to more.
func withTotal(total, input, output int64) Usage {
	return Usage{Total: max(total, input+output), Input: input, Output: output}
}

// parseCount reads a JSON number as a token count: a non-negative
// integer (a fraction is dropped), capped at maxValue. Anything else (a
// negative number, a literal, a malformed number) is not a count.
func parseCount(b []byte) (int64, bool) {
	if len(b) == 0 || b[0] == '-' {
		return 0, false
	}
	var n int64
	i := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		if n < maxValue {
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
		if f >= maxValue {
			return maxValue, true
		}
		return int64(f), true
	}
	return min(n, maxValue), true
}
