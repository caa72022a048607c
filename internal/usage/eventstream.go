package usage

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
)

// --- AWS event streams (application/vnd.amazon.eventstream) ---

// An AWS event stream is Bedrock's streaming answer (ConverseStream,
// InvokeModelWithResponseStream): binary messages, each a prelude (its
// total length and its headers' length, big-endian uint32s, and their
// CRC32), typed headers (:message-type, :event-type, …), a payload, and
// the whole message's CRC32. ConverseStream's usage is in the payload of
// its metadata event, a JSON document; InvokeModelWithResponseStream's
// chunk events carry the model's own events as base64 in {"bytes": …},
// the last with amazon-bedrock-invocationMetrics.
//
// The messages that may carry usage are decoded by the AWS SDK's own
// decoder (aws-sdk-go-v2/aws/protocol/eventstream), which checks both CRCs
// and reads the headers. It costs about 38 allocations and 1.6 KB a
// message (BenchmarkEventStreamMeter: 190k allocations and 8 MB for a MiB
// of ConverseStream's text deltas), so the meter frames the stream and
// checks each message's CRCs itself, finds its payload from the prelude's
// lengths, and hands the decoder only a message whose payload may carry
// usage (a few a response), as the SSE path scans only such events. The
// decoder also trusts the lengths a prelude claims: it checks no bound (a
// 4 GiB claim grows its buffer as bytes come), and a header length above
// the total underflows the payload's. So the meter reads each prelude
// itself first, checks its CRC, and bounds it: a message is at most
// maxEventStreamPayload of payload and maxEventStreamHeaders of headers,
// else the stream is broken. A message up to MaxEvent is gathered whole; a
// larger one is crossed without being kept, its CRC computed as it passes,
// as the SSE scanner skips an event over MaxEvent. So a response holds at
// most MaxEvent of message, its payload and a chunk's decoded bytes,
// whatever lengths the upstream claims.
//
// A CRC that does not match, or a prelude out of bounds, leaves the
// response unmetered: its reservation is charged, since nothing it
// reported can be trusted. A stream cut inside a message is metered with
// what its whole messages reported.
const (
	maxEventStreamPayload = 24 << 20
	maxEventStreamHeaders = 128 << 10

	eventPreludeLen = 12 // total length, headers length, prelude CRC
	eventMinLen     = eventPreludeLen + 4
)

// eventDecoder decodes one gathered message: the SDK's decoder keeps no
// state between messages.
var eventDecoder = eventstream.NewDecoder()

// eventStreamReader reads an AWS event stream's messages as their bytes
// come, and hands each event's JSON to its meter's scanner.
type eventStreamReader struct {
	m *Meter

	msg   []byte // the message being gathered: its prelude, then all of it if it is kept
	total int    // its length, once its prelude is read; 0 before

	// A message over MaxEvent is crossed: left counts its bytes still to
	// come before its CRC, which crc sums as they pass, and tail gathers
	// the CRC.
	crossing bool
	left     int
	crc      uint32
	tail     []byte

	src     bytes.Reader // the decoder's input: msg
	payload []byte       // the decoder's payload buffer, kept for the next message
	chunk   []byte       // a chunk event's bytes, decoded from base64
}

// write reads the next bytes of the stream.
func (r *eventStreamReader) write(p []byte) {
	for len(p) > 0 && !r.m.failed {
		var n int
		switch {
		case r.crossing && r.left > 0:
			n = min(len(p), r.left)
			r.crc = crc32.Update(r.crc, crc32.IEEETable, p[:n])
			r.left -= n
		case r.crossing:
			n = min(len(p), 4-len(r.tail))
			r.tail = append(r.tail, p[:n]...)
			if len(r.tail) == 4 {
				r.crossed()
			}
		case r.total == 0:
			n = min(len(p), eventPreludeLen-len(r.msg))
			r.msg = append(r.msg, p[:n]...)
			if len(r.msg) == eventPreludeLen {
				r.prelude()
			}
		default:
			n = min(len(p), r.total-len(r.msg))
			r.msg = append(r.msg, p[:n]...)
			if len(r.msg) == r.total {
				r.message()
			}
		}
		p = p[n:]
	}
}

