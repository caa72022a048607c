package usage

import (
	"bytes"
	"net/http"
	"strings"
)

const (
	// MaxEvent bounds the bytes of one SSE event (all its lines and line
	// ends). A larger event is skipped; if it was the one carrying usage, the
	// response is unmetered.
	MaxEvent = 1 << 20

	// maxValue caps each reported count so that sums cannot overflow.
	maxValue = 1 << 40
)

// body is how a response body is read.
type body uint8

const (
	bodyNone body = iota // not metered: Write does nothing
	bodyJSON
	bodySSE
	bodyEventStream // AWS's binary event stream (eventstream.go)
)

// Meter reads one response body for the usage its upstream reports. It
// is not safe for concurrent use: Write and Finish are called in sequence (from
// any goroutines, one after another).
type Meter struct {
	body   body
	coding coding

	tally tally
	json  jsonScanner        // the JSON body, or one SSE event's data, or one event stream's event, at a time
	sse   *SSEScanner        // SSE bodies only
	es    *eventStreamReader // event streams only

	// headerFinal: the response's header reported its usage (Bedrock's
	// InvokeModel), which is its final report.
	headerFinal bool

	oversize int  // SSE events skipped for their size
	failed   bool // corrupt data or an internal fault: unmetered whatever was found
	panicked any  // the internal fault, if any (tests look at it)
	stopped  bool // nothing more is read (Finish was called, or decoding ended)
	finished bool

	dec *decoding // compressed bodies only: made by their first Write
}

// NewMeter starts metering a response with the given response header
// (Content-Type, Content-Encoding are what matter).
func NewMeter(h http.Header) *Meter {
	m := new(Meter)
	m.Start(h)
	return m
}

// Start starts metering a response with the given response header into
// m, a zero Meter: one that lives inside its caller's own state, as the
// response writer it meters for, costs no allocation of its own.
func (m *Meter) Start(h http.Header) {
	m.body = bodyOf(h)
	m.coding = codingOf(h)
	if m.coding == codingUnsupported {
		m.body = bodyNone
	}
	m.json.tally = &m.tally
	m.json.whole = m.body == bodyJSON
	m.json.reset()
	switch m.body {
	case bodySSE:
		m.sse = NewSSEScanner(MaxEvent, m.onEvent)
	case bodyEventStream:
		m.es = &eventStreamReader{m: m}
	}
	m.readHeader(h)
	if m.body == bodyNone {
		m.stopped = true
	}
}

// MediaType is a Content-Type's media type, in the case it was sent (compare
// with strings.EqualFold): what mime.ParseMediaType returns for a valid one,
// without parsing and allocating the parameters.
func MediaType(contentType string) string {
	if i := strings.IndexByte(contentType, ';'); i >= 0 {
		contentType = contentType[:i]
	}
	return strings.TrimSpace(contentType)
}

// bodyOf tells the body's shape from its Content-Type.
func bodyOf(h http.Header) body {
	if h == nil {
		return bodyNone
	}
	ct := MediaType(h.Get("Content-Type"))
	switch {
	case strings.EqualFold(ct, "text/event-stream"):
		return bodySSE
	case strings.EqualFold(ct, "application/json"):
		return bodyJSON
	case strings.EqualFold(ct, "application/vnd.amazon.eventstream"):
		return bodyEventStream
	case len(ct) > len("+json") && strings.IndexByte(ct, '/') > 0 &&
		strings.EqualFold(ct[len(ct)-len("+json"):], "+json"):
		return bodyJSON
	}
	return bodyNone
}

// Write takes the next body bytes as they go to the client. It never fails,
// never blocks for long, never retains p after returning, and never panics on any input.
func (m *Meter) Write(p []byte) (int, error) {
	if m.stopped || len(p) == 0 {
		return len(p), nil
	}
	defer m.recoverFault()
	if m.coding == codingIdentity {
		m.feed(p)
	} else {
		m.decodeMore(p)
	}
	return len(p), nil
}

// Finish ends the body (also called when the client went away mid-stream)
// and returns the usage to charge, and whether any usage was found. After a
// partial stream it returns what was reported by then.
func (m *Meter) Finish() (Usage, bool) {
	if !m.finished {
		m.finished = true
		m.finish()
	}
	if m.failed {
		return Usage{}, false
	}
	return m.tally.usage()
}

// Final ends the body as Finish does, and reports whether the usage Finish
// returns is the response's final report (see final.go): false for a
// stream cut before it, whatever it reported by then, and for a body that
// reported nothing.
func (m *Meter) Final() bool {
	_, metered := m.Finish()
	return metered && (m.json.final || m.headerFinal)
}

func (m *Meter) finish() {
	defer m.recoverFault()
	m.stopped = true
	if d := m.dec; d != nil && d.next != nil {
		// Let the decoder see the end of its input and drain what it holds.
		d.src.eof = true
		d.next()
		d.stop()
		d.next, d.stop = nil, nil
	}
	if m.sse != nil && !m.failed {
		// An event the stream ended in without its blank line still counts:
		// a truncated stream is metered with what it reported.
		m.sse.Flush()
	}
	m.sse, m.es = nil, nil
}

// recoverFault turns a panic (a bug: no input should cause one) into an
// unmetered response rather than a crashed request.
func (m *Meter) recoverFault() {
	if r := recover(); r != nil {
		m.panicked = r
		m.failed = true
		m.stopped = true
	}
}

// feed reads decoded body bytes.
func (m *Meter) feed(p []byte) {
	switch m.body {
	case bodySSE:
		m.sse.Write(p)
	case bodyEventStream:
		m.es.write(p)
	default:
		m.json.write(p)
	}
}

// bedrockCountHeaders are the headers in which Bedrock reports the tokens
// of an InvokeModel call (whose body is the model's own answer), and the
// fields they are.
var bedrockCountHeaders = [...]struct {
	name  string
	field field
}{
	{"X-Amzn-Bedrock-Input-Token-Count", fieldBedrockInputTokens},
	{"X-Amzn-Bedrock-Output-Token-Count", fieldBedrockOutputTokens},
	{"X-Amzn-Bedrock-Cache-Read-Input-Token-Count", fieldBedrockCacheReadTokens},
	{"X-Amzn-Bedrock-Cache-Write-Input-Token-Count", fieldBedrockCacheWriteTokens},
}

// readHeader reads the usage a response's header reports: Bedrock's
// counts of an InvokeModel call, the whole call's, sent once it is done:
// its final report. A header that is not a count is not read. Other
// responses cost a map lookup per header.
func (m *Meter) readHeader(h http.Header) {
	for _, c := range bedrockCountHeaders {
		if v := h[c.name]; len(v) == 1 {
			if n, ok := parseCount([]byte(v[0])); ok {
				m.tally.record(c.field, n)
				m.headerFinal = true
			}
		}
	}
}

// onEvent reads one SSE event. An event that cannot carry usage costs one
// substring search and no allocation.
func (m *Meter) onEvent(ev SSEEvent) {
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
		rest = rest[skipSpace(rest, 1):]
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		rest = rest[skipSpace(rest, 1):]
		if bytes.HasPrefix(rest, []byte("null")) {
			continue
		}
		return true
	}
	return false
}
