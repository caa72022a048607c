package usage

import (
	"bytes"
	"encoding/json"
	"sync"
	"sync/atomic"

	"github.com/rolter/caddy-ratelimit/internal/wsframe"
)

// The realtime tap reads the WebSocket frames (RFC 6455) that the upstream of
// a realtime session sends the client, from a copy of the bytes taken after
// they were written to the client, and adds up the usage of every finished
// response. The OpenAI Realtime API reports it in the server event
//
//	{"type":"response.done","response":{...,"usage":{"total_tokens":N,"input_tokens":I,"output_tokens":O,...}}}
//
// a JSON text message. Nothing is ever held back from the client or changed.

// RealtimeTap parses the WebSocket frames a server sends a client (unmasked,
// RFC 6455) from a copy of the bytes, and adds each finished response's
// response.usage (from "response.done" events, JSON text messages of the
// OpenAI Realtime API) to a running Usage: total_tokens to Total,
// input_tokens to Input, output_tokens (reasoning included) to Output, and
// the parts of them priced apart: input_token_details.cached_tokens to
// CacheRead and input_token_details.audio_tokens to AudioInput (both inside
// input_tokens), output_token_details.audio_tokens to AudioOutput (inside
// output_tokens). Each is read as the Meter reads a count (see parseCount),
// and one a response does not report, or reports as something else, adds
// nothing; a part is at most its whole as the response reports it (a part
// reported without its whole adds nothing), as the Meter counts them.
//
// Memory is bounded: a text message is gathered up to maxMessage bytes (a
// larger one is skipped unread and counted as unmetered), and the message
// buffer is reused across messages and dropped after one larger than
// realtimeRetainedBuffer.
type RealtimeTap struct {
	// Counted since the last Take.
	total, input, output                              atomic.Int64
	uncachedInput, cacheRead, audioInput, audioOutput atomic.Int64

	skips     atomic.Int64 // unmetered messages
	clamped   atomic.Int64 // responses that reported more than perResponse
	responses atomic.Int64 // response.done events counted, ever

	perResponse Usage // the most one response.done is counted for

	mu         sync.Mutex // serializes Write
	maxMessage int
	dead       bool // corrupt framing (or an internal fault): the rest is ignored
	closed     bool // a close frame began: the server sends no data after it
	fault      bool // Write recovered from a panic (a bug: see Faulted)

	// The frame being read.
	frames wsframe.Reader
	fin    bool
	data   bool // a data frame (text, binary, continuation), not a control frame
	gather bool // its payload goes into buf

	// The data message being read.
	inMessage bool
	skip      bool // binary, compressed or over maxMessage: not gathered
	buf       []byte
}

// realtimeRetainedBuffer is the largest message buffer kept for the next
// message; a larger one (up to maxMessage) is released once its message ends.
const realtimeRetainedBuffer = 64 << 10

var responseDoneType = []byte(`"response.done"`)

// realtimeUsageEvent is what is decoded of a message that may be a
// response.done event.
type realtimeUsageEvent struct {
	Type     string `json:"type"`
	Response struct {
		Usage struct {
			TotalTokens       realtimeCount `json:"total_tokens"`
			InputTokens       realtimeCount `json:"input_tokens"`
			OutputTokens      realtimeCount `json:"output_tokens"`
			InputTokenDetails struct {
				CachedTokens realtimeCount `json:"cached_tokens"`
				AudioTokens  realtimeCount `json:"audio_tokens"`
			} `json:"input_token_details"`
			OutputTokenDetails struct {
				AudioTokens realtimeCount `json:"audio_tokens"`
			} `json:"output_token_details"`
		} `json:"usage"`
	} `json:"response"`
}

// realtimeCount is a count of a response.done event, read by parseCount from
// the JSON text itself (a json.RawMessage would be a copy of it to allocate):
// a value that is not a count is 0.
type realtimeCount int64

func (c *realtimeCount) UnmarshalJSON(b []byte) error {
	n, _ := parseCount(b)
	*c = realtimeCount(n)
	return nil
}

// NewRealtimeTap returns a tap that reads text messages of up to maxMessage
// bytes, and counts each response's usage at most perResponse, count by
// count.
func NewRealtimeTap(maxMessage int, perResponse Usage) *RealtimeTap {
	return &RealtimeTap{maxMessage: max(maxMessage, 0), perResponse: perResponse}
}

// Write takes the next bytes the server sent, in order. Safe for concurrent
// use (calls are serialized inside): each call must then carry whole frames,
// or the interleaving of two writers' partial frames cannot be parsed. Never
// fails, never panics, never retains p.
func (t *RealtimeTap) Write(p []byte) (int, error) {
	n := len(p)
	t.mu.Lock()
	defer t.mu.Unlock()
	defer func() {
		// Write runs on reverse_proxy's copier goroutine, where a panic would
		// take the whole process down: a bug here costs only the metering.
		if recover() != nil {
			t.fault = true
			t.fail()
		}
	}()
	for len(p) > 0 && !t.dead {
		var into *[]byte
		if t.gather {
			into = &t.buf // capacity reserved by beginFrame
		}
		var step wsframe.Step
		p, step = t.frames.Next(p, into)
		if step.Begins {
			t.beginFrame(step.Frame)
		}
		if step.Ends && !t.dead {
			t.endFrame()
		}
	}
	return n, nil
}

