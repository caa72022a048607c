package usage

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// sseCollect runs a scanner over chunks and returns what it reported, one
// string per event: "name|data", or "name|OVERSIZE".
func sseCollect(max int, chunks [][]byte) []string {
	var got []string
	for _, ev := range sseCollectEvents(max, chunks) {
		got = append(got, ev.name+"|"+ev.data)
	}
	return got
}

// sseCollected is an SSEEvent copied out of its callback.
type sseCollected struct {
	name, data string // data is "OVERSIZE" for an oversize event
	start, end int64
}

func sseCollectEvents(max int, chunks [][]byte) []sseCollected {
	var got []sseCollected
	s := NewSSEScanner(max, func(ev SSEEvent) {
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
		for _, ch := range usagetest.Chunkings() {
			got := sseCollect(MaxEvent, ch.Split([]byte(c.stream)))
			if !slices.Equal(got, c.want) {
				t.Errorf("%s (%s): got %q, want %q", c.name, ch.Name, got, c.want)
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
	for _, ch := range usagetest.Chunkings() {
		got := sseCollect(max, ch.Split([]byte(stream)))
		if !slices.Equal(got, want) {
			t.Errorf("%s: got %q, want %q", ch.Name, got, want)
		}
	}
}

func TestUsageSSEScannerDoesNotRetainWrites(t *testing.T) {
	// sseCollect overwrites each chunk after its Write: the events must not
	// show it, however the lines were cut.
	stream := usagetest.Read(t, "anthropic_messages_stream.sse")
	want := sseCollect(MaxEvent, [][]byte{stream})
	if len(want) != 8 {
		t.Fatalf("%d events in the golden Anthropic stream, want 8", len(want))
	}
	for _, ch := range usagetest.Chunkings() {
		if got := sseCollect(MaxEvent, ch.Split(stream)); !slices.Equal(got, want) {
			t.Errorf("%s: got %q, want %q", ch.Name, got, want)
		}
	}
}

func TestUsageSSEScannerTellsWhereEachEventIsInTheStream(t *testing.T) {
	streams := map[string][]byte{
		"mixed line ends": []byte(": hi\n\ndata: a\r\n\r\n\r\nevent: x\rdata: b\r\rid: 1\n\ndata: c\r\n\r\ndata: d"),
	}
	for _, g := range usagetest.Goldens {
		if strings.HasSuffix(g.File, ".sse") {
			streams[g.File] = usagetest.Read(t, g.File)
		}
	}
	for name, stream := range streams {
		want := sseCollectEvents(MaxEvent, [][]byte{stream})
		if len(want) == 0 {
			t.Fatalf("%s: no events", name)
		}
		var prevEnd int64
		for _, ev := range want {
			if ev.start < prevEnd || ev.end <= ev.start || ev.end > int64(len(stream)) {
				t.Fatalf("%s: event at [%d, %d) after one ending at %d in %d bytes", name, ev.start, ev.end, prevEnd, len(stream))
			}
			// Outside events there is no event.
			if got := sseCollectEvents(MaxEvent, [][]byte{stream[prevEnd:ev.start]}); len(got) != 0 {
				t.Errorf("%s: an event between %d and %d: %+v", name, prevEnd, ev.start, got)
			}
			// An event's bytes alone are that event.
			got := sseCollectEvents(MaxEvent, [][]byte{stream[ev.start:ev.end]})
			if len(got) != 1 || got[0].name != ev.name || got[0].data != ev.data {
				t.Errorf("%s: stream[%d:%d] = %q scans as %+v, want %+v", name, ev.start, ev.end, stream[ev.start:ev.end], got, ev)
			}
			prevEnd = ev.end
		}
		for _, ch := range usagetest.Chunkings() {
			if got := sseCollectEvents(MaxEvent, ch.Split(stream)); !slices.Equal(got, want) {
				t.Errorf("%s (%s): got %+v, want %+v", name, ch.Name, got, want)
			}
		}
	}
}

func TestUsageSSEScannerLetsAFilterDropTheUsageOnlyChunk(t *testing.T) {
	// What a filter stripping an injected usage chunk does: hold back
	// the event in progress, and pass on every event but the usage-only one.
	stream := usagetest.Read(t, "openai_chat_stream.sse")
	for _, ch := range usagetest.Chunkings() {
		var out, held []byte
		var heldFrom, passed int64 // held holds stream[heldFrom:], out has stream[:passed] minus drops
		s := NewSSEScanner(MaxEvent, func(ev SSEEvent) {
			// Pass on what lies before the event, then the event unless dropped.
			out = append(out, held[passed-heldFrom:ev.Start-heldFrom]...)
			if !IsUsageOnlyChunk(ev.Data) {
				out = append(out, held[ev.Start-heldFrom:ev.End-heldFrom]...)
			}
			passed = ev.End
		})
		for _, c := range ch.Split(stream) {
			held = append(held, c...)
			s.Write(c)
			held = held[passed-heldFrom:] // forget what was passed on or dropped
			heldFrom = passed
		}
		s.Flush()
		out = append(out, held[passed-heldFrom:]...)
		want := bytes.Replace(stream, stream[bytes.Index(stream, []byte(`data: {"id":"chatcmpl-B1xK9qW2eR3tY4uI5oP6aS7dF8","object":"chat.completion.chunk","created":1739812400,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_0aa8d3e20b","choices":[]`)):bytes.Index(stream, []byte("data: [DONE]"))], nil, 1)
		if !bytes.Equal(out, want) {
			t.Fatalf("%s: filtered stream:\n%s\nwant:\n%s", ch.Name, out, want)
		}
	}
}

// FuzzSSEScanner checks that the events do not depend on how the stream is
// split into Writes.
func FuzzUsageSSEScanner(f *testing.F) {
	for _, name := range []string{"openai_chat_stream.sse", "anthropic_messages_stream.sse", "gemini_stream.sse", "openai_responses_stream.sse"} {
		f.Add(usagetest.Read(f, name), uint64(len(name)))
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
