package ratelimit

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rtapFrame is one WebSocket frame, encoded by bytes.
type rtapFrame struct {
	op      byte
	fin     bool
	rsv     byte    // 0x40 (RSV1), 0x20 (RSV2), 0x10 (RSV3)
	mask    []byte  // a 4-byte key, or nil
	lenForm int     // 0: the minimal length encoding; 16 or 64 forces one
	length  *uint64 // overrides the length field (corrupt frames)
	payload []byte
}

const (
	rtapCont   = 0
	rtapText   = 1
	rtapBinary = 2
	rtapClose  = 8
	rtapPing   = 9
	rtapPong   = 10
)

func (f rtapFrame) bytes() []byte {
	b0 := f.op | f.rsv
	if f.fin {
		b0 |= 0x80
	}
	var maskBit byte
	if f.mask != nil {
		maskBit = 0x80
	}
	n := uint64(len(f.payload))
	if f.length != nil {
		n = *f.length
	}
	out := []byte{b0}
	switch {
	case f.lenForm == 64 || (f.lenForm == 0 && n > 65535):
		out = append(out, maskBit|127)
		out = binary.BigEndian.AppendUint64(out, n)
	case f.lenForm == 16 || (f.lenForm == 0 && n > 125):
		out = append(out, maskBit|126)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
	default:
		out = append(out, maskBit|byte(n))
	}
	out = append(out, f.mask...)
	start := len(out)
	out = append(out, f.payload...)
	if f.mask != nil {
		for i := range out[start:] {
			out[start+i] ^= f.mask[i%4]
		}
	}
	return out
}

// rtapMsg is a whole (unfragmented) text message.
func rtapMsg(s string) []byte { return rtapFrame{op: rtapText, fin: true, payload: []byte(s)}.bytes() }

func rtapStream(frames ...[]byte) []byte { return bytes.Join(frames, nil) }

// rtapDone is a response.done event reporting total tokens; with size > 0 it
// is padded to exactly size bytes.
func rtapDone(total int, size int) string {
	head := `{"type":"response.done","event_id":"event_1","response":{"object":"realtime.response","id":"resp_1","status":"completed","output":[],` +
		fmt.Sprintf(`"usage":{"total_tokens":%d,"input_tokens":1,"output_tokens":2,"input_token_details":{"cached_tokens":0}}},"pad":"`, total)
	if size <= 0 {
		return head + `"}`
	}
	if size < len(head)+2 {
		head = fmt.Sprintf(`{"type":"response.done","response":{"usage":{"total_tokens":%d}},"pad":"`, total)
	}
	pad := size - len(head) - 2
	if pad < 0 {
		panic("rtapDone: size too small")
	}
	return head + strings.Repeat("x", pad) + `"}`
}

const rtapAudioDelta = `{"type":"response.output_audio.delta","event_id":"event_2","response_id":"resp_1","item_id":"item_1","output_index":0,"content_index":0,"delta":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}`

// rtapFeed writes chunks to a new tap and returns it.
func rtapFeed(maxMessage int, chunks ...[]byte) *realtimeTap {
	t := newRealtimeTap(maxMessage)
	for _, c := range chunks {
		if n, err := t.Write(c); n != len(c) || err != nil {
			panic(fmt.Sprintf("Write = %d, %v; want %d, nil", n, err, len(c)))
		}
	}
	return t
}

// rtapBytewise is stream cut into one-byte chunks.
func rtapBytewise(stream []byte) [][]byte {
	out := make([][]byte, len(stream))
	for i := range stream {
		out[i] = stream[i : i+1]
	}
	return out
}

func rtapCheck(t *testing.T, tap *realtimeTap, wantTokens, wantUnmetered int64) {
	t.Helper()
	tap.mu.Lock()
	fault := tap.fault
	tap.mu.Unlock()
	if fault {
		t.Fatal("the tap recovered from a panic")
	}
	if got := tap.take(); got != wantTokens {
		t.Errorf("tokens = %d, want %d", got, wantTokens)
	}
	if got := tap.unmetered(); got != wantUnmetered {
		t.Errorf("unmetered = %d, want %d", got, wantUnmetered)
	}
}

func TestRealtimeTapSumsEveryResponseDoneAndTakeResets(t *testing.T) {
	tap := newRealtimeTap(maxUsageEvent)
	var want int64
	for i := 1; i <= 50; i++ {
		tap.Write(rtapMsg(rtapAudioDelta))
		tap.Write(rtapMsg(rtapDone(i, 0)))
		want += int64(i)
	}
	rtapCheck(t, tap, want, 0)
	if got := tap.take(); got != 0 {
		t.Fatalf("second take = %d, want 0", got)
	}
	tap.Write(rtapMsg(rtapDone(7, 0)))
	rtapCheck(t, tap, 7, 0)
}

