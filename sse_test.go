package ratelimit

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

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
