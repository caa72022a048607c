package usage

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// withinBounds reports whether the reader holds no more than its bounds
// allow: a message of at most MaxEvent, its payload, a chunk decoded from
// it (append may round a capacity up: twice MaxEvent is the bound).
func (r *eventStreamReader) withinBounds() bool {
	return cap(r.msg) <= 2*MaxEvent && cap(r.payload) <= 2*MaxEvent && cap(r.chunk) <= 2*MaxEvent
}

var eventStreamHeader = usagetest.Header("application/vnd.amazon.eventstream", "")

// converseStream is the golden ConverseStream sample, encoded by the AWS
// SDK's encoder, and where its last message (the metadata event) starts.
func converseStream(t testing.TB) (body []byte, lastStart int) {
	body = usagetest.Read(t, "bedrock_converse_stream.eventstream.json")
	return body, len(body) - int(binary.BigEndian.Uint32(lastMessageLength(t, body)))
}

// lastMessageLength is the prelude length field of body's last message.
func lastMessageLength(t testing.TB, body []byte) []byte {
	t.Helper()
	for at := 0; at < len(body); {
		n := int(binary.BigEndian.Uint32(body[at:]))
		if at+n == len(body) {
			return body[at : at+4]
		}
		at += n
	}
	t.Fatal("no last message")
	return nil
}

// meterInPieces meters body in writes of at most n bytes.
func meterInPieces(h http.Header, body []byte, n int) *Meter {
	m := NewMeter(h)
	for len(body) > 0 {
		k := min(n, len(body))
		m.Write(body[:k])
		body = body[k:]
	}
	return m
}

// A message whose checksum does not match, its prelude's or its own,
// leaves the whole response unmetered, whatever earlier messages reported:
// its usage cannot be trusted, and the gateway charges the reservation.
func TestAnEventStreamMessageWhoseCRCFailsLeavesTheResponseUnmetered(t *testing.T) {
	body, last := converseStream(t)
	for name, at := range map[string]int{
		"the prelude's CRC":    last + 9,
		"a header":             last + 13,
		"the payload":          len(body) - 10,
		"the message's CRC":    len(body) - 1,
		"an earlier message's": 5,
		"an earlier prelude's": 8,
	} {
		broken := bytes.Clone(body)
		broken[at] ^= 0x20
		for _, piece := range []int{1, 7, len(body)} {
			m := meterInPieces(eventStreamHeader, broken, piece)
			if u, metered := m.Finish(); metered || u != (Usage{}) {
				t.Errorf("%s broken, in writes of %d: (%+v, %v), want unmetered", name, piece, u, metered)
			}
		}
	}
}

// A stream cut inside a message is metered with what its whole messages
// reported, and is final only if one of them was its terminal event.
func TestAnEventStreamCutInsideAMessageIsMeteredWithItsWholeMessages(t *testing.T) {
	body, last := converseStream(t)
	for _, cut := range []int{last + 3, last + 12, last + 40, len(body) - 1} {
		m := meterInPieces(eventStreamHeader, body[:cut], 64)
		if u, metered := m.Finish(); metered || m.Final() {
			t.Errorf("cut at %d of %d, inside the metadata event: (%+v, %v), want unmetered", cut, len(body), u, metered)
		}
	}
	invoke := usagetest.Read(t, "bedrock_invoke_stream.eventstream.json")
	ends := usagetest.EventStreamTerminals(t, "bedrock_invoke_stream.eventstream.json")
	m := meterInPieces(eventStreamHeader, invoke[:ends[0]+20], 64) // message_delta whole, message_stop cut
	if u, metered := m.Finish(); !metered || !m.Final() || u.Output != 88 || u.Input != 12 {
		t.Errorf("cut inside the last chunk: (%+v, %v, final %v), want message_delta's 88 output tokens, final", u, metered, m.Final())
	}
	m = meterInPieces(eventStreamHeader, invoke[:ends[0]-1], 64)
	if u, metered := m.Finish(); !metered || m.Final() || u.Output != 1 {
		t.Errorf("cut inside message_delta: (%+v, %v, final %v), want message_start's running count, not final", u, metered, m.Final())
	}
}

