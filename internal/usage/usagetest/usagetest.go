// Package usagetest holds what the tests of package usage and of the handler
// share: golden response bodies with the charge each must produce, the content
// codings and chunkings they are sent in, WebSocket frames for the
// realtime tap, and the reader of a folder of recorded real responses
// (Recorded). Only tests import it.
package usagetest

import (
	"embed"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"path"
	"strings"
	"testing"
)

// Golden is a sample body under testdata and what it must charge: the
// usage.Usage{Total: Tokens, Input: Input, Output: Output}, if Metered.
type Golden struct {
	File          string
	Tokens        int64 // the total, what a tpm counts
	Input, Output int64 // the parts of it that input and output caps count
	Metered       bool
}

// Goldens are written from the providers' public API references (shapes
// and field names; the values are made up). The .sse files are the bytes on
// the wire; the gemini_stream*.sse files use CRLF line ends, as Gemini does.
var Goldens = []Golden{
	// OpenAI: total_tokens, prompt_tokens, completion_tokens (input_tokens,
	// output_tokens for the Responses API); the content's "usage" text is
	// not usage.
	{"openai_chat.json", 1163, 1117, 46, true},
	{"openai_chat_stream.sse", 31, 19, 12, true},         // stream_options.include_usage
	{"openai_chat_reasoning.json", 1261, 75, 1186, true}, // the 1024 reasoning tokens are in completion_tokens
	{"openai_completions.json", 12, 5, 7, true},
	{"openai_embeddings.json", 8, 8, 0, true},
	{"openai_responses.json", 123, 36, 87, true},
	{"openai_responses_stream.sse", 48, 37, 11, true}, // response.completed's response.usage
	// With the parts priced apart (see GoldenParts): audio, cache, reasoning.
	{"openai_chat_audio.json", 1577, 1346, 231, true},
	{"openai_responses_reasoning_stream.sse", 2762, 2150, 612, true},
	// Anthropic: input + output + cache creation + cache read, the latest
	// value of each field; with usage.iterations, the sum over them. Input
	// is input + cache creation (not cache read), Output is output.
	{"anthropic_messages.json", 2095 + 503 + 2051 + 1800, 2095 + 2051, 503, true},
	{"anthropic_messages_stream.sse", 472 + 89 + 0 + 1024, 472 + 0, 89, true},     // message_start + message_delta
	{"anthropic_compat_stream.sse", 118 + 30 + 10, 118, 30, true},                 // input 120, then 118: the latest wins
	{"anthropic_stream_lower_delta.sse", 2097 + 64 + 0 + 512, 2097 + 0, 64, true}, // input 2100, then 2097
	{"anthropic_stream_error.sse", 310 + 1, 310, 1, true},                         // error after message_start
	{"anthropic_cache_stream.sse", 12 + 340 + 1500 + 4200, 12 + 1500, 340, true},  // cache writes and reads
	// Compacted: the iterations (compaction, then message), not the top-level
	// fields (the last iteration only), nor cache_creation's breakdown.
	{"anthropic_compaction_stream.sse", (240 + 410 + 0 + 31200) + (315 + 12 + 1200 + 0), (240 + 0) + (315 + 1200), 410 + 12, true},
	{"anthropic_compaction.json", (18750 + 640 + 0 + 2048) + (96 + 21 + 300 + 0), (18750 + 0) + (96 + 300), 640 + 21, true},
	// Gemini: totalTokenCount (prompt, which includes cached, + tool use
	// prompt + candidates + thoughts) of the last usageMetadata; Input is
	// prompt + tool use prompt, Output candidates + thoughts.
	{"gemini_generate.json", 1263, 1208, 9 + 46, true},
	{"gemini_tool_use.json", 2368, 320 + 1450, 210 + 388, true},
	{"gemini_stream.sse", 75, 11, 22 + 42, true},      // the last running total
	{"gemini_stream_array.json", 10, 6, 4, true},      // streamGenerateContent without alt=sse
	{"gemini_stream_down.sse", 79, 38, 17 + 24, true}, // prompt 42, then 38 + 17 + 24 thoughts
	{"gemini_stream_array_down.json", 12, 7, 5, true}, // prompt 9, then 7 + 5
	{"gemini_cached_stream.sse", 5655, 5210, 85 + 360, true},
	// Bedrock: inputTokens is the input no cache served or took; the
	// input is it and the cache reads and writes. ConverseStream's usage
	// is in its metadata event. InvokeModelWithResponseStream carries
	// Anthropic's events as chunks, and Bedrock's own count of them in the
	// last (amazon-bedrock-invocationMetrics), charged once; a model of
	// another family (Llama) reports only the latter.
	{"bedrock_converse.json", 24 + 102 + 1581 + 142, 24 + 1581 + 142, 102, true},
	{"bedrock_converse_stream.eventstream.json", 76, 19, 57, true},
	{"bedrock_invoke_stream.eventstream.json", 12 + 88 + 2048, 12 + 2048, 88, true},
	{"bedrock_invoke_llama_stream.eventstream.json", 18 + 42, 18, 42, true},
	{"bedrock_converse_stream_exception.eventstream.json", 0, 0, 0, false}, // throttled before its metadata
	// Cohere: usage.billed_units, what Cohere bills, not usage.tokens.
	{"cohere_chat.json", 9 + 212, 9, 212, true},
	{"cohere_chat_stream.sse", 14 + 58, 14, 58, true}, // message-end's delta.usage
	// No usage: nothing is charged.
	{"openai_error.json", 0, 0, 0, false},
	{"anthropic_error.json", 0, 0, 0, false},
	{"gemini_error.json", 0, 0, 0, false},
	{"openai_stream_without_usage.sse", 0, 0, 0, false},
	{"unknown_shape.json", 0, 0, 0, false}, // "usage" only below the top level
}