func TestRealtimeTapCountsOnlyResponseDoneUsageTotal(t *testing.T) {
	for _, c := range []struct {
		name string
		msg  string
		want int64
	}{
		{"response.done", rtapDone(42, 0), 42},
		{"type not first, whitespace", `{ "response" : { "usage" : { "total_tokens" : 9 } } , "type" : "response.done" }`, 9},
		{"other event with usage", `{"type":"response.created","response":{"usage":{"total_tokens":5}}}`, 0},
		{"transcript quoting the type", `{"type":"response.output_text.delta","delta":"\"response.done\" {\"usage\":{\"total_tokens\":5}}"}`, 0},
		{"type only in a nested object", `{"type":"conversation.item.created","item":{"type":"response.done","response":{"usage":{"total_tokens":5}}}}`, 0},
		{"usage null", `{"type":"response.done","response":{"usage":null}}`, 0},
		{"no usage (cancelled)", `{"type":"response.done","response":{"status":"cancelled"}}`, 0},
		{"total_tokens not a number", `{"type":"response.done","response":{"usage":{"total_tokens":"5"}}}`, 0},
		{"negative total", `{"type":"response.done","response":{"usage":{"total_tokens":-5}}}`, 0},
		{"huge total is capped", `{"type":"response.done","response":{"usage":{"total_tokens":99999999999999999999999}}}`, maxUsageValue},
		{"invalid JSON", `{"type":"response.done","response":{"usage":{"total_tokens":5}}`, 0},
		{"not JSON", `"response.done"`, 0},
		{"empty", ``, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			rtapCheck(t, rtapFeed(maxUsageEvent, rtapMsg(c.msg)), c.want, 0)
		})
	}
}

// Every frame header form, masked and not, with the stream cut into two
// Writes at every position, into three at every pair of positions up to 16
// bytes apart (so every header is also cut twice), and one byte per Write.
func TestRealtimeTapParsesFrameHeadersSplitAtEveryByte(t *testing.T) {
	key := []byte{0xa1, 0x5b, 0x00, 0xff}
	done := []byte(`{"type":"response.done","response":{"usage":{"total_tokens":3}}}`)
	half := len(done) / 2
	stream := rtapStream(
		rtapFrame{op: rtapText, fin: true, payload: done}.bytes(),                         // 7-bit length
		rtapFrame{op: rtapText, fin: true, lenForm: 16, payload: done}.bytes(),            // 16-bit
		rtapFrame{op: rtapText, fin: true, lenForm: 64, payload: done}.bytes(),            // 64-bit
		rtapFrame{op: rtapText, fin: true, mask: key, payload: done}.bytes(),              // masked
		rtapFrame{op: rtapText, fin: true, mask: key, lenForm: 64, payload: done}.bytes(), // masked 64-bit
		rtapFrame{op: rtapPing, fin: true}.bytes(),                                        // empty control frame
		rtapFrame{op: rtapText, payload: done[:half]}.bytes(),
		rtapFrame{op: rtapPong, fin: true, mask: key, payload: []byte("p")}.bytes(),
		rtapFrame{op: rtapCont, fin: true, lenForm: 16, mask: key, payload: done[half:]}.bytes(),
		rtapFrame{op: rtapText, fin: true}.bytes(), // empty text message
	)
	const want = 6 * 3
	rtapCheck(t, rtapFeed(maxUsageEvent, stream), want, 0)
	rtapCheck(t, rtapFeed(maxUsageEvent, rtapBytewise(stream)...), want, 0)
	for i := 0; i <= len(stream); i++ {
		for j := i; j <= min(i+16, len(stream)); j++ { // two cuts within one header (14 bytes at most) too
			tap := rtapFeed(maxUsageEvent, stream[:i], stream[i:j], stream[j:])
			if got, un := tap.take(), tap.unmetered(); got != want || un != 0 || tap.fault {
				t.Fatalf("cut at %d and %d: tokens %d, unmetered %d, fault %v; want %d, 0, false", i, j, got, un, tap.fault, want)
			}
		}
	}
}

func TestRealtimeTapReadsEveryPayloadLengthForm(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{200, 125, 126, 127, 65535, 65536, 70000, 300000} {
		for _, masked := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d bytes masked %v", size, masked), func(t *testing.T) {
				f := rtapFrame{op: rtapText, fin: true, payload: []byte(rtapDone(size, size))}
				if masked {
					f.mask = []byte{1, 2, 3, 4}
				}
				frame := f.bytes()
				stream := rtapStream(frame, rtapMsg(rtapDone(1, 0)))
				rtapCheck(t, rtapFeed(maxUsageEvent, stream), int64(size)+1, 0)
				rtapCheck(t, rtapFeed(maxUsageEvent, rtapBytewise(stream)...), int64(size)+1, 0)
				var chunks [][]byte
				for rest := stream; len(rest) > 0; {
					n := min(len(rest), 1+rng.IntN(3000))
					chunks, rest = append(chunks, rest[:n]), rest[n:]
				}
				rtapCheck(t, rtapFeed(maxUsageEvent, chunks...), int64(size)+1, 0)
			})
		}
	}
}

