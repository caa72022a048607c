package usage

import "strconv"

// field is one of the usage counts the meter reads.
type field uint8

const (
	fieldNone field = iota
	// OpenAI chat completions, completions, embeddings
	fieldPromptTokens
	fieldCompletionTokens
	fieldTotalTokens // also the Responses API
	// OpenAI Responses, Anthropic (these four in this order: an iteration's
	// counts are kept by them, see tally.recordIteration)
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
	}
	return fieldNone
}

// fieldsGemini are the Gemini fields: a usage object that reports any
// of them is a snapshot of them all.
const fieldsGemini = 1<<fieldPromptTokenCount | 1<<fieldCandidatesTokenCount |
	1<<fieldTotalTokenCount | 1<<fieldThoughtsTokenCount |
	1<<fieldToolUsePromptTokenCount | 1<<fieldCachedContentTokenCount

// tally is what a response has reported so far, by the rules in the
// package comment (doc.go). The JSON scanner tells it where usage
// objects and iterations open and close, and each count it reads.
type tally struct {
	v    [fieldCount]int64 // the latest value of each field
	seen uint32            // bit f: field f was reported (and not dropped since)
	snap uint32            // bit f: field f was reported in the usage object being read

	iter iterations
}

// iterations sums Anthropic's usage.iterations arrays.
type iterations struct {
	seen bool     // an iterations array was opened
	open bool     // the latest array has not closed (yet, or ever: a cut body)
	sum  int64    // the latest closed array's sum; while one is open, the sum it replaces
	run  int64    // the open array: the sum of its closed iterations
	cur  [4]int64 // the open iteration: input, output, cache creation, cache read
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
	it := &t.iter
	it.sum = it.charge()
	it.seen, it.open = true, true
	it.run, it.cur = 0, [4]int64{}
}

func (t *tally) closeIterations() {
	it := &t.iter
	it.sum, it.open = it.run, false
}

func (t *tally) openIteration() { t.iter.cur = [4]int64{} }

func (t *tally) closeIteration() {
	it := &t.iter
	it.run = min(it.summed(), maxValue)
	it.cur = [4]int64{}
}

// recordIteration takes an iteration's count: the latest value of a field in
// the iteration wins. Only Anthropic's four counts are summed (the nested
// cache_creation breakdown is not read: it is part of
// cache_creation_input_tokens).
func (t *tally) recordIteration(f field, n int64) {
	switch f {
	case fieldInputTokens, fieldOutputTokens,
		fieldCacheCreationInputTokens, fieldCacheReadInputTokens:
		t.iter.cur[f-fieldInputTokens] = n
	}
}

// charge is the iterations sum to charge: the latest array's, or while it
// is open, the larger of what it has summed so far and the sum it replaces.
func (it *iterations) charge() int64 {
	if it.open {
		return max(it.sum, it.summed())
	}
	return it.sum
}

// summed is what the open array has summed so far.
func (it *iterations) summed() int64 {
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
func (t *tally) tokens() (int64, bool) {
	if t.seen == 0 && !t.iter.seen {
		return 0, false
	}
	v := &t.v
	openai := max(v[fieldTotalTokens], v[fieldPromptTokens]+v[fieldCompletionTokens])
	anthropic := max(v[fieldTotalTokens], t.iter.charge(), v[fieldInputTokens]+v[fieldOutputTokens]+
		v[fieldCacheCreationInputTokens]+v[fieldCacheReadInputTokens])
	gemini := max(v[fieldTotalTokenCount], v[fieldPromptTokenCount]+v[fieldCandidatesTokenCount]+
		v[fieldThoughtsTokenCount]+v[fieldToolUsePromptTokenCount])
	return max(openai, anthropic, gemini), true
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