// CutShort are the goldens that end before their final report (see
// usage.Meter.Final): an error event after message_start.
var CutShort = map[string]bool{"anthropic_stream_error.sse": true}

// Parts are the parts of a charge that are priced apart: the
// usage.Usage fields beside Total, Input and Output (see package usage).
type Parts struct {
	UncachedInput, CacheRead, CacheWrite, Reasoning, AudioInput, AudioOutput int64
}

// GoldenParts are the parts each golden sample must charge, by file; a file
// not listed charges none. UncachedInput, the input at the full input price,
// is prompt_tokens (input_tokens for the Responses API) less its
// cached_tokens for OpenAI; input_tokens for Anthropic (cache creation and
// cache reads are priced apart), summed over the iterations where larger;
// promptTokenCount + toolUsePromptTokenCount less cachedContentTokenCount
// for Gemini.
var GoldenParts = map[string]Parts{
	// OpenAI: *_tokens_details, parts of prompt_tokens / completion_tokens
	// (input_tokens / output_tokens for the Responses API).
	"openai_chat.json":            {UncachedInput: 1117 - 1024, CacheRead: 1024},
	"openai_chat_stream.sse":      {UncachedInput: 19 - 0},
	"openai_chat_reasoning.json":  {UncachedInput: 75 - 0, Reasoning: 1024},
	"openai_completions.json":     {UncachedInput: 5},
	"openai_embeddings.json":      {UncachedInput: 8},
	"openai_responses.json":       {UncachedInput: 36 - 0},
	"openai_responses_stream.sse": {UncachedInput: 37 - 0},
	// audio_tokens, cached or not, inside prompt_tokens; audio output inside
	// completion_tokens (text_tokens are not read).
	"openai_chat_audio.json":                {UncachedInput: 1346 - 1152, CacheRead: 1152, AudioInput: 410, AudioOutput: 188},
	"openai_responses_reasoning_stream.sse": {UncachedInput: 2150 - 1920, CacheRead: 1920, Reasoning: 448},
	// Anthropic: cache_read_input_tokens (beside input_tokens) and
	// cache_creation_input_tokens (inside Input), the latest of each; with
	// usage.iterations, the sum over them where larger.
	"anthropic_messages.json":          {UncachedInput: 2095, CacheRead: 1800, CacheWrite: 2051},
	"anthropic_messages_stream.sse":    {UncachedInput: 472, CacheRead: 1024}, // message_start's, message_delta leaves them
	"anthropic_compat_stream.sse":      {UncachedInput: 118, CacheRead: 10},   // input 120, then 118
	"anthropic_stream_lower_delta.sse": {UncachedInput: 2097, CacheRead: 512}, // input 2100, then 2097
	"anthropic_stream_error.sse":       {UncachedInput: 310},
	"anthropic_compaction_stream.sse":  {UncachedInput: 240 + 315, CacheRead: 31200 + 0, CacheWrite: 0 + 1200},
	"anthropic_compaction.json":        {UncachedInput: 18750 + 96, CacheRead: 2048 + 0, CacheWrite: 0 + 300},
	// cache_creation_input_tokens, not its 5m/1h breakdown.
	"anthropic_cache_stream.sse": {UncachedInput: 12, CacheRead: 4200, CacheWrite: 1500},
	// Gemini: cachedContentTokenCount (inside promptTokenCount) and
	// thoughtsTokenCount (inside Output), of the last usageMetadata.
	"gemini_generate.json":          {UncachedInput: 1208 - 1024, CacheRead: 1024, Reasoning: 46},
	"gemini_tool_use.json":          {UncachedInput: 320 + 1450, Reasoning: 388},
	"gemini_stream.sse":             {UncachedInput: 11, Reasoning: 42},
	"gemini_stream_array.json":      {UncachedInput: 6},
	"gemini_stream_down.sse":        {UncachedInput: 38, Reasoning: 24}, // prompt 42, then 38
	"gemini_stream_array_down.json": {UncachedInput: 7},                 // prompt 9, then 7
	"gemini_cached_stream.sse":      {UncachedInput: 5210 - 4096, CacheRead: 4096, Reasoning: 360},
	// Bedrock: cacheReadInputTokens and cacheWriteInputTokens, both inside
	// the input, beside inputTokens.
	"bedrock_converse.json":                        {UncachedInput: 24, CacheRead: 1581, CacheWrite: 142},
	"bedrock_converse_stream.eventstream.json":     {UncachedInput: 19},
	"bedrock_invoke_stream.eventstream.json":       {UncachedInput: 12, CacheRead: 2048},
	"bedrock_invoke_llama_stream.eventstream.json": {UncachedInput: 18},
	"cohere_chat.json":                             {UncachedInput: 9},
	"cohere_chat_stream.sse":                       {UncachedInput: 14},
}