func TestRealtimeTapCountsResponseDoneAcrossFragmentsAndInterleavedPings(t *testing.T) {
	done := []byte(rtapDone(11, 3000))
	var frames [][]byte
	for i, rest := 0, done; len(rest) > 0; i++ {
		n := min(len(rest), 1+i*97)
		op := byte(rtapCont)
		if i == 0 {
			op = rtapText
		}
		frames = append(frames, rtapFrame{op: op, fin: n == len(rest), payload: rest[:n]}.bytes())
		rest = rest[n:]
		// Control frames may come between the fragments of a message.
		switch i % 4 {
		case 0:
			frames = append(frames, rtapFrame{op: rtapPing, fin: true, payload: []byte("ping")}.bytes())
		case 1:
			frames = append(frames, rtapFrame{op: rtapPong, fin: true}.bytes())
		case 2:
			frames = append(frames, []byte{0x88, 0x02, 0x03, 0xe9}) // reverse_proxy's 1001 close frame
		}
	}
	frames = append(frames, rtapFrame{op: rtapText, fin: false}.bytes(), // empty fragments are fine too
		rtapFrame{op: rtapCont, fin: false, payload: []byte(rtapDone(4, 0))}.bytes(),
		rtapFrame{op: rtapCont, fin: true}.bytes())
	stream := rtapStream(frames...)
	rtapCheck(t, rtapFeed(maxUsageEvent, stream), 15, 0)
	rtapCheck(t, rtapFeed(maxUsageEvent, rtapBytewise(stream)...), 15, 0)
	rtapCheck(t, rtapFeed(maxUsageEvent, frames...), 15, 0)
}

func TestRealtimeTapIgnoresBinaryMessages(t *testing.T) {
	done := []byte(rtapDone(5, 0))
	stream := rtapStream(
		rtapFrame{op: rtapBinary, fin: true, payload: done}.bytes(),
		rtapFrame{op: rtapBinary, payload: done[:10]}.bytes(),
		rtapFrame{op: rtapPing, fin: true}.bytes(),
		rtapFrame{op: rtapCont, fin: true, payload: done[10:]}.bytes(),
		rtapFrame{op: rtapBinary, fin: true, payload: make([]byte, 2*maxUsageEvent)}.bytes(), // over the cap: binary, not counted
		rtapFrame{op: rtapBinary, fin: true, rsv: 0x40, payload: done}.bytes(),               // compressed binary: not counted
		rtapMsg(rtapDone(6, 0)),
	)
	rtapCheck(t, rtapFeed(maxUsageEvent, stream), 6, 0)
}

func TestRealtimeTapUnmasksMaskedFrames(t *testing.T) {
	done := []byte(rtapDone(8, 0))
	for _, key := range [][]byte{{0, 0, 0, 0}, {0xff, 0xff, 0xff, 0xff}, {0x12, 0x34, 0x56, 0x78}} {
		stream := rtapStream(
			rtapFrame{op: rtapText, fin: true, mask: key, payload: done}.bytes(),
			rtapFrame{op: rtapText, mask: key, payload: done[:7]}.bytes(), // fragments restart the key
			rtapFrame{op: rtapPing, fin: true, mask: key, payload: []byte("abc")}.bytes(),
			rtapFrame{op: rtapCont, fin: true, mask: []byte{9, 8, 7, 6}, payload: done[7:]}.bytes(),
		)
		rtapCheck(t, rtapFeed(maxUsageEvent, rtapBytewise(stream)...), 16, 0)
	}
}

func TestRealtimeTapSkipsAMessageOverTheCapAsUnmeteredAndMetersTheNext(t *testing.T) {
	const limit = 1000
	atCap := rtapDone(1, limit)
	over := rtapDone(100, limit+1)
	overFragments := []byte(rtapDone(200, 3*limit))
	stream := rtapStream(
		rtapMsg(atCap), // exactly the cap: metered
		rtapMsg(over),  // one byte over: skipped
		rtapMsg(rtapDone(2, 0)),
		// Over the cap only at its third fragment, with a ping in between.
		rtapFrame{op: rtapText, payload: overFragments[:limit/2]}.bytes(),
		rtapFrame{op: rtapCont, payload: overFragments[limit/2 : limit-10]}.bytes(),
		rtapFrame{op: rtapPing, fin: true}.bytes(),
		rtapFrame{op: rtapCont, payload: overFragments[limit-10 : 2*limit]}.bytes(),
		rtapFrame{op: rtapCont, fin: true, payload: overFragments[2*limit:]}.bytes(),
		rtapMsg(rtapDone(4, 0)),
	)
	for _, chunks := range [][][]byte{{stream}, rtapBytewise(stream)} {
		tap := rtapFeed(limit, chunks...)
		if cap(tap.buf) > limit {
			t.Errorf("message buffer grew to %d bytes, over the cap of %d", cap(tap.buf), limit)
		}
		rtapCheck(t, tap, 1+2+4, 2)
	}
}

func TestRealtimeTapCountsCompressedMessagesUnmetered(t *testing.T) {
	done := []byte(rtapDone(5, 0))
	stream := rtapStream(
		rtapFrame{op: rtapText, fin: true, rsv: 0x40, payload: done}.bytes(),
		rtapFrame{op: rtapText, rsv: 0x40, payload: done[:5]}.bytes(), // RSV1 is on the first fragment only
		rtapFrame{op: rtapCont, fin: true, payload: done[5:]}.bytes(),
		rtapMsg(rtapDone(3, 0)),
	)
	rtapCheck(t, rtapFeed(maxUsageEvent, stream), 3, 2)
}