// prelude is an event stream message's prelude claiming total and headers
// bytes, with its own CRC right.
func prelude(total, headers uint32) []byte {
	b := binary.BigEndian.AppendUint32(nil, total)
	b = binary.BigEndian.AppendUint32(b, headers)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

// A message claiming lengths beyond the AWS SDKs' bounds (4 GiB, a payload
// over 24 MiB, headers over 128 KiB or longer than the message) is a
// broken stream: the response is unmetered at once, and the meter keeps
// nothing of what follows, however much of it comes.
func TestAnEventStreamMessageClaimingTooMuchEndsMeteringWithBoundedMemory(t *testing.T) {
	body, _ := converseStream(t)
	for name, p := range map[string][]byte{
		"4 GiB":                      prelude(1<<32-1, 100),
		"a payload of 25 MiB":        prelude(25<<20+16, 0),
		"headers of 200 KiB":         prelude(300<<10, 200<<10),
		"headers longer than itself": prelude(100, 90),
		"shorter than a prelude":     prelude(8, 0),
	} {
		m := NewMeter(eventStreamHeader)
		m.Write(body) // a whole stream reported first: the broken message voids it
		m.Write(p)
		for range 20 {
			m.Write(make([]byte, 1<<20))
		}
		if cap(m.es.msg) > 4096 || cap(m.es.payload) > 4096 {
			t.Errorf("%s: the meter holds %d and %d bytes, want only what the stream's small messages took", name, cap(m.es.msg), cap(m.es.payload))
		}
		if u, metered := m.Finish(); metered {
			t.Errorf("%s: (%+v, %v), want unmetered", name, u, metered)
		}
	}
}

// A message over MaxEvent (here 20 MiB) is crossed, not kept: its CRC is
// checked as it passes, and the usage after it is read, in small writes or
// one, with the meter's buffers within their bounds; with its CRC broken
// the response is unmetered.
func TestAnEventStreamMessageOverMaxEventIsCrossedWithItsCRCChecked(t *testing.T) {
	var big bytes.Buffer
	var h eventstream.Headers
	h.Set(":message-type", eventstream.StringValue("event"))
	h.Set(":event-type", eventstream.StringValue("contentBlockDelta"))
	payload := append(append([]byte(`{"contentBlockIndex":0,"delta":{"text":"`), bytes.Repeat([]byte("a"), 20<<20)...), `"}}`...)
	if err := eventstream.NewEncoder().Encode(&big, eventstream.Message{Headers: h, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	body, _ := converseStream(t)
	stream := append(big.Bytes(), body...)
	for _, piece := range []int{4093, len(stream)} {
		m := meterInPieces(eventStreamHeader, stream, piece)
		if !m.es.withinBounds() {
			t.Errorf("writes of %d: the meter's buffers grew to %d, %d", piece, cap(m.es.msg), cap(m.es.payload))
		}
		if u, metered := m.Finish(); !metered || u != (Usage{Total: 76, Input: 19, Output: 57, UncachedInput: 19}) || m.oversize != 1 {
			t.Errorf("writes of %d: (%+v, %v), %d crossed; want the metadata's usage, one message crossed", piece, u, metered, m.oversize)
		}
	}
	broken := bytes.Clone(stream)
	broken[len(big.Bytes())/2] ^= 1
	if u, metered := meterInPieces(eventStreamHeader, broken, 1<<16).Finish(); metered {
		t.Errorf("a crossed message's CRC broken: (%+v, %v), want unmetered", u, metered)
	}
}

// InvokeModel's answer is the model's own body, which Bedrock's headers
// count beside it: the headers alone are a final report (a model whose body
// the meter does not read), and beside Anthropic's usage they are the
// same tokens, charged once; a header that is not a count is not read.
func TestBedrocksCountHeadersAreInvokeModelsFinalReportChargedOnce(t *testing.T) {
	counts := func(ct string, in, out, read, write string) http.Header {
		h := usagetest.Header(ct, "")
		for name, v := range map[string]string{
			"X-Amzn-Bedrock-Input-Token-Count": in, "X-Amzn-Bedrock-Output-Token-Count": out,
			"X-Amzn-Bedrock-Cache-Read-Input-Token-Count": read, "X-Amzn-Bedrock-Cache-Write-Input-Token-Count": write,
		} {
			if v != "" {
				h.Set(name, v)
			}
		}
		return h
	}
	for _, c := range []struct {
		name   string
		header http.Header
		body   string
		want   Usage
		final  bool
	}{
		{"headers alone, a body not JSON", counts("application/octet-stream", "40", "12", "", ""), "<generated text>",
			Usage{Total: 52, Input: 40, Output: 12, UncachedInput: 40}, true},
		{"headers with cache counts", counts("application/json", "8", "30", "1200", "300"), `{"generation":"…"}`,
			Usage{Total: 1538, Input: 1508, Output: 30, UncachedInput: 8, CacheRead: 1200, CacheWrite: 300}, true},
		{"beside Anthropic's usage", counts("application/json", "17", "4", "6", "2"),
			`{"type":"message","usage":{"input_tokens":17,"cache_creation_input_tokens":2,"cache_read_input_tokens":6,"output_tokens":4}}`,
			Usage{Total: 29, Input: 25, Output: 4, UncachedInput: 17, CacheRead: 6, CacheWrite: 2}, true},
		{"a header that is no count", counts("application/octet-stream", "forty", "", "", ""), "x", Usage{}, false},
	} {
		m := NewMeter(c.header)
		m.Write([]byte(c.body))
		u, metered := m.Finish()
		if u != c.want || metered != c.final || m.Final() != c.final {
			t.Errorf("%s: (%+v, %v, final %v), want %+v, final %v", c.name, u, metered, m.Final(), c.want, c.final)
		}
	}
}
