package ratelimit

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

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
func requestStreamUsage(r *http.Request, body []byte) *usageStripper {
	if body == nil || !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		return nil
	}
	rewritten, ok := withStreamUsage(body)
	if !ok {
		return nil
	}
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

// withStreamUsage returns body with stream_options.include_usage set, if body
// is a streaming request that does not already ask for usage.
func withStreamUsage(body []byte) ([]byte, bool) {
	// Most requests are not streams: spare them the decoding, unless a
	// key may be spelled with escapes.
	if !bytes.Contains(body, []byte(`"stream"`)) && !bytes.Contains(body, []byte(`\u`)) {
		return nil, false
	}
	var req map[string]json.RawMessage
	if json.Unmarshal(body, &req) != nil || string(req["stream"]) != "true" {
		return nil, false
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := req["stream_options"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &opts) != nil {
			return nil, false
		}
	}
	if string(opts["include_usage"]) == "true" {
		return nil, false // the client asked for usage: it gets the chunk
	}
	opts["include_usage"] = json.RawMessage("true")
	var err error
	if req["stream_options"], err = marshalRaw(opts); err != nil {
		return nil, false
	}
	out, err := marshalRaw(req)
	return out, err == nil
}

// marshalRaw marshals without escaping HTML, so that the values the client
// sent keep their bytes.
func marshalRaw(v map[string]json.RawMessage) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
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
func (s *usageStripper) flushTail(w io.Writer) {
	if !s.done && len(s.held) > 0 {
		w.Write(s.held)
	}
	s.held, s.done = nil, true
}