// Framing that RFC 6455 tells a client to fail the connection for stops the
// parse for good: it is one unmetered count, and nothing after it is read.
func TestRealtimeTapStopsAtCorruptFramingAndCountsItOnce(t *testing.T) {
	topBit := uint64(1) << 63
	tooLong := uint64(200)
	for _, c := range []struct {
		name    string
		corrupt []byte
	}{
		{"64-bit length with the top bit", rtapFrame{op: rtapText, fin: true, lenForm: 64, length: &topBit}.bytes()},
		{"64-bit length all ones", []byte{0x81, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{"RSV2", rtapFrame{op: rtapText, fin: true, rsv: 0x20, payload: []byte("{}")}.bytes()},
		{"RSV3", rtapFrame{op: rtapText, fin: true, rsv: 0x10, payload: []byte("{}")}.bytes()},
		{"reserved data opcode", rtapFrame{op: 3, fin: true}.bytes()},
		{"reserved control opcode", rtapFrame{op: 0xb, fin: true}.bytes()},
		{"fragmented ping", rtapFrame{op: rtapPing, fin: false}.bytes()},
		{"ping over 125 bytes", rtapFrame{op: rtapPing, fin: true, lenForm: 16, length: &tooLong}.bytes()},
		{"compressed close", rtapFrame{op: rtapClose, fin: true, rsv: 0x40}.bytes()},
		{"continuation of nothing", rtapFrame{op: rtapCont, fin: true, payload: []byte("{}")}.bytes()},
		{"text inside a text message", rtapStream(rtapFrame{op: rtapText, payload: []byte("{")}.bytes(), rtapMsg("{}"))},
		{"RSV1 on a continuation", rtapStream(rtapFrame{op: rtapText, payload: []byte("{")}.bytes(), rtapFrame{op: rtapCont, fin: true, rsv: 0x40, payload: []byte("}")}.bytes())},
		{"an HTTP response", []byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")},
	} {
		t.Run(c.name, func(t *testing.T) {
			stream := rtapStream(rtapMsg(rtapDone(5, 0)), c.corrupt, rtapMsg(rtapDone(100, 0)), rtapMsg(rtapDone(100, 0)))
			rtapCheck(t, rtapFeed(maxUsageEvent, stream), 5, 1)
			tap := rtapFeed(maxUsageEvent, rtapBytewise(stream)...)
			rtapCheck(t, tap, 5, 1)
			if tap.buf != nil {
				t.Errorf("a dead tap keeps a %d-byte buffer", cap(tap.buf))
			}
			tap.Write(rtapMsg(rtapDone(100, 0)))
			rtapCheck(t, tap, 0, 1)
		})
	}
}

func TestRealtimeTapDoesNotRetainWrittenBytes(t *testing.T) {
	done := []byte(rtapDone(21, 0))
	stream := rtapStream(rtapFrame{op: rtapText, payload: done[:30]}.bytes(), rtapFrame{op: rtapCont, fin: true, payload: done[30:]}.bytes())
	tap := newRealtimeTap(maxUsageEvent)
	for i := 0; i < len(stream); i += 13 {
		chunk := bytes.Clone(stream[i:min(i+13, len(stream))])
		tap.Write(chunk)
		for j := range chunk {
			chunk[j] = 0xff // a caller reusing its buffer
		}
	}
	rtapCheck(t, tap, 21, 0)
}

func TestRealtimeTapMessagesWithoutUsageCostNoAllocation(t *testing.T) {
	stream := rtapStream(
		rtapMsg(rtapAudioDelta),
		rtapFrame{op: rtapText, payload: []byte(rtapAudioDelta[:40])}.bytes(),
		rtapFrame{op: rtapPing, fin: true, payload: []byte("x")}.bytes(),
		rtapFrame{op: rtapCont, fin: true, mask: []byte{1, 2, 3, 4}, payload: []byte(rtapAudioDelta[40:])}.bytes(),
		rtapFrame{op: rtapBinary, fin: true, payload: make([]byte, 5000)}.bytes(),
		rtapMsg(`{"type":"response.created","response":{"id":"resp_1"}}`),
		rtapMsg(strings.Repeat(" ", 30000)),
	)
	tap := newRealtimeTap(maxUsageEvent)
	tap.Write(stream) // the message buffer grows once
	allocs := testing.AllocsPerRun(100, func() {
		tap.Write(stream[:len(stream)/3])
		tap.Write(stream[len(stream)/3:])
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per stream without usage, want 0", allocs)
	}
	rtapCheck(t, tap, 0, 0)
}

func TestRealtimeTapKeepsItsMessageBufferBounded(t *testing.T) {
	tap := newRealtimeTap(maxUsageEvent)
	tap.Write(rtapMsg(rtapDone(1, 2000)))
	if c := cap(tap.buf); c < 2000 || c > realtimeRetainedBuffer {
		t.Errorf("after a 2000-byte message the buffer holds %d bytes; want it kept for the next", c)
	}
	tap.Write(rtapMsg(rtapDone(1, maxUsageEvent)))
	if tap.buf != nil {
		t.Errorf("a %d-byte buffer is kept after a message over %d bytes", cap(tap.buf), realtimeRetainedBuffer)
	}
	big := rtapMsg(rtapDone(1, maxUsageEvent))
	tap.Write(big[:len(big)-1])
	if cap(tap.buf) > maxUsageEvent {
		t.Errorf("buffer %d bytes, over the cap of %d", cap(tap.buf), maxUsageEvent)
	}
	tap.Write(big[len(big)-1:])
	rtapCheck(t, tap, 3, 0)
}

// Two writers calling Write at once, each call carrying whole frames, as
// reverse_proxy's graceful close does (one 4-byte close frame, in one Write)
// while its copier writes. A writer that interleaves partial frames with
// another's cannot be parsed, by this tap or by the client.
func TestRealtimeTapSerializesConcurrentWritersOfWholeFrames(t *testing.T) {
	t.Run("whole messages from both", func(t *testing.T) {
		tap := newRealtimeTap(maxUsageEvent)
		var total atomic.Int64
		var wg sync.WaitGroup
		for w := range 2 {
			wg.Go(func() {
				for i := range 500 {
					if i%3 == 0 { // several frames in one Write
						tap.Write(rtapStream(rtapMsg(rtapDone(w+1, 0)), rtapMsg(rtapAudioDelta), rtapMsg(rtapDone(w+1, 0))))
					} else {
						tap.Write(rtapMsg(rtapDone(w+1, 0)))
					}
					if i%50 == 0 {
						total.Add(tap.take()) // a flush, racing with the writers
					}
				}
			})
		}
		wg.Wait()
		total.Add(tap.take())
		// Each writer: 167 Writes of two events and 333 of one.
		if total.Load() != 667*1+667*2 || tap.unmetered() != 0 || tap.fault {
			t.Fatalf("tokens %d, unmetered %d, fault %v; want %d, 0, false", total.Load(), tap.unmetered(), tap.fault, 667*3)
		}
	})
	t.Run("fragments and control frames", func(t *testing.T) {
		tap := newRealtimeTap(maxUsageEvent)
		var total int64
		var mu sync.Mutex
		take := func() { mu.Lock(); total += tap.take(); mu.Unlock() }
		done := []byte(rtapDone(2, 500))
		var wg sync.WaitGroup
		wg.Go(func() { // the copier, one frame per Write
			for range 300 {
				for i := 0; i < len(done); i += 100 {
					op := byte(rtapCont)
					if i == 0 {
						op = rtapText
					}
					tap.Write(rtapFrame{op: op, fin: i+100 >= len(done), payload: done[i:min(i+100, len(done))]}.bytes())
				}
			}
		})
		wg.Go(func() { // the graceful close, and pings
			for i := range 300 {
				if i%2 == 0 {
					tap.Write([]byte{0x88, 0x02, 0x03, 0xe9})
				} else {
					tap.Write(rtapFrame{op: rtapPing, fin: true, payload: []byte("keepalive")}.bytes())
				}
				if i%30 == 0 {
					take()
				}
			}
		})
		wg.Wait()
		take()
		if total != 600 || tap.unmetered() != 0 || tap.fault {
			t.Fatalf("tokens %d, unmetered %d, fault %v; want 600, 0, false", total, tap.unmetered(), tap.fault)
		}
	})
}

func FuzzRealtimeTap(f *testing.F) {
	done := []byte(rtapDone(7, 0))
	f.Add(rtapMsg(rtapDone(7, 0)), []byte{0})
	f.Add(rtapStream(
		rtapFrame{op: rtapText, mask: []byte{1, 2, 3, 4}, payload: done[:20]}.bytes(),
		rtapFrame{op: rtapPing, fin: true, payload: []byte("x")}.bytes(),
		rtapFrame{op: rtapCont, fin: true, lenForm: 64, payload: done[20:]}.bytes(),
		rtapFrame{op: rtapBinary, fin: true, lenForm: 16, payload: done}.bytes(),
		rtapFrame{op: rtapText, fin: true, rsv: 0x40, payload: done}.bytes(),
		[]byte{0x88, 0x02, 0x03, 0xe9},
	), []byte{3, 1, 200, 7})
	f.Add(rtapMsg(rtapDone(9, 400)), []byte{50, 0, 1})
	f.Add(rtapStream(rtapMsg(rtapAudioDelta), []byte{0x81, 0x7f, 0x80}), []byte{1})
	f.Fuzz(func(t *testing.T, stream []byte, cuts []byte) {
		const limit = 256 // small, so that the over-the-cap path is taken
		whole := rtapFeed(limit, stream)
		var chunks [][]byte
		for rest, i := stream, 0; len(rest) > 0; i++ {
			n := len(rest)
			if len(cuts) > 0 {
				n = min(n, 1+int(cuts[i%len(cuts)]))
			}
			chunks, rest = append(chunks, rest[:n]), rest[n:]
		}
		cut := rtapFeed(limit, chunks...)
		for _, tap := range []*realtimeTap{whole, cut} {
			if tap.fault {
				t.Fatal("the tap recovered from a panic")
			}
			if cap(tap.buf) > limit {
				t.Fatalf("message buffer of %d bytes, over the cap of %d", cap(tap.buf), limit)
			}
		}
		if a, b := whole.take(), cut.take(); a != b {
			t.Fatalf("tokens %d whole, %d when cut", a, b)
		}
		if a, b := whole.unmetered(), cut.unmetered(); a != b {
			t.Fatalf("unmetered %d whole, %d when cut", a, b)
		}
	})
}

// rtapTCPPair is a connected loopback TCP pair: server is the side a server
// would hijack.
func rtapTCPPair(t *testing.T) (server, client *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { s.Close(); c.Close() })
	return s.(*net.TCPConn), c.(*net.TCPConn)
}

// rtapSession is a stream of server frames with the tokens it reports.
func rtapSession() ([]byte, int64) {
	done := []byte(rtapDone(13, 2000))
	return rtapStream(
		rtapMsg(rtapAudioDelta),
		rtapMsg(rtapDone(30, 70000)),
		rtapFrame{op: rtapText, payload: done[:1000]}.bytes(),
		[]byte{0x89, 0x00},
		rtapFrame{op: rtapCont, fin: true, payload: done[1000:]}.bytes(),
		rtapFrame{op: rtapBinary, fin: true, payload: []byte{0, 1, 2}}.bytes(),
	), 30 + 13
}

// onlyReader hides a reader's WriterTo, as reverse_proxy's upstream body does
// not offer one: io.CopyBuffer then writes buffer by buffer.
type onlyReader struct{ io.Reader }

func TestWrapHijackedTCPDeliversBytesIdenticallyTapsThemAndHalfCloses(t *testing.T) {
	server, client := rtapTCPPair(t)
	stream, want := rtapSession()
	tap := newRealtimeTap(maxUsageEvent)
	conn, _ := wrapHijacked(server, bufio.NewReadWriter(bufio.NewReader(server), bufio.NewWriter(server)), tap)

	if _, ok := conn.(io.ReaderFrom); ok {
		t.Error("the wrapped conn has ReadFrom, which would let io.Copy bypass the tap")
	}
	received := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(client) // to EOF: the wrapped CloseWrite must reach the socket
		received <- b
	}()
	// reverse_proxy's copier: io.CopyBuffer(conn, backConn, buf), buffers
	// that cut frames anywhere.
	if _, err := io.CopyBuffer(conn, onlyReader{bytes.NewReader(stream)}, make([]byte, 777)); err != nil {
		t.Fatal(err)
	}
	cw, ok := conn.(interface{ CloseWrite() error })
	if !ok {
		t.Fatal("the wrapped *net.TCPConn has no CloseWrite: reverse_proxy would end the tunnel instead of half-closing")
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-received:
		if !bytes.Equal(got, stream) {
			t.Fatalf("the client received %d bytes that differ from the %d sent", len(got), len(stream))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client never saw EOF after CloseWrite")
	}
	rtapCheck(t, tap, want, 0)

	// Only the write half is closed: the client can still send.
	if _, err := client.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "bye" {
		t.Fatalf("read after CloseWrite: %q, %v", buf, err)
	}
	cr, ok := conn.(interface{ CloseRead() error })
	if !ok {
		t.Fatal("the wrapped *net.TCPConn has no CloseRead")
	}
	if err := cr.CloseRead(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Read(buf); n != 0 || err == nil {
		t.Fatalf("read after CloseRead = %d, %v; want 0 and an error", n, err)
	}
}

func TestWrapHijackedBufferedWriterIsTappedAndReaderKeepsClientBytes(t *testing.T) {
	server, client := rtapTCPPair(t)
	if _, err := client.Write([]byte("early client bytes")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(server)
	if _, err := br.Peek(len("early client bytes")); err != nil {
		t.Fatal(err)
	}
	brw := bufio.NewReadWriter(br, bufio.NewWriter(server))
	tap := newRealtimeTap(maxUsageEvent)
	conn, wbrw := wrapHijacked(server, brw, tap)
	if wbrw.Reader != br || wbrw.Reader.Buffered() != len("early client bytes") {
		t.Fatal("the client bytes buffered before the hijack are not in the returned Reader")
	}
	stream, want := rtapSession()
	received := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(client)
		received <- b
	}()
	if _, err := wbrw.Write(stream[:100]); err != nil {
		t.Fatal(err)
	}
	if err := wbrw.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(stream[100:5000]); err != nil { // both paths, in order
		t.Fatal(err)
	}
	if _, err := wbrw.Write(stream[5000:]); err != nil {
		t.Fatal(err)
	}
	if err := wbrw.Flush(); err != nil {
		t.Fatal(err)
	}
	conn.(interface{ CloseWrite() error }).CloseWrite()
	if got := <-received; !bytes.Equal(got, stream) {
		t.Fatalf("the client received %d bytes that differ from the %d sent", len(got), len(stream))
	}
	rtapCheck(t, tap, want, 0)
	if b, _ := wbrw.ReadString('s'); b != "early client bytes" {
		t.Fatalf("Reader gave %q", b)
	}
}

// Bytes a bufio.Writer still held at the hijack (net/http never leaves any)
// go out first and are not fed to the tap, which would read them as frames.
func TestWrapHijackedFlushesBytesBufferedBeforeTheHijackUntapped(t *testing.T) {
	server, client := rtapTCPPair(t)
	brw := bufio.NewReadWriter(bufio.NewReader(server), bufio.NewWriter(server))
	header := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
	brw.WriteString(header)
	tap := newRealtimeTap(maxUsageEvent)
	conn, wbrw := wrapHijacked(server, brw, tap)
	stream, want := rtapSession()
	received := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(client)
		received <- b
	}()
	wbrw.Write(stream)
	wbrw.Flush()
	conn.(interface{ CloseWrite() error }).CloseWrite()
	if got := <-received; string(got) != header+string(stream) {
		t.Fatalf("the client received %d bytes, want the header and the stream (%d)", len(got), len(header)+len(stream))
	}
	rtapCheck(t, tap, want, 0)
}

// rtapCloseWriteConn and rtapCloseReadConn stand for conns with one half-close.
type rtapCloseWriteConn struct {
	net.Conn
	closedWrite bool
}

func (c *rtapCloseWriteConn) CloseWrite() error { c.closedWrite = true; return nil }

type rtapCloseReadConn struct {
	net.Conn
	closedRead bool
}

func (c *rtapCloseReadConn) CloseRead() error { c.closedRead = true; return nil }

func TestWrapHijackedOffersOnlyTheHalfClosesTheConnHas(t *testing.T) {
	p, peer := net.Pipe()
	defer p.Close()
	defer peer.Close()
	tap := newRealtimeTap(maxUsageEvent)
	type cw = interface{ CloseWrite() error }
	type cr = interface{ CloseRead() error }

	plain, _ := wrapHijacked(p, nil, tap) // net.Pipe, or Caddy's access-log hijackedConn: neither
	if _, ok := plain.(cw); ok {
		t.Error("CloseWrite offered over a conn without it")
	}
	if _, ok := plain.(cr); ok {
		t.Error("CloseRead offered over a conn without it")
	}

	w := &rtapCloseWriteConn{Conn: p} // like *tls.Conn
	wc, _ := wrapHijacked(w, nil, tap)
	if _, ok := wc.(cr); ok {
		t.Error("CloseRead offered over a conn without it")
	}
	if c, ok := wc.(cw); !ok {
		t.Error("CloseWrite not offered")
	} else if c.CloseWrite(); !w.closedWrite {
		t.Error("CloseWrite did not reach the conn")
	}

	r := &rtapCloseReadConn{Conn: p}
	rc, _ := wrapHijacked(r, nil, tap)
	if _, ok := rc.(cw); ok {
		t.Error("CloseWrite offered over a conn without it")
	}
	if c, ok := rc.(cr); !ok {
		t.Error("CloseRead not offered")
	} else if c.CloseRead(); !r.closedRead {
		t.Error("CloseRead did not reach the conn")
	}

	// Over net.Pipe the bytes and the tap are the same as over TCP.
	stream, want := rtapSession()
	received := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(peer)
		received <- b
	}()
	conn, brw := wrapHijacked(p, nil, tap)
	brw.Write(stream[:10])
	brw.Flush()
	conn.Write(stream[10:])
	conn.Close()
	if got := <-received; !bytes.Equal(got, stream) {
		t.Fatal("bytes differ over net.Pipe")
	}
	rtapCheck(t, tap, want, 0)
	if conn.LocalAddr() != p.LocalAddr() || conn.RemoteAddr() != p.RemoteAddr() {
		t.Error("addresses are not the conn's")
	}
}

// rtapShortConn accepts only part of one Write, with an error.
type rtapShortConn struct {
	net.Conn
	out       bytes.Buffer
	shortOnce int // accept only this many bytes of the next Write
}

func (c *rtapShortConn) Write(p []byte) (int, error) {
	if c.shortOnce > 0 {
		n := c.shortOnce
		c.shortOnce = 0
		c.out.Write(p[:n])
		return n, errors.New("timeout")
	}
	return c.out.Write(p)
}

func TestWrapHijackedTapsOnlyTheBytesWritten(t *testing.T) {
	stream := rtapStream(rtapMsg(rtapDone(5, 0)), rtapMsg(rtapDone(6, 0)))
	sc := &rtapShortConn{shortOnce: 17}
	tap := newRealtimeTap(maxUsageEvent)
	conn, _ := wrapHijacked(sc, nil, tap)
	n, err := conn.Write(stream)
	if n != 17 || err == nil {
		t.Fatalf("Write = %d, %v; want the conn's 17 and its error", n, err)
	}
	if _, err := conn.Write(stream[n:]); err != nil { // the caller retries the rest
		t.Fatal(err)
	}
	if !bytes.Equal(sc.out.Bytes(), stream) {
		t.Fatal("bytes differ")
	}
	rtapCheck(t, tap, 11, 0)
}

// Writers sharing the wrapped conn, each Write carrying whole frames: the
// tap reads the bytes in the order the client receives them.
func TestWrapHijackedConcurrentWritersAreTappedInWireOrder(t *testing.T) {
	server, client := rtapTCPPair(t)
	tap := newRealtimeTap(maxUsageEvent)
	conn, _ := wrapHijacked(server, nil, tap)
	received := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(client)
		received <- b
	}()
	done := []byte(rtapDone(1, 300))
	var wg sync.WaitGroup
	wg.Go(func() { // the copier: a fragmented message per three Writes
		for range 400 {
			conn.Write(rtapFrame{op: rtapText, payload: done[:100]}.bytes())
			conn.Write(rtapFrame{op: rtapCont, payload: done[100:200]}.bytes())
			conn.Write(rtapFrame{op: rtapCont, fin: true, payload: done[200:]}.bytes())
		}
	})
	wg.Go(func() { // writeCloseControl and pings
		for range 400 {
			conn.Write([]byte{0x88, 0x02, 0x03, 0xe9})
		}
	})
	wg.Wait()
	conn.(interface{ CloseWrite() error }).CloseWrite()
	got := <-received
	rtapCheck(t, tap, 400, 0)
	// The client's bytes, parsed alone, say the same.
	rtapCheck(t, rtapFeed(maxUsageEvent, got), 400, 0)
}

// Through net/http's own Hijack, as reverse_proxy does it: the 101 goes out
// inside Hijack, before the wrap, so the tap reads frames from the first byte.
func TestWrapHijackedOverNetHTTPHijackTapsOnlyTheFramesAfterThe101(t *testing.T) {
	stream, want := rtapSession()
	tap := newRealtimeTap(maxUsageEvent)
	fromClient := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Upgrade", "websocket")
		w.Header().Set("Connection", "Upgrade")
		w.WriteHeader(http.StatusSwitchingProtocols)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn, brw = wrapHijacked(conn, brw, tap)
		defer conn.Close()
		if err := brw.Flush(); err != nil {
			t.Error(err)
			return
		}
		b := make([]byte, len("client frame"))
		io.ReadFull(brw, b) // buffered by net/http, or still on the wire
		fromClient <- string(b)
		io.CopyBuffer(conn, onlyReader{bytes.NewReader(stream)}, make([]byte, 4096))
		conn.(interface{ CloseWrite() error }).CloseWrite()
	}))
	defer srv.Close()

	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\nclient frame"))
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d", res.StatusCode)
	}
	got, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, stream) {
		t.Fatalf("the client received %d bytes that differ from the %d sent", len(got), len(stream))
	}
	if s := <-fromClient; s != "client frame" {
		t.Fatalf("the server read %q from the client", s)
	}
	rtapCheck(t, tap, want, 0)
}