// prelude reads a message's prelude, in r.msg, and decides whether the
// message is kept or crossed.
func (r *eventStreamReader) prelude() {
	b := r.msg
	total, headers := int(binary.BigEndian.Uint32(b[0:4])), int(binary.BigEndian.Uint32(b[4:8]))
	if crc32.ChecksumIEEE(b[:8]) != binary.BigEndian.Uint32(b[8:12]) ||
		total < eventMinLen || headers > maxEventStreamHeaders || headers > total-eventMinLen ||
		total-eventMinLen-headers > maxEventStreamPayload {
		r.m.failed = true // a broken stream: see eventStreamReader
		return
	}
	if total <= MaxEvent {
		r.total = total
		return
	}
	r.m.oversize++
	r.crossing, r.left, r.crc = true, total-eventPreludeLen-4, crc32.ChecksumIEEE(b)
	r.msg, r.tail = r.msg[:0], r.tail[:0]
}

// crossed ends a message crossed: its CRC, in r.tail, must match.
func (r *eventStreamReader) crossed() {
	if binary.BigEndian.Uint32(r.tail) != r.crc {
		r.m.failed = true
	}
	r.crossing = false
}

// message reads a whole message kept in r.msg: one whose payload, or the
// model's event a chunk's payload carries, may carry usage is decoded, and
// that JSON scanned if the message is the event it looks like.
func (r *eventStreamReader) message() {
	msg := r.msg
	r.msg, r.total = r.msg[:0], 0 // msg stays whole until the next write
	end := len(msg) - 4
	if crc32.ChecksumIEEE(msg[:end]) != binary.BigEndian.Uint32(msg[end:]) {
		r.m.failed = true
		return
	}
	payload := msg[eventPreludeLen+int(binary.BigEndian.Uint32(msg[4:8])) : end]
	chunk := r.chunkBytes(payload)
	if !eventMayCarryUsage(payload) && !eventMayCarryUsage(chunk) {
		return
	}
	r.src.Reset(msg)
	decoded, err := eventDecoder.Decode(&r.src, r.payload[:0])
	if err != nil {
		r.m.failed = true
		return
	}
	r.payload = decoded.Payload
	if !isHeader(decoded.Headers, ":message-type", "event") {
		return // an exception or an error: it carries no usage
	}
	doc := payload
	if isHeader(decoded.Headers, ":event-type", "chunk") {
		doc = chunk
	}
	if eventMayCarryUsage(doc) {
		r.m.json.reset()
		r.m.json.write(doc)
	}
}

// eventMayCarryUsage reports whether an event's JSON may carry usage: a
// usage object, or Bedrock's count of an invocation.
func eventMayCarryUsage(doc []byte) bool {
	return mayCarryUsage(doc) || bytes.Contains(doc, []byte(`"amazon-bedrock-invocationMetrics"`))
}

// isHeader reports whether the message's header name is the string want.
func isHeader(h eventstream.Headers, name, want string) bool {
	v, ok := h.Get(name).(eventstream.StringValue)
	return ok && string(v) == want
}

// chunkBytes is the model's own event that a chunk event's payload
// carries, {"bytes":"<base64>"} beside Bedrock's padding ("p"); nil if the
// payload is not one. Bedrock writes it so, which is read without
// decoding the JSON; an escape in the base64 (JSON may write / as \/) is
// decoded as JSON.
func (r *eventStreamReader) chunkBytes(payload []byte) []byte {
	const member = `{"bytes":"`
	if !bytes.HasPrefix(payload, []byte(member)) {
		return nil
	}
	b64 := payload[len(member):]
	if end := bytes.IndexByte(b64, '"'); end >= 0 {
		b64 = b64[:end]
	}
	if bytes.IndexByte(b64, '\\') >= 0 {
		var c struct {
			Bytes []byte `json:"bytes"`
		}
		if json.Unmarshal(payload, &c) != nil {
			return nil
		}
		return c.Bytes
	}
	n := base64.StdEncoding.DecodedLen(len(b64))
	if cap(r.chunk) < n {
		r.chunk = make([]byte, n)
	}
	n, err := base64.StdEncoding.Decode(r.chunk[:n], b64)
	if err != nil {
		return nil
	}
	return r.chunk[:n]
}
