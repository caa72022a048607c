// Package tokenest says what an LLM API request asks of the model, in
// tokens, from its JSON body alone: an estimate of its input and the output
// cap it sets itself. A gateway reserves both before it admits the request
// against a tokens-per-minute cap, and settles against the usage the
// provider reports afterwards. It is an estimate by rule, not a tokenizer.
//
// # APIs
//
// A body is read as the API of its call (internal/llmapi tells it from the
// URL path); a token-counting call or embeddings are capped at 0. An
// unknown API, a body that is not JSON as json.Valid has it (so not nested
// more than 10000 deep), or JSON that is not an object gives Known false.
//
// # Input
//
//	Input = ⌈characters / 4⌉ + token ids + MediaTokens × media parts
//
// Characters are Unicode code points of the decoded strings, not bytes: an
// escape is one, a \u surrogate pair one, an invalid UTF-8 byte one. A value
// counted as JSON counts the characters of its compact JSON: punctuation,
// numbers and literals as written, each string's characters and its two
// quotes, no whitespace. A media part counts MediaTokens, never its bytes:
// a 2 MB base64 image, or a data: URL, is one part. Token ids (integers in
// place of a prompt) count one token each. What is read, per API; nothing
// else counts:
//
//	chat         messages[]: content, name, tool_calls[].function (or .custom)
//	             name + arguments (+ input), function_call name + arguments;
//	             tools[], functions[] as JSON
//	completions  prompt: a string, strings, token ids, or arrays of token ids;
//	             suffix
//	embeddings   input, as prompt
//	responses    input: a string, or items: a message (no type, or "message")
//	             its content; function_call name + arguments; custom_tool_call
//	             name + input; function_call_output, custom_tool_call_output
//	             their output (a string or parts); instructions; tools[] as JSON
//	messages     system; messages[] as chat's (Anthropic's have only content);
//	             tools[] as JSON
//	gemini       contents[].parts[], systemInstruction.parts[]; tools[] as
//	             JSON; generateContentRequest (countTokens), read as a request
//	converse     Bedrock's Converse: messages[].content[] and system[], as
//	             blocks (below); toolConfig as JSON
//	invoke       Bedrock's InvokeModel, the model's own body: Anthropic's
//	             as messages; Meta's and Mistral's prompt, Titan's inputText
//	cohere       Cohere's v2 chat: messages[] as chat's (and each tool_plan);
//	             tools[] and documents[] as JSON
//
// A Converse block is a union, named by its one member: text counts its
// text; image, document and video are media; toolUse its name and its
// input as JSON; toolResult its content's blocks; json (a tool result's) as
// JSON; guardContent its text ({"text": …}) and image; reasoningContent and
// cachePoint count nothing.
//
// Content (chat and Anthropic messages, system, tool_result content,
// Responses content and outputs) is a string, or parts that count by type:
//
//	text, input_text, output_text             their text
//	refusal                                   its refusal
//	image_url, input_audio, file, input_image,
//	input_file, image                         media
//	document                                  a source of type text: its data;
//	                                          of type content: its content;
//	                                          else media
//	tool_use, server_tool_use                 name + input as JSON
//	tool_result                               its content
//	any other (thinking, reasoning, …)        nothing
//
// A Gemini part counts its text; each of inlineData and fileData is media;
// functionCall, functionResponse, executableCode and codeExecutionResult
// count as JSON.
//
// # Output
//
// Capped says whether the request names its own cap; Output is it, times the
// choices asked for (Choices, read with or without a cap, and 1 where the
// API has no multiplier):
//
//	chat         max_completion_tokens or max_tokens (not both); × n
//	completions  max_tokens × max(n, best_of)
//	responses    max_output_tokens
//	messages     max_tokens
//	gemini       generationConfig.maxOutputTokens × generationConfig.candidateCount
//	converse     inferenceConfig.maxTokens
//	invoke       max_tokens (Anthropic, Mistral) or max_gen_len (Meta), not
//	             both; Titan's textGenerationConfig.maxTokenCount is not read
//	cohere       max_tokens
//
// Embeddings and the token counts are Capped with Output 0. A legacy
// completion without max_tokens is not capped, although OpenAI then stops at
// 16: the gateway's default applies. A cap or multiplier is a count: a JSON
// number of whole value at least 1 without an exponent (256 and 256.0, not
// 0, -5, 1.5, 1e3 or "256"); null is as absent. A cap that is not a count
// is no cap. A multiplier given as anything else than a count leaves the
// request uncapped, its Choices 1: an upstream may read "8" or 1e1 as a
// count (protobuf's JSON does), and the cap times a multiplier unread would
// be less than what the request asks for. So does a cap or a multiplier
// given in two ways: under two spellings of its key that an upstream
// decoding into a Go struct reads alike (MAX_TOKENS beside max_tokens:
// encoding/json matches keys without regard to case, and reads the last),
// both Gemini spellings (maxOutputTokens and max_output_tokens, or both
// generationConfig and generation_config giving one), or both of a chat's
// caps: which one the upstream reads, this package cannot know, and a cap
// it did not read would bound the charge. Every count saturates at 1<<40.
//
// # Reading
//
// The body is read in one pass, allocating nothing; every byte is checked,
// even where nothing is counted. Keys are compared exactly, after unescaping.
// A member given twice counts as its last value, as the providers' decoders
// read it. Gemini members are read under either spelling, lowerCamelCase or
// snake_case (systemInstruction, system_instruction, …): both count if both
// are given, and of two caps or multipliers the camelCase one is read.
package tokenest
