// Package usage reads the tokens an LLM provider reports having used, from a
// copy of the bytes of its answer on their way to the client, so that exactly
// those are charged. A Meter reads a response body; a RealtimeTap reads the
// frames of a WebSocket session of the OpenAI Realtime API (see websocket.go).
//
// What a Meter reads, by Content-Type (the request is never looked at):
//
//   - application/json and any */*+json: one JSON body (or several top-level
//     values, or one top-level array of them, as Gemini's streamGenerateContent
//     answers without alt=sse). Each top-level object is a document.
//   - text/event-stream: each event's data payload is a document.
//   - application/vnd.amazon.eventstream, Bedrock's streams: each event's
//     payload is a document, and so is a chunk event's base64 bytes, a
//     model's own event (see eventstream.go).
//
// In a document, the usage object is the value of the top-level key "usage",
// "usageMetadata" or "amazon-bedrock-invocationMetrics", or of the "usage"
// key inside the top-level "message" (Anthropic's message_start),
// "response" (the Responses API's response.completed) or "delta" (Cohere's
// message-end) object. Only its numeric members are read, the numeric
// members of its OpenAI details objects and of Cohere's billed_units, and
// the objects of its "iterations" array (Anthropic's server-side
// compaction). Bedrock's InvokeModel also reports its counts in its
// response's header, which is read as a usage object and is the response's
// final report:
//
//	OpenAI chat/completions/embeddings  prompt_tokens completion_tokens total_tokens
//	                                    prompt_tokens_details: cached_tokens audio_tokens
//	                                    completion_tokens_details: reasoning_tokens audio_tokens
//	OpenAI Responses                    input_tokens output_tokens total_tokens
//	                                    input_tokens_details: cached_tokens
//	                                    output_tokens_details: reasoning_tokens
//	OpenAI Realtime, transcriptions     the same, and input_token_details: cached_tokens audio_tokens,
//	                                    output_token_details: audio_tokens
//	Anthropic messages                  input_tokens output_tokens
//	                                    cache_creation_input_tokens cache_read_input_tokens
//	                                    iterations[]: the same four, per sampling iteration
//	Gemini                              promptTokenCount candidatesTokenCount totalTokenCount
//	                                    thoughtsTokenCount toolUsePromptTokenCount
//	                                    cachedContentTokenCount
//	Bedrock Converse, ConverseStream    inputTokens outputTokens totalTokens
//	                                    cacheReadInputTokens cacheWriteInputTokens
//	Bedrock invocation metrics          inputTokenCount outputTokenCount
//	                                    cacheReadInputTokenCount cacheWriteInputTokenCount
//	Bedrock InvokeModel's header        x-amzn-bedrock-input-token-count, -output-token-count,
//	                                    -cache-read-input-token-count, -cache-write-input-token-count
//	Cohere v2 chat                      billed_units: input_tokens output_tokens
//
// Nothing else is read: not Anthropic's cache_creation object (its
// ephemeral_5m_input_tokens and ephemeral_1h_input_tokens split
// cache_creation_input_tokens, which is read instead), nor Gemini's
// *TokensDetails lists by modality, nor OpenAI's text_tokens, image_tokens,
// cached_tokens_details, accepted/rejected_prediction_tokens, nor Cohere's
// usage.tokens (what its model read and wrote, which Cohere does not bill).
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
//     such array (input + output + cache creation + cache read of each, and
//     its input and output parts likewise) is the Anthropic charge. A later
//     usage object without the array leaves it.
//
// Reports are applied as they are read, not held until their object closes:
// a value counts as soon as its number ends, so a stream cut anywhere is
// charged what it had reported by then. What a report replaces is let go
// only once it is known to be replaced: an earlier Gemini field when the new
// snapshot closes without it, an earlier iterations sum when the new array
// closes (until then the larger of the two is charged: a cut array lists
// only the first iterations).
//
// The charge is a Usage. Its Total, what a tpm counts, is what the provider
// says the request cost, cached input included: the reported total where
// there is one (OpenAI total_tokens, Gemini totalTokenCount, the iterations
// sum), and the sum of the parts where there is not (Anthropic). A total
// smaller than the sum of its own parts is not believed: the sum is charged
// then. Its Input and Output are the parts of it that input and output caps
// count: the prompt (Gemini's tool-use prompt too, and the cached input
// inside prompt counts), and the completion with its reasoning. Anthropic's
// cache writes are input, its cache reads are not (its input limits do not
// count them): they are in Total only. Where only a total is reported, Input
// and Output are 0. A usage object that mixes families is charged its
// largest family, once, count by count. See tally.usage.
//
// Beside those three counts, a Usage reports the parts of them that are
// priced apart. Whether a part is inside Input or Output, or comes on top of
// them, depends on the provider:
//
//	OpenAI chat       CacheRead, AudioInput inside Input (prompt_tokens);
//	                  Reasoning, AudioOutput inside Output (completion_tokens)
//	OpenAI Responses  CacheRead, AudioInput inside Input (input_tokens);
//	and Realtime      Reasoning, AudioOutput inside Output (output_tokens)
//	Anthropic         CacheWrite inside Input (input_tokens + cache creation);
//	                  CacheRead on top: in Total only, not in Input
//	Gemini            CacheRead inside Input (inside promptTokenCount);
//	                  Reasoning inside Output (thoughtsTokenCount, which Output
//	                  adds to candidatesTokenCount)
//	Bedrock           CacheRead and CacheWrite inside Input, which adds them to
//	                  inputTokens (the input no cache served or took)
//	Cohere            none: its billed units are the counts
//
// So the uncached input, priced at the full input rate, is Input - CacheRead
// for OpenAI and Gemini, Input - CacheWrite for Anthropic, whose CacheRead
// comes on top of Input, and Input - CacheRead - CacheWrite for Bedrock.
// UncachedInput is it: prompt_tokens or input_tokens less cached_tokens
// (OpenAI), input_tokens (Anthropic), prompt + tool-use prompt less cached
// content (Gemini), inputTokens (Bedrock), billed input (Cohere). AudioInput counts audio input cached or
// not (the Realtime API's split of cached tokens by modality is not read). The output at the text
// rate is Output - AudioOutput (reasoning is billed as output; Reasoning is
// what of Output was spent on it). Anthropic reports no reasoning apart
// (thinking is in output_tokens) and no audio; Gemini's audio is only in its
// per-modality lists, not read. Every part follows the rules above for its
// fields: the latest value per field (Anthropic's message_delta), the last
// snapshot (Gemini: a cachedContentTokenCount or thoughtsTokenCount that the
// last usageMetadata leaves out is 0), the iterations sum (of cache creation
// and cache read, likewise the larger of the sum and the top-level field),
// and the largest family per count. A part is never more than its whole: a
// part reported inside a count is at most that count (0 if the count is not
// reported), so CacheWrite and AudioInput are at most Input, Reasoning and
// AudioOutput at most Output, CacheRead at most Input (OpenAI, Gemini) or
// Total (Anthropic). Details objects alone, with no count beside them, do
// not make a response metered.
//
// Memory per response is bounded whatever the body: the JSON scanner is a
// byte-at-a-time state machine that holds no part of the body (a few dozen
// bytes of state), the SSE scanner holds one event of at most MaxEvent
// bytes, the event stream reader one message of at most MaxEvent bytes with
// its payload and a chunk's decoded bytes, and a compressed body adds its decoder's window (32 KiB for
// gzip/deflate, at most 8 MiB for zstd, at most 16 MiB for brotli).
//
// Compressed bodies are decoded from the meter's own copy: see decode.go.
package usage
