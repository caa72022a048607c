package ratelimit

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// usageGolden is a sample body under testdata/usage and what it must charge.
type usageGolden struct {
	file    string
	tokens  int64
	metered bool
}

// usageGoldens are written from the providers' public API references (shapes
// and field names; the values are made up). The .sse files are the bytes on
// the wire; gemini_stream.sse uses CRLF line ends, as Gemini does.
var usageGoldens = []usageGolden{
	// OpenAI: total_tokens; the content's "usage" text is not usage.
	{"openai_chat.json", 1163, true},
	{"openai_chat_stream.sse", 31, true}, // stream_options.include_usage
	{"openai_completions.json", 12, true},
	{"openai_embeddings.json", 8, true},
	{"openai_responses.json", 123, true},
	{"openai_responses_stream.sse", 48, true}, // response.completed's response.usage
	// Anthropic: input + output + cache creation + cache read.
	{"anthropic_messages.json", 2095 + 503 + 2051 + 1800, true},
	{"anthropic_messages_stream.sse", 472 + 89 + 0 + 1024, true}, // message_start + message_delta
	{"anthropic_compat_stream.sse", 120 + 30 + 10, true},         // largest value per field
	{"anthropic_stream_error.sse", 310 + 1, true},                // error after message_start
	// Gemini: totalTokenCount (prompt, which includes cached, + candidates + thoughts).
	{"gemini_generate.json", 1263, true},
	{"gemini_stream.sse", 75, true},        // the last (largest) running total
	{"gemini_stream_array.json", 10, true}, // streamGenerateContent without alt=sse
	// No usage: nothing is charged.
	{"openai_error.json", 0, false},
	{"anthropic_error.json", 0, false},
	{"gemini_error.json", 0, false},
	{"openai_stream_without_usage.sse", 0, false},
	{"unknown_shape.json", 0, false}, // "usage" only below the top level
}