//go:embed testdata
var testdata embed.FS

// Files names every sample body under testdata, in lexical order.
func Files() []string {
	entries, err := fs.ReadDir(testdata, "testdata")
	if err != nil {
		panic(err) // the directory is embedded: it is there
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names
}

// Read returns the sample body in file, a copy the caller may change: an
// event stream sample's messages encoded (EventStream).
func Read(t testing.TB, file string) []byte {
	t.Helper()
	b, err := testdata.ReadFile(path.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(file, eventStreamSuffix) {
		return EventStream(t, b)
	}
	return b
}

// eventStreamSuffix ends the name of an event stream sample.
const eventStreamSuffix = ".eventstream.json"

// ContentType is the Content-Type a provider sends a sample with.
func ContentType(file string) string {
	switch {
	case strings.HasSuffix(file, ".sse"):
		return "text/event-stream; charset=utf-8"
	case strings.HasSuffix(file, eventStreamSuffix):
		return "application/vnd.amazon.eventstream"
	}
	return "application/json; charset=utf-8"
}

// Header is a response header with the Content-Type and Content-Encoding
// given, each left out when empty.
func Header(contentType, encoding string) http.Header {
	h := http.Header{}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	if encoding != "" {
		h.Set("Content-Encoding", encoding)
	}
	return h
}

// Chunking splits a body into the Writes a reader gets.
type Chunking struct {
	Name  string
	Split func(b []byte) [][]byte
}

// Bytewise is b cut into one-byte chunks.
func Bytewise(b []byte) [][]byte {
	out := make([][]byte, len(b))
	for i := range b {
		out[i] = b[i : i+1]
	}
	return out
}

// Chunkings are the body as one Write, one byte per Write, and random
// splits with chunks of up to 7, 64, 700 and 4096 bytes (the same splits on
// every run).
func Chunkings() []Chunking {
	splits := []struct {
		seed uint64
		max  int
	}{{1, 7}, {2, 64}, {3, 700}, {4, 4096}}
	cs := make([]Chunking, 0, 2+len(splits))
	cs = append(cs,
		Chunking{"whole", func(b []byte) [][]byte { return [][]byte{b} }},
		Chunking{"1-byte", Bytewise},
	)
	for _, c := range splits {
		cs = append(cs, Chunking{fmt.Sprintf("random-%d-max%d", c.seed, c.max), func(b []byte) [][]byte {
			r := rand.New(rand.NewPCG(c.seed, uint64(len(b))))
			var out [][]byte
			for len(b) > 0 {
				n := min(1+r.IntN(c.max), len(b))
				out = append(out, b[:n])
				b = b[n:]
			}
			return out
		}})
	}
	return cs
}