// Take returns the usage counted since the last Take, and resets it. Safe
// for concurrent use with Write; each count is taken on its own, so a Take
// while a response.done is being added may see part of it, and the next Take
// the rest: the sums over every Take are exact. A part is never taken
// before its whole (the wholes are added first and taken last), only maybe
// in the Take after its whole's.
func (t *RealtimeTap) Take() Usage {
	return Usage{
		// The parts first: meter adds the wholes first.
		UncachedInput: t.uncachedInput.Swap(0), CacheRead: t.cacheRead.Swap(0), AudioInput: t.audioInput.Swap(0), AudioOutput: t.audioOutput.Swap(0),
		Total: t.total.Swap(0), Input: t.input.Swap(0), Output: t.output.Swap(0),
	}
}

// Unmetered is the number of messages that could not be read for usage: text
// messages over maxMessage, compressed (RSV1) messages, and, once, the rest
// of a stream whose framing is corrupt. Safe for concurrent use with Write.
func (t *RealtimeTap) Unmetered() int64 { return t.skips.Load() }

// Clamped is how many responses reported more than perResponse (of any
// count) and were counted at it.
func (t *RealtimeTap) Clamped() int64 { return t.clamped.Load() }

// Responses is how many response.done events have been counted, ever. A
// response is counted once its usage is added: a Take after Responses has
// read n takes the usage of those n responses, if an earlier Take has not.
func (t *RealtimeTap) Responses() int64 { return t.responses.Load() }

// Between reports whether the bytes written so far end between two
// messages: no frame header or payload half-read, no fragmented message
// begun and not ended, no close frame sent. A message written then, whole,
// is a message of its own in the stream the client reads.
func (t *RealtimeTap) Between() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.dead && !t.closed && t.frames.Between() && !t.inMessage
}

// Faulted reports whether Write recovered from a panic, which only a bug
// causes: tests check that it never does.
func (t *RealtimeTap) Faulted() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fault
}

// fail stops parsing for the rest of the connection.
func (t *RealtimeTap) fail() {
	if !t.dead {
		t.dead = true
		t.skips.Add(1)
	}
	t.buf = nil
}

// beginFrame interprets the complete header of the frame f.
func (t *RealtimeTap) beginFrame(f wsframe.Frame) {
	if f.Corrupt(t.inMessage) {
		t.fail()
		return
	}
	op, length := f.Op, f.Length
	t.fin, t.data, t.gather = f.Fin, !f.Control(), false
	t.closed = t.closed || op == wsframe.OpClose
	if op == wsframe.OpText || op == wsframe.OpBinary {
		t.inMessage = true
		t.skip = op == wsframe.OpBinary // binary messages carry no usage
		if op == wsframe.OpText && f.RSV1 {
			t.skip = true // permessage-deflate: not readable here
			t.skips.Add(1)
		}
	}
	if t.data && !t.skip {
		if uint64(len(t.buf))+length > uint64(t.maxMessage) {
			t.skip = true
			t.skips.Add(1)
			t.buf = t.buf[:0]
		} else {
			t.reserve(int(length))
			t.gather = true
		}
	}
}

// reserve makes room in buf for n more bytes; len(buf)+n <= maxMessage.
func (t *RealtimeTap) reserve(n int) {
	need := len(t.buf) + n
	if need <= cap(t.buf) {
		return
	}
	newCap := min(max(need, 2*cap(t.buf), 512), t.maxMessage)
	b := make([]byte, len(t.buf), newCap)
	copy(b, t.buf)
	t.buf = b
}

func (t *RealtimeTap) endFrame() {
	if !t.data || !t.fin {
		return
	}
	if !t.skip {
		t.meter(t.buf)
	}
	t.inMessage, t.skip = false, false
	if cap(t.buf) > realtimeRetainedBuffer {
		t.buf = nil
	} else {
		t.buf = t.buf[:0]
	}
}

// meter adds the usage of msg, a complete text message, if it is a
// response.done event. Any other message costs a search and no allocation.
func (t *RealtimeTap) meter(msg []byte) {
	if !bytes.Contains(msg, responseDoneType) {
		return
	}
	var ev realtimeUsageEvent
	if json.Unmarshal(msg, &ev) != nil || ev.Type != "response.done" {
		return
	}
	u := &ev.Response.Usage
	in, out := int64(u.InputTokens), int64(u.OutputTokens)
	cached := min(int64(u.InputTokenDetails.CachedTokens), in)
	reported := Usage{
		Total: int64(u.TotalTokens), Input: in, Output: out,
		UncachedInput: in - cached, CacheRead: cached,
		AudioInput:  min(int64(u.InputTokenDetails.AudioTokens), in),
		AudioOutput: min(int64(u.OutputTokenDetails.AudioTokens), out),
	}
	counted, over := reported.Within(t.perResponse)
	if over {
		t.clamped.Add(1)
	}
	t.total.Add(counted.Total)
	t.input.Add(counted.Input)
	t.output.Add(counted.Output)
	t.uncachedInput.Add(counted.UncachedInput)
	t.cacheRead.Add(counted.CacheRead)
	t.audioInput.Add(counted.AudioInput)
	t.audioOutput.Add(counted.AudioOutput)
	t.responses.Add(1)
}