func readUsageGolden(t testing.TB, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "usage", file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func usageContentType(file string) string {
	if strings.HasSuffix(file, ".sse") {
		return "text/event-stream; charset=utf-8"
	}
	return "application/json; charset=utf-8"
}

func usageHeader(contentType, encoding string) http.Header {
	h := http.Header{}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	if encoding != "" {
		h.Set("Content-Encoding", encoding)
	}
	return h
}

// usageEncodings are the content codings the meter decodes. "deflate" is
// zlib-wrapped as HTTP says; "deflate-raw" is sent as "deflate" too.
var usageEncodings = []string{"identity", "gzip", "x-gzip", "deflate", "deflate-raw", "br", "zstd"}

// usageEncode compresses b as the coding says (the header value is
// usageEncodingHeader of it).
func usageEncode(t testing.TB, coding string, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	var w io.WriteCloser
	var err error
	switch coding {
	case "identity":
		return b
	case "gzip", "x-gzip":
		w, err = gzip.NewWriterLevel(&out, gzip.BestSpeed)
	case "deflate":
		w, err = zlib.NewWriterLevel(&out, zlib.BestSpeed)
	case "deflate-raw":
		w, err = flate.NewWriter(&out, flate.BestSpeed)
	case "br":
		w = brotli.NewWriterLevel(&out, 1)
	case "zstd":
		w, err = zstd.NewWriter(&out, zstd.WithEncoderLevel(zstd.SpeedFastest))
	default:
		t.Fatalf("unknown coding %q", coding)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func usageEncodingHeader(coding string) string {
	switch coding {
	case "identity":
		return ""
	case "deflate-raw":
		return "deflate"
	}
	return coding
}

// usageChunking splits a body into the Writes the meter gets.
type usageChunking struct {
	name  string
	split func(b []byte) [][]byte
}

func usageChunkings() []usageChunking {
	cs := []usageChunking{
		{"whole", func(b []byte) [][]byte { return [][]byte{b} }},
		{"1-byte", func(b []byte) [][]byte {
			out := make([][]byte, len(b))
			for i := range b {
				out[i] = b[i : i+1]
			}
			return out
		}},
	}
	for _, c := range []struct {
		seed uint64
		max  int
	}{{1, 7}, {2, 64}, {3, 700}, {4, 4096}} {
		cs = append(cs, usageChunking{fmt.Sprintf("random-%d-max%d", c.seed, c.max), func(b []byte) [][]byte {
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

// meterUsage writes the chunks to a meter, each from a buffer that is
// overwritten right after the Write (the meter must not keep p), and finishes.
// A panic that the meter recovered from is a bug: it is raised again here.
func meterUsage(h http.Header, chunks [][]byte) (int64, bool) {
	m := newUsageMeter(h)
	var buf []byte
	for _, c := range chunks {
		buf = append(buf[:0], c...)
		n, err := m.Write(buf)
		if n != len(buf) || err != nil {
			panic(fmt.Sprintf("Write(%d bytes) = %d, %v", len(buf), n, err))
		}
		for i := range buf {
			buf[i] = 'X'
		}
	}
	tokens, metered := m.Finish()
	if m.panicked != nil {
		panic(fmt.Sprintf("the meter recovered from a panic: %v", m.panicked))
	}
	return tokens, metered
}

func TestUsageGoldenSamplesChargeWhatTheProviderReportsWhateverTheEncodingAndChunking(t *testing.T) {
	for _, g := range usageGoldens {
		raw := readUsageGolden(t, g.file)
		for _, coding := range usageEncodings {
			body := usageEncode(t, coding, raw)
			h := usageHeader(usageContentType(g.file), usageEncodingHeader(coding))
			for _, c := range usageChunkings() {
				tokens, metered := meterUsage(h, c.split(body))
				if tokens != g.tokens || metered != g.metered {
					t.Errorf("%s %s %s: got (%d, %v), want (%d, %v)", g.file, coding, c.name, tokens, metered, g.tokens, g.metered)
				}
			}
		}
	}
}

func TestUsageAnthropicStreamChargesTheLargestReportedValuePerField(t *testing.T) {
	// message_start reports input and 1 output token, message_delta the
	// cumulative output; some compatible backends also report input (and
	// even a smaller one later) on message_delta.
	body := "event: message_start\n" +
		`data: {"type":"message_start","message":{"usage":{"input_tokens":100,"cache_read_input_tokens":50,"output_tokens":1}}}` + "\n\n" +
		"event: message_delta\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":null},"usage":{"input_tokens":90,"output_tokens":40}}` + "\n\n" +
		"event: message_delta\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":70,"cache_creation_input_tokens":5}}` + "\n\n"
	tokens, metered := meterUsage(usageHeader("text/event-stream", ""), [][]byte{[]byte(body)})
	if want := int64(100 + 50 + 70 + 5); tokens != want || !metered {
		t.Fatalf("got (%d, %v), want (%d, true)", tokens, metered, want)
	}
}

func TestUsageGeminiStreamChargesTheLargestRunningTotal(t *testing.T) {
	body := "data: {\"usageMetadata\":{\"promptTokenCount\":10,\"totalTokenCount\":10}}\r\n\r\n" +
		"data: {\"usageMetadata\":{\"promptTokenCount\":10,\"candidatesTokenCount\":5,\"totalTokenCount\":15}}\r\n\r\n" +
		"data: {\"usageMetadata\":{\"promptTokenCount\":10,\"candidatesTokenCount\":9,\"thoughtsTokenCount\":20,\"totalTokenCount\":39}}\r\n\r\n"
	tokens, metered := meterUsage(usageHeader("text/event-stream", ""), [][]byte{[]byte(body)})
	if tokens != 39 || !metered {
		t.Fatalf("got (%d, %v), want (39, true)", tokens, metered)
	}
}

func TestUsageChargeIsTheReportedTotalOrElseTheSumOfTheParts(t *testing.T) {
	cases := []struct {
		usage string
		want  int64
	}{
		{`{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}`, 15},
		{`{"prompt_tokens":10,"completion_tokens":5}`, 15},                   // no total
		{`{"prompt_tokens":10,"completion_tokens":5,"total_tokens":0}`, 15},  // a total that leaves parts out
		{`{"prompt_tokens":10,"completion_tokens":5,"total_tokens":20}`, 20}, // a total with more in it
		{`{"prompt_tokens":8,"total_tokens":8}`, 8},                          // embeddings
		{`{"input_tokens":3,"output_tokens":4,"total_tokens":7,"input_tokens_details":{"cached_tokens":2}}`, 7},
		{`{"input_tokens":3,"output_tokens":4,"cache_creation_input_tokens":5,"cache_read_input_tokens":6,"cache_creation":{"ephemeral_5m_input_tokens":5}}`, 18},
		{`{"promptTokenCount":100,"cachedContentTokenCount":80,"candidatesTokenCount":7,"totalTokenCount":107}`, 107},
		{`{"promptTokenCount":100,"candidatesTokenCount":7,"thoughtsTokenCount":3,"toolUsePromptTokenCount":4}`, 114},
		// A backend that echoes both families is charged once, not twice.
		{`{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"input_tokens":10,"output_tokens":5}`, 15},
		// Counts as JSON may write them.
		{`{"total_tokens":1.5e3}`, 1500},
		{`{"total_tokens":12.0}`, 12},
		{`{"total_tokens":-5,"prompt_tokens":2}`, 2},
		{`{"total_tokens":99999999999999999999999}`, maxUsageValue},
		{`{"total_tokens":"15","prompt_tokens":true,"completion_tokens":null}`, 0},
	}
	for _, c := range cases {
		body := `{"id":"x","usage":` + c.usage + `}`
		tokens, _ := meterUsage(usageHeader("application/json", ""), [][]byte{[]byte(body)})
		if tokens != c.want {
			t.Errorf("usage %s: got %d, want %d", c.usage, tokens, c.want)
		}
	}
}

func TestUsageIsReadOnlyWhereProvidersPutIt(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		tokens  int64
		metered bool
	}{
		{"top-level usage", `{"usage":{"total_tokens":5}}`, 5, true},
		{"message.usage", `{"type":"message_start","message":{"usage":{"input_tokens":5}}}`, 5, true},
		{"response.usage", `{"type":"response.completed","response":{"usage":{"total_tokens":5}}}`, 5, true},
		{"usageMetadata", `{"usageMetadata":{"totalTokenCount":5}}`, 5, true},
		{"deeper usage is not", `{"data":{"usage":{"total_tokens":5}}}`, 0, false},
		{"usage in message's child is not", `{"message":{"content":{"usage":{"total_tokens":5}}}}`, 0, false},
		{"usage in a list element's child is not", `{"choices":[{"usage":{"total_tokens":5}}]}`, 0, false},
		{"usage counts nested in usage are not", `{"usage":{"details":{"total_tokens":5}}}`, 0, false},
		{"usage that is not an object", `{"usage":5}`, 0, false},
		{"null usage", `{"usage":null}`, 0, false},
		{"empty usage", `{"usage":{}}`, 0, false},
		{"zero usage is metered", `{"usage":{"prompt_tokens":0,"total_tokens":0}}`, 0, true},
		{"escaped key is not matched", `{"us\u0061ge":{"total_tokens":5}}`, 0, false},
		{"keys in strings are not keys", `{"text":"{\"usage\":{\"total_tokens\":5}}","usage":{"total_tokens":6}}`, 6, true},
		{"several top-level values", `{"usage":{"total_tokens":5}} {"usage":{"total_tokens":9}}`, 9, true},
		{"top-level array of documents", `[{"usageMetadata":{"totalTokenCount":5}},{"usageMetadata":{"totalTokenCount":8}}]`, 8, true},
		{"empty array", `[]`, 0, false},
		{"array in an array is not", `[[{"usage":{"total_tokens":5}}]]`, 0, false},
		{"malformed before usage stops the scan", `{"a":tru e,"usage":{"total_tokens":5}}`, 0, false},
		{"usage before malformed text stays", `{"usage":{"total_tokens":5},"a":}}}}`, 5, true},
		{"truncated before the number ends", `{"usage":{"total_tokens":57`, 0, false},
		{"truncated after a number ends", `{"usage":{"prompt_tokens":57,"completion_tok`, 57, true},
		{"whitespace everywhere", " \n{ \"usage\" \t:\r\n { \"total_tokens\" : 5 } } \n", 5, true},
		{"long keys", `{"` + strings.Repeat("k", 100) + `":1,"usage":{"` + strings.Repeat("t", 40) + `":3,"total_tokens":5}}`, 5, true},
	}
	for _, c := range cases {
		for _, ch := range usageChunkings() {
			tokens, metered := meterUsage(usageHeader("application/json", ""), ch.split([]byte(c.body)))
			if tokens != c.tokens || metered != c.metered {
				t.Errorf("%s (%s): got (%d, %v), want (%d, %v)", c.name, ch.name, tokens, metered, c.tokens, c.metered)
			}
		}
	}
}

func TestUsageOnlyJSONAndEventStreamBodiesInKnownEncodingsAreMetered(t *testing.T) {
	jsonBody := []byte(`{"usage":{"total_tokens":5}}`)
	sseBody := []byte("data: {\"usage\":{\"total_tokens\":5}}\n\n")
	cases := []struct {
		contentType, encoding string
		body                  []byte
		metered               bool
	}{
		{"application/json", "", jsonBody, true},
		{"Application/JSON; charset=UTF-8", "", jsonBody, true},
		{"application/problem+json", "", jsonBody, true},
		{"application/vnd.api+json", "identity", jsonBody, true},
		{"text/event-stream", "", sseBody, true},
		{"TEXT/EVENT-STREAM;charset=utf-8", "", sseBody, true},
		{"", "", jsonBody, false},
		{"text/plain", "", jsonBody, false},
		{"application/x-ndjson", "", jsonBody, false},
		{"+json", "", jsonBody, false},
		{"application/json", "compress", jsonBody, false},
		{"application/json", "gzip, br", jsonBody, false}, // layered codings
		{"application/json", "identity, identity", jsonBody, true},
		{"application/json", "snappy", jsonBody, false},
	}
	for _, c := range cases {
		tokens, metered := meterUsage(usageHeader(c.contentType, c.encoding), [][]byte{c.body})
		if metered != c.metered || (metered && tokens != 5) {
			t.Errorf("Content-Type %q, Content-Encoding %q: got (%d, %v), want metered=%v", c.contentType, c.encoding, tokens, metered, c.metered)
		}
	}
	// The SSE reading of a JSON body, and the other way round, finds nothing.
	if _, metered := meterUsage(usageHeader("text/event-stream", ""), [][]byte{jsonBody}); metered {
		t.Error("a JSON body read as an event stream was metered")
	}
	if tokens, metered := meterUsage(nil, [][]byte{jsonBody}); metered || tokens != 0 {
		t.Error("a response without a header was metered")
	}
}

func TestUsageTruncatedStreamChargesWhatWasReportedBeforeTheCut(t *testing.T) {
	raw := readUsageGolden(t, "anthropic_messages_stream.sse")
	afterStart := bytes.Index(raw, []byte("event: content_block_start"))
	beforeDelta := bytes.Index(raw, []byte("event: message_delta"))
	deltaEnd := beforeDelta + bytes.Index(raw[beforeDelta:], []byte("\n\n")) + 1 // after its data line
	var prev int64
	for cut := 0; cut <= len(raw); cut++ {
		tokens, metered := meterUsage(usageHeader("text/event-stream", ""), [][]byte{raw[:cut]})
		switch {
		case tokens < prev:
			t.Fatalf("cut at %d: %d tokens, fewer than a shorter cut's %d", cut, tokens, prev)
		case cut >= afterStart && cut < beforeDelta && (tokens != 472+1024+2 || !metered):
			t.Fatalf("cut at %d (after message_start): got (%d, %v), want (1498, true)", cut, tokens, metered)
		case cut >= deltaEnd && tokens != 472+1024+89:
			t.Fatalf("cut at %d (after message_delta): got %d, want 1585", cut, tokens)
		}
		prev = tokens
	}
	// An OpenAI stream cut before its usage chunk reported nothing.
	raw = readUsageGolden(t, "openai_chat_stream.sse")
	cut := bytes.Index(raw, []byte(`"choices":[],`))
	if tokens, metered := meterUsage(usageHeader("text/event-stream", ""), [][]byte{raw[:cut]}); metered {
		t.Fatalf("OpenAI stream cut before its usage: got (%d, true), want unmetered", tokens)
	}
}

func TestUsageTruncatedCompressedStreamChargesWhatWasDecodedBeforeTheCut(t *testing.T) {
	raw := readUsageGolden(t, "anthropic_messages_stream.sse")
	events := bytes.SplitAfter(raw, []byte("\n\n"))
	for _, coding := range []string{"gzip", "deflate", "deflate-raw", "br", "zstd"} {
		// Flush after each event, as a streaming server does, and cut the
		// compressed body after the first event's flush.
		var out bytes.Buffer
		var w interface {
			io.WriteCloser
			Flush() error
		}
		switch coding {
		case "gzip":
			w = gzip.NewWriter(&out)
		case "deflate":
			w = zlib.NewWriter(&out)
		case "deflate-raw":
			w, _ = flate.NewWriter(&out, flate.DefaultCompression)
		case "br":
			w = brotli.NewWriter(&out)
		case "zstd":
			w, _ = zstd.NewWriter(&out)
		}
		var firstFlush int
		for i, ev := range events {
			w.Write(ev)
			w.Flush()
			if i == 0 {
				firstFlush = out.Len()
			}
		}
		w.Close()
		body := out.Bytes()
		h := usageHeader("text/event-stream", usageEncodingHeader(coding))
		for _, cut := range []int{firstFlush, firstFlush + 3, len(body) - 3} {
			for _, c := range usageChunkings()[:3] {
				tokens, metered := meterUsage(h, c.split(body[:cut]))
				want := int64(472 + 1024 + 2)
				if cut == len(body)-3 {
					want = 472 + 1024 + 89
				}
				if tokens != want || !metered {
					t.Errorf("%s cut at %d of %d (%s): got (%d, %v), want (%d, true)", coding, cut, len(body), c.name, tokens, metered, want)
				}
			}
		}
	}
}

func TestUsageCorruptCompressedBodiesAreUnmeteredWithoutPanic(t *testing.T) {
	raw := readUsageGolden(t, "openai_chat.json")
	r := rand.New(rand.NewPCG(7, 7))
	for _, coding := range usageEncodings[1:] {
		h := usageHeader("application/json", usageEncodingHeader(coding))
		body := usageEncode(t, coding, raw)
		// Garbage.
		garbage := make([]byte, 4096)
		for i := range garbage {
			garbage[i] = byte(r.Uint32())
		}
		if tokens, metered := meterUsage(h, [][]byte{garbage}); metered {
			t.Errorf("%s: garbage was metered (%d)", coding, tokens)
		}
		// A valid body with its trailer or check bytes damaged.
		damaged := slices.Clone(body)
		damaged[len(damaged)-2] ^= 0xff
		tokens, metered := meterUsage(h, [][]byte{damaged})
		if coding != "deflate-raw" && coding != "br" && coding != "zstd" && metered {
			// gzip (CRC-32) and zlib (Adler-32) check their data; raw
			// deflate has no check, brotli none, and a zstd frame's checksum
			// is optional (off here).
			t.Errorf("%s: a body with a damaged trailer was metered (%d)", coding, tokens)
		}
		// Every single damaged byte: never a panic.
		for i := range body {
			d := slices.Clone(body)
			d[i] ^= byte(1 + r.IntN(255))
			meterUsage(h, [][]byte{d[:i+1], d[i+1:]})
		}
	}
}

func TestOversizeEventIsSkippedAndLeavesTheResponseUnmeteredIfItAloneCarriedUsage(t *testing.T) {
	big := `data: {"pad":"` + strings.Repeat("a", maxUsageEvent) + `","usage":{"total_tokens":5}}` + "\n\n"
	small := "data: {\"usage\":{\"total_tokens\":7}}\n\n"
	for _, c := range usageChunkings() {
		if c.name == "1-byte" {
			continue // a megabyte one byte at a time is slow under -race, and 7 max covers it
		}
		if tokens, metered := meterUsage(usageHeader("text/event-stream", ""), c.split([]byte(big))); metered {
			t.Errorf("%s: an oversize event was metered (%d)", c.name, tokens)
		}
		if tokens, metered := meterUsage(usageHeader("text/event-stream", ""), c.split([]byte(big+small))); tokens != 7 || !metered {
			t.Errorf("%s: the event after an oversize one: got (%d, %v), want (7, true)", c.name, tokens, metered)
		}
	}
	// The meter holds no more than the maximum for it.
	m := newUsageMeter(usageHeader("text/event-stream", ""))
	m.Write([]byte(big[:len(big)-2]))
	if n := cap(m.sse.data) + cap(m.sse.line); n > 2*maxUsageEvent {
		t.Errorf("the meter holds %d bytes for an event of %d", n, len(big))
	}
	m.Finish()
}

// usageHeapDuring reports the bytes allocated while f ran.
func usageHeapDuring(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestUsageTenMegabyteJSONBodyIsMeteredInBoundedMemory(t *testing.T) {
	for _, shape := range []string{"content", "embeddings"} {
		raw := usageBigJSON(shape, 10<<20)
		codings := []string{"identity", "gzip", "zstd", "br"}
		if shape == "embeddings" {
			codings = codings[:2] // random floats are slow to compress under -race
		}
		for _, coding := range codings {
			body := usageEncode(t, coding, raw)
			h := usageHeader("application/json", usageEncodingHeader(coding))
			var tokens int64
			var metered bool
			allocated := usageHeapDuring(func() {
				m := newUsageMeter(h)
				for b := body; len(b) > 0; {
					n := min(32<<10, len(b))
					m.Write(b[:n])
					b = b[n:]
				}
				tokens, metered = m.Finish()
			})
			if tokens != 42 || !metered {
				t.Errorf("%s %s: got (%d, %v), want (42, true)", shape, coding, tokens, metered)
			}
			// Decoders have their own state (brotli's window is up to 16
			// MiB); the meter itself must not hold the body.
			limit := uint64(1 << 20)
			if coding != "identity" {
				limit = 20 << 20
			}
			t.Logf("%s %s: %d bytes (%d compressed) metered with %d bytes allocated", shape, coding, len(raw), len(body), allocated)
			if allocated > limit {
				t.Errorf("%s %s: %d bytes allocated to meter a %d-byte body", shape, coding, allocated, len(raw))
			}
		}
	}
}

// usageBigJSON is a JSON body of about size bytes with its usage at the end:
// a chat completion with one long content string, or an embeddings list.
func usageBigJSON(shape string, size int) []byte {
	var b bytes.Buffer
	switch shape {
	case "content":
		b.WriteString(`{"id":"chatcmpl-big","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`)
		line := `Line with \"quotes\", a \\ backslash, usage: {\"total_tokens\": 1}, and \u00e9.\n`
		b.Write(bytes.Repeat([]byte(line), size/len(line)+1))
		b.WriteString(`"},"finish_reason":"stop"}],`)
	default:
		b.WriteString(`{"object":"list","data":[`)
		r := rand.New(rand.NewPCG(1, 2))
		for i := 0; b.Len() < size; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"object":"embedding","index":%d,"embedding":[`, i)
			var num []byte
			for j := range 256 {
				if j > 0 {
					b.WriteByte(',')
				}
				num = strconv.AppendFloat(num[:0], r.Float64()*2-1, 'f', 9, 64)
				b.Write(num)
			}
			b.WriteString("]}")
		}
		b.WriteString(`],"model":"text-embedding-3-large",`)
	}
	b.WriteString(`"usage":{"prompt_tokens":42,"total_tokens":42}}`)
	return b.Bytes()
}

func TestUsageNoGoroutineOutlivesFinish(t *testing.T) {
	raw := readUsageGolden(t, "openai_chat_stream.sse")
	waitFor := func(want int) int {
		var n int
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if n = runtime.NumGoroutine(); n <= want {
				break
			}
		}
		return n
	}
	time.Sleep(50 * time.Millisecond) // let goroutines of earlier tests end
	base := runtime.NumGoroutine()
	var meters []*usageMeter
	for _, coding := range usageEncodings[1:] {
		body := usageEncode(t, coding, raw)
		h := usageHeader("text/event-stream", usageEncodingHeader(coding))
		for _, part := range [][]byte{nil, body[:len(body)/2], body, append(slices.Clone(body), "garbage"...)} {
			m := newUsageMeter(h)
			m.Write(part)
			meters = append(meters, m)
		}
	}
	if n := runtime.NumGoroutine(); n <= base {
		t.Logf("no goroutine while decoding (%d before, %d now)", base, n)
	}
	for _, m := range meters {
		m.Finish()
	}
	if n := waitFor(base); n > base {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("%d goroutines after Finish, %d before:\n%s", n, base, buf)
	}
}

func TestUsageFinishIsIdempotentAndWritesAfterItAreIgnored(t *testing.T) {
	for _, coding := range []string{"identity", "gzip"} {
		body := usageEncode(t, coding, []byte(`{"usage":{"total_tokens":5}}`))
		m := newUsageMeter(usageHeader("application/json", usageEncodingHeader(coding)))
		m.Write(body)
		a, am := m.Finish()
		if n, err := m.Write(body); n != len(body) || err != nil {
			t.Fatalf("Write after Finish = %d, %v", n, err)
		}
		b, bm := m.Finish()
		if a != 5 || !am || a != b || am != bm {
			t.Fatalf("%s: Finish = (%d, %v) then (%d, %v), want (5, true) twice", coding, a, am, b, bm)
		}
	}
}

func TestEventsWithoutUsageCostNoAllocation(t *testing.T) {
	stream := readUsageGolden(t, "openai_chat_stream.sse")
	noUsage := stream[:bytes.Index(stream, []byte(`data: {"id":"chatcmpl-B1xK9qW2eR3tY4uI5oP6aS7dF8","object":"chat.completion.chunk","created":1739812400,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0aa8d3e20b","choices":[],`))]
	withUsage := stream[len(noUsage):]
	m := newUsageMeter(usageHeader("text/event-stream", ""))
	m.Write(stream) // grows the scratch buffers once
	if a := testing.AllocsPerRun(100, func() { m.Write(noUsage) }); a != 0 {
		t.Errorf("events without usage: %v allocations per Write, want 0", a)
	}
	if a := testing.AllocsPerRun(100, func() { m.Write(withUsage) }); a != 0 {
		t.Errorf("events with usage: %v allocations per Write, want 0", a)
	}
	// Cut lines and events: still none once the buffers have grown.
	if a := testing.AllocsPerRun(100, func() {
		for b := noUsage; len(b) > 0; {
			n := min(37, len(b))
			m.Write(b[:n])
			b = b[n:]
		}
	}); a != 0 {
		t.Errorf("events cut across Writes: %v allocations, want 0", a)
	}
	if tokens, metered := m.Finish(); tokens != 31 || !metered {
		t.Errorf("got (%d, %v), want (31, true)", tokens, metered)
	}
	j := newUsageMeter(usageHeader("application/json", ""))
	body := readUsageGolden(t, "openai_chat.json")
	if a := testing.AllocsPerRun(100, func() { j.json.reset(); j.Write(body) }); a != 0 {
		t.Errorf("a JSON body: %v allocations per Write, want 0", a)
	}
	chunk := []byte(`{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`)
	if a := testing.AllocsPerRun(100, func() { isUsageOnlyChunk(chunk) }); a != 0 {
		t.Errorf("isUsageOnlyChunk: %v allocations, want 0", a)
	}
}

func TestOnlyEventsThatMayCarryUsageAreScanned(t *testing.T) {
	cases := []struct {
		data string
		want bool
	}{
		{`{"usage":{"total_tokens":1}}`, true},
		{`{"usageMetadata":{"totalTokenCount":1}}`, true},
		{`{"a":1,"usage" :` + "\n" + ` {}}`, true},
		{`{"x":{"usage":5}}`, true}, // the scan decides
		{`"usage":`, true},
		{`{"usage":null}`, false},
		{`{"usage": null,"usageMetadata" :null}`, false},
		{`{"usage":null,"message":{"usage":{"input_tokens":1}}}`, true},
		{`{"text":"the usage of \"usage\" is text"}`, false},
		{`{"usages":{}}`, false},
		{`{"my_usage":{}}`, false},
		{`usage`, false},
		{`"usage`, false},
		{`"usage"`, false},
		{`"usage" `, false},
		{``, false},
		{`ggggg`, false},
	}
	for _, c := range cases {
		if got := mayCarryUsage([]byte(c.data)); got != c.want {
			t.Errorf("mayCarryUsage(%s) = %v, want %v", c.data, got, c.want)
		}
	}
}

func TestUsageDecompressionBombIsCutOffAtTheDecodedCap(t *testing.T) {
	if testing.Short() {
		t.Skip("decodes more than 256 MiB")
	}
	// A zstd body whose usage comes after more than maxDecodedBody bytes:
	// the meter stops decoding at the cap (so that no Write decodes more
	// than that) and the response is unmetered.
	var out bytes.Buffer
	w, err := zstd.NewWriter(&out, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithWindowSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(`{"usage":{"prompt_tokens":3},"pad":"`))
	pad := bytes.Repeat([]byte("a"), 1<<20)
	for range maxDecodedBody>>20 + 1 {
		w.Write(pad)
	}
	w.Write([]byte(`","usage":{"total_tokens":5}}`))
	w.Close()
	m := newUsageMeter(usageHeader("application/json", "zstd"))
	var slowest time.Duration
	for b := out.Bytes(); len(b) > 0; {
		n := min(32<<10, len(b))
		start := time.Now()
		m.Write(b[:n])
		slowest = max(slowest, time.Since(start))
		b = b[n:]
	}
	tokens, metered := m.Finish()
	t.Logf("%d compressed bytes; slowest Write %v", out.Len(), slowest)
	// What came before the cap was read.
	if tokens != 3 || !metered {
		t.Fatalf("got (%d, %v), want (3, true): the usage past the cap must not be read", tokens, metered)
	}
	if m.decoded > maxDecodedBody+usageDecodeBuffer {
		t.Fatalf("decoded %d bytes, cap %d", m.decoded, maxDecodedBody)
	}
}

func TestIsUsageOnlyChunkRecognizesTheIncludeUsageChunkOnly(t *testing.T) {
	cases := []struct {
		data string
		want bool
	}{
		{`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, true},
		{` { "choices" : [ ] , "usage" : { } } `, true},
		{"{\"usage\":{\"total_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":0}},\n\"choices\":[\r\n]}", true},
		{`{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}`, false},
		{`{"choices":[],"usage":null}`, false},
		{`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"total_tokens":3}}`, false},
		{`{"choices":[],"x":{"usage":{"total_tokens":3}}}`, false},
		{`{"x":{"choices":[]},"usage":{"total_tokens":3}}`, false},
		{`{"choices":[],"usage":{"total_tokens":3}`, false}, // unclosed
		{`{"choices":[],"usage":{"total_tokens":3}} x`, false},
		{`{"choices":[],"usage":{"total_tokens":3]}`, false},
		{`{"choices":[],"usage":"{\"total_tokens\":3}"}`, false},
		{`{"choices":"[]","usage":{}}`, false},
		{`[{"choices":[],"usage":{}}]`, false},
		{`[DONE]`, false},
		{``, false},
		{`{"choices":[],"usage":{"a":"\"}"}}`, true},
		{`{"choices":[],"usage":{"a":"\\"}}`, true},
		{`{"choices":[],"usage":{"a":"\\\"}}`, false},
	}
	for _, c := range cases {
		if got := isUsageOnlyChunk([]byte(c.data)); got != c.want {
			t.Errorf("isUsageOnlyChunk(%s) = %v, want %v", c.data, got, c.want)
		}
	}
	// The golden stream has exactly one, its usage chunk.
	var found []string
	s := newSSEScanner(maxUsageEvent, func(ev sseEvent) {
		if isUsageOnlyChunk(ev.Data) {
			found = append(found, string(ev.Data))
		}
	})
	s.Write(readUsageGolden(t, "openai_chat_stream.sse"))
	s.Flush()
	if len(found) != 1 || !strings.Contains(found[0], `"total_tokens":31`) {
		t.Fatalf("usage-only chunks in the golden stream: %q", found)
	}
}

// sseCollect runs a scanner over chunks and returns what it reported, one
// string per event: "name|data", or "name|OVERSIZE".
func sseCollect(max int, chunks [][]byte) []string {
	var got []string
	for _, ev := range sseCollectEvents(max, chunks) {
		got = append(got, ev.name+"|"+ev.data)
	}
	return got
}

// sseCollected is an sseEvent copied out of its callback.
type sseCollected struct {
	name, data string // data is "OVERSIZE" for an oversize event
	start, end int64
}

func sseCollectEvents(max int, chunks [][]byte) []sseCollected {
	var got []sseCollected
	s := newSSEScanner(max, func(ev sseEvent) {
		c := sseCollected{name: string(ev.Name), data: string(ev.Data), start: ev.Start, end: ev.End}
		if ev.Oversize {
			c.data = "OVERSIZE"
		}
		got = append(got, c)
	})
	var buf []byte
	for _, c := range chunks {
		buf = append(buf[:0], c...)
		s.Write(buf)
		for i := range buf {
			buf[i] = 'X'
		}
	}
	s.Flush()
	return got
}

func TestUsageSSEScannerFramesEventsAsTheSpecSaysWhateverTheChunking(t *testing.T) {
	cases := []struct {
		name   string
		stream string
		want   []string
	}{
		{"LF", "data: a\n\ndata: b\n\n", []string{"|a", "|b"}},
		{"CRLF", "data: a\r\n\r\ndata: b\r\n\r\n", []string{"|a", "|b"}},
		{"CR", "data: a\r\rdata: b\r\r", []string{"|a", "|b"}},
		{"mixed", "data: a\r\n\ndata: b\n\r\ndata: c\r\r\n", []string{"|a", "|b", "|c"}},
		{"multi-line data", "data: a\ndata:b\ndata:  c\n\n", []string{"|a\nb\n c"}},
		{"empty data lines", "data\ndata:\n\n", []string{"|\n"}},
		{"event names", "event: message_start\ndata: {}\n\nevent:ping\nevent: last\ndata: x\n\n", []string{"message_start|{}", "last|x"}},
		{"comments and other fields", ": hi\nid: 1\nretry: 10\ndata: a\n: mid\nfoo: bar\n\n", []string{"|a"}},
		{"no data, no event", "event: x\n\n: comment\n\n\n\nid: 3\n\n", nil},
		{"colon in value", "data: {\"a\":\"b:c\"}\n\n", []string{`|{"a":"b:c"}`}},
		{"BOM", "\xef\xbb\xbfdata: a\n\n", []string{"|a"}},
		{"BOM only at the start", "data: a\n\n\xef\xbb\xbfdata: b\n\n", []string{"|a"}},
		{"unterminated event at the end", "data: a\n\ndata: b\n", []string{"|a", "|b"}},
		{"unterminated line at the end", "data: a\n\ndata: b", []string{"|a", "|b"}},
		{"field name is case-sensitive", "Data: a\n\n", nil},
	}
	for _, c := range cases {
		for _, ch := range usageChunkings() {
			got := sseCollect(maxUsageEvent, ch.split([]byte(c.stream)))
			if !slices.Equal(got, c.want) {
				t.Errorf("%s (%s): got %q, want %q", c.name, ch.name, got, c.want)
			}
		}
	}
}

func TestUsageSSEScannerReportsOversizeEventsOnceAndKeepsGoing(t *testing.T) {
	const max = 64
	long := strings.Repeat("x", max)
	stream := "data: a\n\n" +
		"event: big\ndata: " + long + "\n\n" + // over by one line
		"data: " + long[:30] + "\ndata: " + long[:30] + "\n\n" + // over by the sum of its lines
		"data: " + long[:max-7] + "\n\n" + // exactly max with its line end
		"data: b\n\n"
	want := []string{"|a", "big|OVERSIZE", "|OVERSIZE", "|" + long[:max-7], "|b"}
	for _, ch := range usageChunkings() {
		got := sseCollect(max, ch.split([]byte(stream)))
		if !slices.Equal(got, want) {
			t.Errorf("%s: got %q, want %q", ch.name, got, want)
		}
	}
}

func TestUsageSSEScannerDoesNotRetainWrites(t *testing.T) {
	// sseCollect overwrites each chunk after its Write: the events must not
	// show it, however the lines were cut.
	stream := readUsageGolden(t, "anthropic_messages_stream.sse")
	want := sseCollect(maxUsageEvent, [][]byte{stream})
	if len(want) != 8 {
		t.Fatalf("%d events in the golden Anthropic stream, want 8", len(want))
	}
	for _, ch := range usageChunkings() {
		if got := sseCollect(maxUsageEvent, ch.split(stream)); !slices.Equal(got, want) {
			t.Errorf("%s: got %q, want %q", ch.name, got, want)
		}
	}
}

func TestUsageSSEScannerTellsWhereEachEventIsInTheStream(t *testing.T) {
	streams := map[string][]byte{
		"mixed line ends": []byte(": hi\n\ndata: a\r\n\r\n\r\nevent: x\rdata: b\r\rid: 1\n\ndata: c\r\n\r\ndata: d"),
	}
	for _, g := range usageGoldens {
		if strings.HasSuffix(g.file, ".sse") {
			streams[g.file] = readUsageGolden(t, g.file)
		}
	}
	for name, stream := range streams {
		want := sseCollectEvents(maxUsageEvent, [][]byte{stream})
		if len(want) == 0 {
			t.Fatalf("%s: no events", name)
		}
		var prevEnd int64
		for _, ev := range want {
			if ev.start < prevEnd || ev.end <= ev.start || ev.end > int64(len(stream)) {
				t.Fatalf("%s: event at [%d, %d) after one ending at %d in %d bytes", name, ev.start, ev.end, prevEnd, len(stream))
			}
			// Outside events there is no event.
			if got := sseCollectEvents(maxUsageEvent, [][]byte{stream[prevEnd:ev.start]}); len(got) != 0 {
				t.Errorf("%s: an event between %d and %d: %+v", name, prevEnd, ev.start, got)
			}
			// An event's bytes alone are that event.
			got := sseCollectEvents(maxUsageEvent, [][]byte{stream[ev.start:ev.end]})
			if len(got) != 1 || got[0].name != ev.name || got[0].data != ev.data {
				t.Errorf("%s: stream[%d:%d] = %q scans as %+v, want %+v", name, ev.start, ev.end, stream[ev.start:ev.end], got, ev)
			}
			prevEnd = ev.end
		}
		for _, ch := range usageChunkings() {
			if got := sseCollectEvents(maxUsageEvent, ch.split(stream)); !slices.Equal(got, want) {
				t.Errorf("%s (%s): got %+v, want %+v", name, ch.name, got, want)
			}
		}
	}
}

func TestUsageSSEScannerLetsAFilterDropTheUsageOnlyChunk(t *testing.T) {
	// What the colleague stripping an injected usage chunk does: hold back
	// the event in progress, and pass on every event but the usage-only one.
	stream := readUsageGolden(t, "openai_chat_stream.sse")
	for _, ch := range usageChunkings() {
		var out, held []byte
		var heldFrom, passed int64 // held holds stream[heldFrom:], out has stream[:passed] minus drops
		s := newSSEScanner(maxUsageEvent, func(ev sseEvent) {
			// Pass on what lies before the event, then the event unless dropped.
			out = append(out, held[passed-heldFrom:ev.Start-heldFrom]...)
			if !isUsageOnlyChunk(ev.Data) {
				out = append(out, held[ev.Start-heldFrom:ev.End-heldFrom]...)
			}
			passed = ev.End
		})
		for _, c := range ch.split(stream) {
			held = append(held, c...)
			s.Write(c)
			held = held[passed-heldFrom:] // forget what was passed on or dropped
			heldFrom = passed
		}
		s.Flush()
		out = append(out, held[passed-heldFrom:]...)
		want := bytes.Replace(stream, stream[bytes.Index(stream, []byte(`data: {"id":"chatcmpl-B1xK9qW2eR3tY4uI5oP6aS7dF8","object":"chat.completion.chunk","created":1739812400,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0aa8d3e20b","choices":[]`)):bytes.Index(stream, []byte("data: [DONE]"))], nil, 1)
		if !bytes.Equal(out, want) {
			t.Fatalf("%s: filtered stream:\n%s\nwant:\n%s", ch.name, out, want)
		}
	}
}

// FuzzUsageMeter feeds arbitrary bodies, as JSON or SSE, in any of the
// codings, split at arbitrary points: the meter must not panic, must charge
// the same whatever the split, and must stay within its memory bounds.
func FuzzUsageMeter(f *testing.F) {
	entries, err := os.ReadDir(filepath.Join("testdata", "usage"))
	if err != nil {
		f.Fatal(err)
	}
	for i, e := range entries {
		raw := readUsageGolden(f, e.Name())
		sse := strings.HasSuffix(e.Name(), ".sse")
		for c, coding := range usageEncodings {
			f.Add(sse, uint8(c), usageEncode(f, coding, raw), uint64(i*31+c))
		}
		f.Add(!sse, uint8(0), raw, uint64(i))
	}
	f.Add(true, uint8(0), []byte("data: {\"usage\":{\"total_tokens\":5}}\r\rdata: x\r"), uint64(3))
	f.Add(false, uint8(0), []byte(`[{"usage":{"total_tokens":5}},{"message":{"usage":{"input_tokens":1e400}}}]`), uint64(5))
	f.Fuzz(func(t *testing.T, sse bool, coding uint8, body []byte, seed uint64) {
		ct := "application/json"
		if sse {
			ct = "text/event-stream"
		}
		h := usageHeader(ct, usageEncodingHeader(usageEncodings[int(coding)%len(usageEncodings)]))
		whole, wholeMetered := meterUsage(h, [][]byte{body})
		r := rand.New(rand.NewPCG(seed, seed>>32))
		var chunks [][]byte
		for b := body; len(b) > 0; {
			n := min(1+r.IntN(1+int(seed%64)), len(b))
			chunks = append(chunks, b[:n])
			b = b[n:]
		}
		m := newUsageMeter(h)
		for _, c := range chunks {
			m.Write(c)
			if m.sse != nil && (cap(m.sse.data) > 2*maxUsageEvent || cap(m.sse.line) > 2*maxUsageEvent) {
				t.Fatalf("SSE buffers grew to %d and %d", cap(m.sse.data), cap(m.sse.line))
			}
		}
		split, splitMetered := m.Finish()
		if m.panicked != nil {
			t.Fatalf("the meter recovered from a panic: %v", m.panicked)
		}
		if whole != split || wholeMetered != splitMetered {
			t.Fatalf("whole body: (%d, %v); split in %d: (%d, %v)", whole, wholeMetered, len(chunks), split, splitMetered)
		}
		if whole < 0 || (!wholeMetered && whole != 0) {
			t.Fatalf("got (%d, %v)", whole, wholeMetered)
		}
		if isUsageOnlyChunk(body) && !bytes.Contains(body, []byte(`"usage"`)) {
			t.Fatal("a usage-only chunk without usage")
		}
	})
}

// FuzzSSEScanner checks that the events do not depend on how the stream is
// split into Writes.
func FuzzUsageSSEScanner(f *testing.F) {
	for _, name := range []string{"openai_chat_stream.sse", "anthropic_messages_stream.sse", "gemini_stream.sse", "openai_responses_stream.sse"} {
		f.Add(readUsageGolden(f, name), uint64(len(name)))
	}
	f.Add([]byte("data: a\r\n\r\ndata:b\rdata\n\n\xef\xbb\xbf: c\r\r"), uint64(9))
	f.Fuzz(func(t *testing.T, stream []byte, seed uint64) {
		const max = 128
		want := sseCollectEvents(max, [][]byte{stream})
		r := rand.New(rand.NewPCG(seed, 1))
		var chunks [][]byte
		for b := stream; len(b) > 0; {
			n := min(1+r.IntN(16), len(b))
			chunks = append(chunks, b[:n])
			b = b[n:]
		}
		if got := sseCollectEvents(max, chunks); !slices.Equal(got, want) {
			t.Fatalf("split in %d: %+v, whole: %+v", len(chunks), got, want)
		}
		var prevEnd int64
		for _, ev := range want {
			if len(ev.data) > max {
				t.Fatalf("an event of %d bytes passed the maximum of %d", len(ev.data), max)
			}
			if ev.start < prevEnd || ev.end <= ev.start || ev.end > int64(len(stream)) {
				t.Fatalf("event at [%d, %d) after one ending at %d in %d bytes", ev.start, ev.end, prevEnd, len(stream))
			}
			prevEnd = ev.end
		}
	})
}
