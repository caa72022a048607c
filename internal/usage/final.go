package usage

// A response's final report is the usage its API sends once it is done: a
// stream that ends before it (a client that left, an upstream that broke
// off) has reported only what it had counted by then, or nothing at all of
// its output. Anthropic's message_start reports output_tokens 1, Gemini's
// early chunks the prompt alone, and neither is the response's count. So
// the meter tells the final report apart (Meter.Final), and the gateway
// charges a response without one at least what it reserved.
//
// A document (an SSE event's data, a top-level JSON value, or an element of
// a top-level JSON array) is a final report when it reports usage and is
// its API's terminal event:
//
//   - its top-level "type" is a terminal type (isTerminalType): Anthropic's
//     message_delta, the Responses API's response.completed,
//     response.incomplete and response.failed, Cohere's message-end;
//   - or its usage is at its top level ("usage", Gemini's "usageMetadata")
//     and its choices ("choices", Gemini's "candidates"), if it has any,
//     include one with a finish reason ("finish_reason", "finishReason"):
//     OpenAI's usage chunk (choices []), a compatible backend's last chunk
//     (usage beside the finish reason), Gemini's chunk with a finishReason,
//     Bedrock's metadata event (ConverseStream) and a model's last chunk
//     with its amazon-bedrock-invocationMetrics (InvokeModelWithResponseStream),
//     and every non-streamed JSON answer.
//
// A JSON body (not a stream of events) whose top-level value was read whole
// is final too. The document must have been read whole: a terminal event
// cut short is not final. A later document that reports usage without
// being final (a running count after a final one) makes the response's
// report not final again.

// mark is what a string value marks of its document.
type mark uint8

const (
	markNone     mark = iota
	markType          // a document's "type": terminal or not (isTerminalType)
	markFinished      // a choice's finish reason: the choice is done
)

// documentMarks are what the scanner noted of a document, which tell
// whether it is a final report: bits, so that a meter stays small.
type documentMarks uint8

const (
	markedTerminalType documentMarks = 1 << iota // its "type" is a terminal one
	markedUsage                                  // it has a usage object at its top level
	markedChoices                                // it has choices (or candidates)
	markedFinished                               // one of them has a finish reason
)

// terminal reports whether a document with these marks is its API's
// terminal event.
func (d documentMarks) terminal() bool {
	return d&markedTerminalType != 0 || d&markedUsage != 0 && (d&markedChoices == 0 || d&markedFinished != 0)
}

// isTerminalType reports whether a document's "type" names its API's
// terminal event: the one that carries the final usage.
func isTerminalType(t []byte) bool {
	switch string(t) {
	case "message_delta", // Anthropic Messages (message_stop, without usage, follows)
		"response.completed", "response.incomplete", "response.failed", // OpenAI Responses
		"message-end": // Cohere's v2 chat
		return true
	}
	return false
}
