package ratelimit

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
	"github.com/rolter/caddy-ratelimit/internal/tokenest"
	"github.com/rolter/caddy-ratelimit/internal/usage"
)

// An OpenAI streaming chat completion reports its usage only when the request
// sets stream_options.include_usage. With ensure_stream_usage (the default),
// a request that lacks it gets it on the way upstream, and the usage-only
// chunk that it adds is removed from what the client receives, so that the
// client sees the stream it asked for and the gateway still charges tokens.

// requestStreamUsage adds stream_options.include_usage to an OpenAI streaming
// chat-completions request that lacks it, and returns the stripper that hides
// the resulting usage chunk from the client; nil if the request is left as it
// is. body is the request's, buffered (nil when it was not read).
func requestStreamUsage(req *request, body []byte) *usageStripper {
	if body == nil || req.call.API != llmapi.Chat || req.Method != http.MethodPost {
		return nil
	}
	r := req.Request
	edit, ok := streamUsageEdit(body)
	if !ok {
		return nil
	}
	rewritten := edit.apply(body)
	r.Body = readCloser{bytes.NewReader(rewritten), r.Body} // closes the original
	r.ContentLength = int64(len(rewritten))
	r.TransferEncoding = nil
	r.Header.Set("Content-Length", strconv.Itoa(len(rewritten)))
	// An uncompressed stream lets the stripper drop a chunk without
	// re-encoding; Caddy's encode can still compress toward the client.
	r.Header.Set("Accept-Encoding", "identity")
	return newUsageStripper()
}

type readCloser struct {
	io.Reader
	io.Closer
}

// streamUsageEdit is the edit of body that sets stream_options.include_usage,
// if body is a streaming request that does not already ask for usage. It
// edits the JSON text, not a decoding of it, so that the upstream gets the
// client's bytes as they were sent (key order, keys given twice, whitespace,
// numbers and string escapes) plus the option:
//
//   - A request is a stream when its top-level "stream" is true. Of a key
//     given twice the last counts, as encoding/json and Python's json read
//     it; keys are compared unescaped ("stre\u0061m" is "stream"), and the
//     keys of nested objects do not count.
//   - Without a top-level stream_options, "stream_options":{"include_usage":true}
//     is added as the object's last member, just before its closing brace.
//   - A stream_options of null becomes {"include_usage":true}.
//   - Of a stream_options object, the (last) include_usage becomes true, or
//     "include_usage":true is added as its last member when it has none. If
//     it is true already, the client asked for usage and gets the chunk:
//     there is no edit.
//   - Anything else (a body that is not one JSON object, a stream_options
//     that is neither an object nor null) has no edit.
func streamUsageEdit(body []byte) (bodyEdit, bool) {
	// Most requests are not streams: spare them the parsing, unless a key
	// may be spelled with escapes.
	if !bytes.Contains(body, []byte(`"stream"`)) && !bytes.Contains(body, []byte(`\u`)) {
		return bodyEdit{}, false
	}
	req, ok := tokenest.ReadObject(body, "stream", "stream_options")
	if !ok || string(req.Values[0].Of(body)) != "true" {
		return bodyEdit{}, false
	}
	optsStart := req.Values[1].Start
	opts := req.Values[1].Of(body)
	switch {
	case !req.Values[1].Found(): // after "stream", so after a comma
		return bodyEdit{req.Close, req.Close, `,"stream_options":{"include_usage":true}`}, true
	case opts[0] == 'n': // null
		return bodyEdit{optsStart, optsStart + len(opts), `{"include_usage":true}`}, true
	case opts[0] != '{':
		return bodyEdit{}, false
	}
	inner, _ := tokenest.ReadObject(opts, "include_usage") // valid: read with the body
	include := inner.Values[0]
	switch {
	case !include.Found():
		member := `"include_usage":true`
		if !inner.Empty {
			member = "," + member
		}
		return bodyEdit{optsStart + inner.Close, optsStart + inner.Close, member}, true
	case string(include.Of(opts)) == "true":
		return bodyEdit{}, false // the client asked for usage: it gets the chunk
	}
	return bodyEdit{optsStart + include.Start, optsStart + include.End, "true"}, true
}

// bodyEdit replaces body[start:end] with text.
type bodyEdit struct {
	start, end int
	text       string
}

func (e bodyEdit) apply(body []byte) []byte {
	out := make([]byte, 0, len(body)-(e.end-e.start)+len(e.text))
	out = append(out, body[:e.start]...)
	out = append(out, e.text...)
	return append(out, body[e.end:]...)
}

// usageStripper removes the usage-only chunk from an uncompressed SSE stream
// on its way to the client. It passes every complete event on at once and
// holds back only what follows the last one (an incomplete event, which a
// client could not use yet), up to usage.MaxEvent bytes. Once the chunk is
// gone the rest passes straight through.
type usageStripper struct {
	scan   *usage.SSEScanner
	held   []byte // stream[heldAt:], not passed on yet
	heldAt int64
	ready  int64    // the end of the last complete event
	cut    [2]int64 // the usage chunk's bytes, once found
	done   bool
}

func newUsageStripper() *usageStripper {
	s := new(usageStripper)
	s.scan = usage.NewSSEScanner(usage.MaxEvent, func(ev usage.SSEEvent) {
		s.ready = ev.End
		if s.cut[1] == 0 && !ev.Oversize && usage.IsUsageOnlyChunk(ev.Data) {
			s.cut = [2]int64{ev.Start, ev.End}
		}
	})
	return s
}

// applies reports whether the response is a stream the stripper can read.
func (s *usageStripper) applies(h http.Header) bool {
	ce := h.Get("Content-Encoding")
	return strings.EqualFold(usage.MediaType(h.Get("Content-Type")), "text/event-stream") && (ce == "" || ce == "identity")
}

func (s *usageStripper) write(w io.Writer, p []byte) (int, error) {
	if s.done {
		return w.Write(p)
	}
	s.held = append(s.held, p...)
	s.scan.Write(p)
	complete := s.held[:s.ready-s.heldAt]
	var err error
	if s.cut[1] > 0 {
		// Everything but the chunk goes out, and from now on as it comes.
		_, err = w.Write(complete[:s.cut[0]-s.heldAt])
		if err == nil {
			_, err = w.Write(s.held[s.cut[1]-s.heldAt:])
		}
		s.done, s.held = true, nil
		return len(p), err
	}
	_, err = w.Write(complete)
	s.held = append(s.held[:0], s.held[len(complete):]...)
	s.heldAt = s.ready
	if len(s.held) > usage.MaxEvent { // too large to be the usage chunk
		_, err = w.Write(s.held)
		s.done, s.held = true, nil
	}
	return len(p), err
}

// flushTail writes what is still held when the stream ends.
func (s *usageStripper) flushTail(w io.Writer) error {
	var err error
	if !s.done && len(s.held) > 0 {
		_, err = w.Write(s.held)
	}
	s.held, s.done = nil, true
	return err
}