// rtapStallConn records the bytes written in wire order and, at its stallAt-th
// Write, returns only when released: the writer is held between its write
// and its tap, as a preempted goroutine would be.
type rtapStallConn struct {
	net.Conn
	mu       sync.Mutex
	wire     bytes.Buffer
	calls    int
	stallAt  int
	stalled  chan struct{}
	released chan struct{}
}

func (c *rtapStallConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.wire.Write(p)
	c.calls++
	stall := c.calls == c.stallAt
	c.mu.Unlock()
	if stall {
		close(c.stalled)
		<-c.released
	}
	return len(p), nil
}

// The copier's Writes cut frames anywhere. When its Write ends at a frame
// boundary and the graceful close's frame goes out right after, the client's
// stream is valid; the tap must then not read the close frame before the
// copier's bytes that preceded it on the wire.
func TestWrapHijackedTapsEachWriteBeforeAnotherWriterCanWrite(t *testing.T) {
	done := rtapMsg(rtapDone(9, 0))
	sc := &rtapStallConn{stallAt: 2, stalled: make(chan struct{}), released: make(chan struct{})}
	tap := newRealtimeTap(maxUsageEvent)
	conn, _ := wrapHijacked(sc, nil, tap)
	copier := make(chan struct{})
	go func() {
		defer close(copier)
		conn.Write(done[:20]) // half a frame
		conn.Write(done[20:]) // its end: stalls after the write, before the tap
	}()
	<-sc.stalled
	closer := make(chan struct{})
	go func() {
		defer close(closer)
		conn.Write([]byte{0x88, 0x02, 0x03, 0xe9})
	}()
	select {
	case <-closer: // not serialized: the close frame was tapped first
	case <-time.After(50 * time.Millisecond):
	}
	close(sc.released)
	<-copier
	<-closer
	if !bytes.Equal(sc.wire.Bytes(), rtapStream(done, []byte{0x88, 0x02, 0x03, 0xe9})) {
		t.Fatalf("wire order: % x", sc.wire.Bytes())
	}
	rtapCheck(t, tap, 9, 0)
}
