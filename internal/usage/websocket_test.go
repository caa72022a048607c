package usage

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// noCeiling counts every response as it reports.
var noCeiling = Usage{Total: math.MaxInt64, Input: math.MaxInt64, Output: math.MaxInt64}

// feedTap writes chunks to a new tap and returns it.
func feedTap(maxMessage int, chunks ...[]byte) *RealtimeTap {
	t := NewRealtimeTap(maxMessage, noCeiling)
	usagetest.Feed(t, chunks...)
	return t
}

// doneUsage is what usagetest.Done events of these totals add up to: each
// has 1 input token (none of it cached) and 2 output tokens.
func doneUsage(totals ...int64) Usage {
	var u Usage
	for _, n := range totals {
		u = u.plus(Usage{Total: n, Input: 1, Output: 2, UncachedInput: 1})
	}
	return u
}

func TestRealtimeTapSumsEveryResponseDoneAndTakeResets(t *testing.T) {
	tap := NewRealtimeTap(MaxEvent, noCeiling)
	var want Usage
	for i := 1; i <= 50; i++ {
		tap.Write(usagetest.Text(usagetest.AudioDelta))
		tap.Write(usagetest.Text(usagetest.Done(i, 0)))
		want = want.plus(doneUsage(int64(i)))
	}
	usagetest.CheckTap(t, tap, want, 0)
	if got := tap.Take(); got != (Usage{}) {
		t.Fatalf("second take = %+v, want zero", got)
	}
	tap.Write(usagetest.Text(usagetest.Done(7, 0)))
	usagetest.CheckTap(t, tap, doneUsage(7), 0)
}

// One absurd report counts at the ceiling, count by count, and is counted as
// clamped; the responses around it count as they report.
func TestRealtimeTapCountsEachResponseAtMostItsCeiling(t *testing.T) {
	tap := NewRealtimeTap(MaxEvent, Usage{Total: 1000, Input: 600, Output: 500})
	tap.Write(usagetest.Text(usagetest.Done(10, 0)))
	tap.Write(usagetest.Text(`{"type":"response.done","response":{"usage":{"total_tokens":1e20,"input_tokens":5,"output_tokens":1e20}}}`))
	tap.Write(usagetest.Text(usagetest.Done(20, 0)))
	want := doneUsage(10, 20).plus(Usage{Total: 1000, Input: 5, Output: 500, UncachedInput: 5})
	if got := tap.Take(); got != want {
		t.Fatalf("took %+v, want %+v", got, want)
	}
	if tap.Clamped() != 1 {
		t.Fatalf("clamped %d responses, want 1", tap.Clamped())
	}
}

func TestRealtimeTapTakesTheTotalInputAndOutputTokensOfResponseDone(t *testing.T) {
	done := func(usage string) []byte {
		return usagetest.Text(`{"type":"response.done","event_id":"event_9","response":{"object":"realtime.response","id":"resp_9","status":"completed",` +
			`"output":[],"usage":` + usage + `}}`)
	}
	tap := NewRealtimeTap(MaxEvent, noCeiling)
	tap.Write(done(`{"total_tokens":1290,"input_tokens":1024,"output_tokens":266,` +
		`"input_token_details":{"text_tokens":224,"audio_tokens":800,"image_tokens":0,"cached_tokens":768,` +
		`"cached_tokens_details":{"text_tokens":128,"audio_tokens":640,"image_tokens":0}},` +
		`"output_token_details":{"text_tokens":66,"audio_tokens":200}}`))
	usagetest.CheckTap(t, tap, Usage{Total: 1290, Input: 1024, Output: 266, UncachedInput: 1024 - 768, CacheRead: 768, AudioInput: 800, AudioOutput: 200}, 0)
	// Responses add up, each count on its own.
	tap.Write(usagetest.Stream(
		done(`{"total_tokens":300,"input_tokens":200,"output_tokens":100}`),
		usagetest.Text(usagetest.AudioDelta),
		done(`{"total_tokens":45,"input_tokens":40,"output_tokens":5}`),
	))
	usagetest.CheckTap(t, tap, Usage{Total: 345, Input: 240, Output: 105, UncachedInput: 200 + 40}, 0)
}

func TestRealtimeTapCountsOnlyResponseDoneUsage(t *testing.T) {
	for _, c := range []struct {
		name string
		msg  string
		want Usage
	}{
		{"response.done", usagetest.Done(42, 0), doneUsage(42)},
		{"type not first, whitespace", `{ "response" : { "usage" : { "output_tokens" : 5 , "total_tokens" : 9 , "input_tokens" : 4 } } , "type" : "response.done" }`, Usage{Total: 9, Input: 4, Output: 5, UncachedInput: 4}},
		{"other event with usage", `{"type":"response.created","response":{"usage":{"total_tokens":5,"input_tokens":5}}}`, Usage{}},
		{"transcript quoting the type", `{"type":"response.output_text.delta","delta":"\"response.done\" {\"usage\":{\"total_tokens\":5}}"}`, Usage{}},
		{"type only in a nested object", `{"type":"conversation.item.created","item":{"type":"response.done","response":{"usage":{"total_tokens":5}}}}`, Usage{}},
		{"usage null", `{"type":"response.done","response":{"usage":null}}`, Usage{}},
		{"no usage (cancelled)", `{"type":"response.done","response":{"status":"cancelled"}}`, Usage{}},
		// Each count is read on its own: one that is not a count adds nothing.
		{"no total", `{"type":"response.done","response":{"usage":{"input_tokens":7,"output_tokens":3}}}`, Usage{Total: 0, Input: 7, Output: 3, UncachedInput: 7}},
		{"total_tokens not a number", `{"type":"response.done","response":{"usage":{"total_tokens":"5","input_tokens":2,"output_tokens":3}}}`, Usage{Total: 0, Input: 2, Output: 3, UncachedInput: 2}},
		{"counts not numbers", `{"type":"response.done","response":{"usage":{"total_tokens":5,"input_tokens":null,"output_tokens":{"text_tokens":3}}}}`, Usage{Total: 5, Input: 0, Output: 0}},
		{"negative counts", `{"type":"response.done","response":{"usage":{"total_tokens":-5,"input_tokens":-1,"output_tokens":3}}}`, Usage{Total: 0, Input: 0, Output: 3}},
		{"huge counts are capped", `{"type":"response.done","response":{"usage":{"total_tokens":99999999999999999999999,"input_tokens":1e30,"output_tokens":12.0}}}`, Usage{Total: maxValue, Input: maxValue, Output: 12, UncachedInput: maxValue}},
		{"invalid JSON", `{"type":"response.done","response":{"usage":{"total_tokens":5}}`, Usage{}},
		{"not JSON", `"response.done"`, Usage{}},
		{"empty", ``, Usage{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			usagetest.CheckTap(t, feedTap(MaxEvent, usagetest.Text(c.msg)), c.want, 0)
		})
	}
}

// Every frame header form, masked and not, with the stream cut into two
// Writes at every position, into three at every pair of positions up to 16
// bytes apart (so every header is also cut twice), and one byte per Write.
func TestRealtimeTapParsesFrameHeadersSplitAtEveryByte(t *testing.T) {
	key := []byte{0xa1, 0x5b, 0x00, 0xff}
	done := []byte(`{"type":"response.done","response":{"usage":{"total_tokens":3,"input_tokens":1,"output_tokens":2}}}`)
	half := len(done) / 2
	stream := usagetest.Stream(
		usagetest.Frame{Op: usagetest.OpText, Fin: true, Payload: done}.Bytes(),                         // 7-bit length
		usagetest.Frame{Op: usagetest.OpText, Fin: true, LenForm: 16, Payload: done}.Bytes(),            // 16-bit
		usagetest.Frame{Op: usagetest.OpText, Fin: true, LenForm: 64, Payload: done}.Bytes(),            // 64-bit
		usagetest.Frame{Op: usagetest.OpText, Fin: true, Mask: key, Payload: done}.Bytes(),              // masked
		usagetest.Frame{Op: usagetest.OpText, Fin: true, Mask: key, LenForm: 64, Payload: done}.Bytes(), // masked 64-bit
		usagetest.Frame{Op: usagetest.OpPing, Fin: true}.Bytes(),                                        // empty control frame
		usagetest.Frame{Op: usagetest.OpText, Payload: done[:half]}.Bytes(),
		usagetest.Frame{Op: usagetest.OpPong, Fin: true, Mask: key, Payload: []byte("p")}.Bytes(),
		usagetest.Frame{Op: usagetest.OpCont, Fin: true, LenForm: 16, Mask: key, Payload: done[half:]}.Bytes(),
		usagetest.Frame{Op: usagetest.OpText, Fin: true}.Bytes(), // empty text message
	)
	want := Usage{Total: 6 * 3, Input: 6 * 1, Output: 6 * 2, UncachedInput: 6 * 1}
	usagetest.CheckTap(t, feedTap(MaxEvent, stream), want, 0)
	usagetest.CheckTap(t, feedTap(MaxEvent, usagetest.Bytewise(stream)...), want, 0)
	for i := 0; i <= len(stream); i++ {
		for j := i; j <= min(i+16, len(stream)); j++ { // two cuts within one header (14 bytes at most) too
			tap := feedTap(MaxEvent, stream[:i], stream[i:j], stream[j:])
			if got, un := tap.Take(), tap.Unmetered(); got != want || un != 0 || tap.fault {
				t.Fatalf("cut at %d and %d: usage %+v, unmetered %d, fault %v; want %+v, 0, false", i, j, got, un, tap.fault, want)
			}
		}
	}
}

func TestRealtimeTapReadsEveryPayloadLengthForm(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{200, 125, 126, 127, 65535, 65536, 70000, 300000} {
		for _, masked := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d bytes masked %v", size, masked), func(t *testing.T) {
				f := usagetest.Frame{Op: usagetest.OpText, Fin: true, Payload: []byte(usagetest.Done(size, size))}
				if masked {
					f.Mask = []byte{1, 2, 3, 4}
				}
				frame := f.Bytes()
				stream := usagetest.Stream(frame, usagetest.Text(usagetest.Done(1, 0)))
				want := doneUsage(int64(size), 1)
				usagetest.CheckTap(t, feedTap(MaxEvent, stream), want, 0)
				usagetest.CheckTap(t, feedTap(MaxEvent, usagetest.Bytewise(stream)...), want, 0)
				var chunks [][]byte
				for rest := stream; len(rest) > 0; {
					n := min(len(rest), 1+rng.IntN(3000))
					chunks, rest = append(chunks, rest[:n]), rest[n:]
				}
				usagetest.CheckTap(t, feedTap(MaxEvent, chunks...), want, 0)
			})
		}
	}
}

func TestRealtimeTapCountsResponseDoneAcrossFragmentsAndInterleavedPings(t *testing.T) {
	done := []byte(usagetest.Done(11, 3000))
	var frames [][]byte
	for i, rest := 0, done; len(rest) > 0; i++ {
		n := min(len(rest), 1+i*97)
		op := byte(usagetest.OpCont)
		if i == 0 {
			op = usagetest.OpText
		}
		frames = append(frames, usagetest.Frame{Op: op, Fin: n == len(rest), Payload: rest[:n]}.Bytes())
		rest = rest[n:]
		// Control frames may come between the fragments of a message.
		switch i % 4 {
		case 0:
			frames = append(frames, usagetest.Frame{Op: usagetest.OpPing, Fin: true, Payload: []byte("ping")}.Bytes())
		case 1:
			frames = append(frames, usagetest.Frame{Op: usagetest.OpPong, Fin: true}.Bytes())
		case 2:
			frames = append(frames, []byte{0x88, 0x02, 0x03, 0xe9}) // reverse_proxy's 1001 close frame
		}
	}
	frames = append(frames, usagetest.Frame{Op: usagetest.OpText, Fin: false}.Bytes(), // empty fragments are fine too
		usagetest.Frame{Op: usagetest.OpCont, Fin: false, Payload: []byte(usagetest.Done(4, 0))}.Bytes(),
		usagetest.Frame{Op: usagetest.OpCont, Fin: true}.Bytes())
	stream := usagetest.Stream(frames...)
	usagetest.CheckTap(t, feedTap(MaxEvent, stream), doneUsage(11, 4), 0)
	usagetest.CheckTap(t, feedTap(MaxEvent, usagetest.Bytewise(stream)...), doneUsage(11, 4), 0)
	usagetest.CheckTap(t, feedTap(MaxEvent, frames...), doneUsage(11, 4), 0)
}

func TestRealtimeTapIgnoresBinaryMessages(t *testing.T) {
	done := []byte(usagetest.Done(5, 0))
	stream := usagetest.Stream(
		usagetest.Frame{Op: usagetest.OpBinary, Fin: true, Payload: done}.Bytes(),
		usagetest.Frame{Op: usagetest.OpBinary, Payload: done[:10]}.Bytes(),
		usagetest.Frame{Op: usagetest.OpPing, Fin: true}.Bytes(),
		usagetest.Frame{Op: usagetest.OpCont, Fin: true, Payload: done[10:]}.Bytes(),
		usagetest.Frame{Op: usagetest.OpBinary, Fin: true, Payload: make([]byte, 2*MaxEvent)}.Bytes(), // over the cap: binary, not counted
		usagetest.Frame{Op: usagetest.OpBinary, Fin: true, RSV: 0x40, Payload: done}.Bytes(),          // compressed binary: not counted
		usagetest.Text(usagetest.Done(6, 0)),
	)
	usagetest.CheckTap(t, feedTap(MaxEvent, stream), doneUsage(6), 0)
}

func TestRealtimeTapUnmasksMaskedFrames(t *testing.T) {
	done := []byte(usagetest.Done(8, 0))
	for _, key := range [][]byte{{0, 0, 0, 0}, {0xff, 0xff, 0xff, 0xff}, {0x12, 0x34, 0x56, 0x78}} {
		stream := usagetest.Stream(
			usagetest.Frame{Op: usagetest.OpText, Fin: true, Mask: key, Payload: done}.Bytes(),
			usagetest.Frame{Op: usagetest.OpText, Mask: key, Payload: done[:7]}.Bytes(), // fragments restart the key
			usagetest.Frame{Op: usagetest.OpPing, Fin: true, Mask: key, Payload: []byte("abc")}.Bytes(),
			usagetest.Frame{Op: usagetest.OpCont, Fin: true, Mask: []byte{9, 8, 7, 6}, Payload: done[7:]}.Bytes(),
		)
		usagetest.CheckTap(t, feedTap(MaxEvent, usagetest.Bytewise(stream)...), doneUsage(8, 8), 0)
	}
}

func TestRealtimeTapSkipsAMessageOverTheCapAsUnmeteredAndMetersTheNext(t *testing.T) {
	const limit = 1000
	atCap := usagetest.Done(1, limit)
	over := usagetest.Done(100, limit+1)
	overFragments := []byte(usagetest.Done(200, 3*limit))
	stream := usagetest.Stream(
		usagetest.Text(atCap), // exactly the cap: metered
		usagetest.Text(over),  // one byte over: skipped
		usagetest.Text(usagetest.Done(2, 0)),
		// Over the cap only at its third fragment, with a ping in between.
		usagetest.Frame{Op: usagetest.OpText, Payload: overFragments[:limit/2]}.Bytes(),
		usagetest.Frame{Op: usagetest.OpCont, Payload: overFragments[limit/2 : limit-10]}.Bytes(),
		usagetest.Frame{Op: usagetest.OpPing, Fin: true}.Bytes(),
		usagetest.Frame{Op: usagetest.OpCont, Payload: overFragments[limit-10 : 2*limit]}.Bytes(),
		usagetest.Frame{Op: usagetest.OpCont, Fin: true, Payload: overFragments[2*limit:]}.Bytes(),
		usagetest.Text(usagetest.Done(4, 0)),
	)
	for _, chunks := range [][][]byte{{stream}, usagetest.Bytewise(stream)} {
		tap := feedTap(limit, chunks...)
		if cap(tap.buf) > limit {
			t.Errorf("message buffer grew to %d bytes, over the cap of %d", cap(tap.buf), limit)
		}
		usagetest.CheckTap(t, tap, doneUsage(1, 2, 4), 2)
	}
}

func TestRealtimeTapCountsCompressedMessagesUnmetered(t *testing.T) {
	done := []byte(usagetest.Done(5, 0))
	stream := usagetest.Stream(
		usagetest.Frame{Op: usagetest.OpText, Fin: true, RSV: 0x40, Payload: done}.Bytes(),
		usagetest.Frame{Op: usagetest.OpText, RSV: 0x40, Payload: done[:5]}.Bytes(), // RSV1 is on the first fragment only
		usagetest.Frame{Op: usagetest.OpCont, Fin: true, Payload: done[5:]}.Bytes(),
		usagetest.Text(usagetest.Done(3, 0)),
	)
	usagetest.CheckTap(t, feedTap(MaxEvent, stream), doneUsage(3), 2)
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
		{"64-bit length with the top bit", usagetest.Frame{Op: usagetest.OpText, Fin: true, LenForm: 64, Length: &topBit}.Bytes()},
		{"64-bit length all ones", []byte{0x81, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{"RSV2", usagetest.Frame{Op: usagetest.OpText, Fin: true, RSV: 0x20, Payload: []byte("{}")}.Bytes()},
		{"RSV3", usagetest.Frame{Op: usagetest.OpText, Fin: true, RSV: 0x10, Payload: []byte("{}")}.Bytes()},
		{"reserved data opcode", usagetest.Frame{Op: 3, Fin: true}.Bytes()},
		{"reserved control opcode", usagetest.Frame{Op: 0xb, Fin: true}.Bytes()},
		{"fragmented ping", usagetest.Frame{Op: usagetest.OpPing, Fin: false}.Bytes()},
		{"ping over 125 bytes", usagetest.Frame{Op: usagetest.OpPing, Fin: true, LenForm: 16, Length: &tooLong}.Bytes()},
		{"compressed close", usagetest.Frame{Op: usagetest.OpClose, Fin: true, RSV: 0x40}.Bytes()},
		{"continuation of nothing", usagetest.Frame{Op: usagetest.OpCont, Fin: true, Payload: []byte("{}")}.Bytes()},
		{"text inside a text message", usagetest.Stream(usagetest.Frame{Op: usagetest.OpText, Payload: []byte("{")}.Bytes(), usagetest.Text("{}"))},
		{"RSV1 on a continuation", usagetest.Stream(usagetest.Frame{Op: usagetest.OpText, Payload: []byte("{")}.Bytes(), usagetest.Frame{Op: usagetest.OpCont, Fin: true, RSV: 0x40, Payload: []byte("}")}.Bytes())},
		{"an HTTP response", []byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")},
	} {
		t.Run(c.name, func(t *testing.T) {
			stream := usagetest.Stream(usagetest.Text(usagetest.Done(5, 0)), c.corrupt, usagetest.Text(usagetest.Done(100, 0)), usagetest.Text(usagetest.Done(100, 0)))
			usagetest.CheckTap(t, feedTap(MaxEvent, stream), doneUsage(5), 1)
			tap := feedTap(MaxEvent, usagetest.Bytewise(stream)...)
			usagetest.CheckTap(t, tap, doneUsage(5), 1)
			if tap.buf != nil {
				t.Errorf("a dead tap keeps a %d-byte buffer", cap(tap.buf))
			}
			tap.Write(usagetest.Text(usagetest.Done(100, 0)))
			usagetest.CheckTap(t, tap, Usage{}, 1)
		})
	}
}

func TestRealtimeTapDoesNotRetainWrittenBytes(t *testing.T) {
	done := []byte(usagetest.Done(21, 0))
	stream := usagetest.Stream(usagetest.Frame{Op: usagetest.OpText, Payload: done[:30]}.Bytes(), usagetest.Frame{Op: usagetest.OpCont, Fin: true, Payload: done[30:]}.Bytes())
	tap := NewRealtimeTap(MaxEvent, noCeiling)
	for i := 0; i < len(stream); i += 13 {
		chunk := bytes.Clone(stream[i:min(i+13, len(stream))])
		tap.Write(chunk)
		for j := range chunk {
			chunk[j] = 0xff // a caller reusing its buffer
		}
	}
	usagetest.CheckTap(t, tap, doneUsage(21), 0)
}

func TestRealtimeTapMessagesWithoutUsageCostNoAllocation(t *testing.T) {
	stream := usagetest.Stream(
		usagetest.Text(usagetest.AudioDelta),
		usagetest.Frame{Op: usagetest.OpText, Payload: []byte(usagetest.AudioDelta[:40])}.Bytes(),
		usagetest.Frame{Op: usagetest.OpPing, Fin: true, Payload: []byte("x")}.Bytes(),
		usagetest.Frame{Op: usagetest.OpCont, Fin: true, Mask: []byte{1, 2, 3, 4}, Payload: []byte(usagetest.AudioDelta[40:])}.Bytes(),
		usagetest.Frame{Op: usagetest.OpBinary, Fin: true, Payload: make([]byte, 5000)}.Bytes(),
		usagetest.Text(`{"type":"response.created","response":{"id":"resp_1"}}`),
		usagetest.Text(strings.Repeat(" ", 30000)),
	)
	tap := NewRealtimeTap(MaxEvent, noCeiling)
	tap.Write(stream) // the message buffer grows once
	allocs := testing.AllocsPerRun(100, func() {
		tap.Write(stream[:len(stream)/3])
		tap.Write(stream[len(stream)/3:])
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per stream without usage, want 0", allocs)
	}
	usagetest.CheckTap(t, tap, Usage{}, 0)
}

func TestRealtimeTapKeepsItsMessageBufferBounded(t *testing.T) {
	tap := NewRealtimeTap(MaxEvent, noCeiling)
	tap.Write(usagetest.Text(usagetest.Done(1, 2000)))
	if c := cap(tap.buf); c < 2000 || c > realtimeRetainedBuffer {
		t.Errorf("after a 2000-byte message the buffer holds %d bytes; want it kept for the next", c)
	}
	tap.Write(usagetest.Text(usagetest.Done(1, MaxEvent)))
	if tap.buf != nil {
		t.Errorf("a %d-byte buffer is kept after a message over %d bytes", cap(tap.buf), realtimeRetainedBuffer)
	}
	big := usagetest.Text(usagetest.Done(1, MaxEvent))
	tap.Write(big[:len(big)-1])
	if cap(tap.buf) > MaxEvent {
		t.Errorf("buffer %d bytes, over the cap of %d", cap(tap.buf), MaxEvent)
	}
	tap.Write(big[len(big)-1:])
	usagetest.CheckTap(t, tap, doneUsage(1, 1, 1), 0)
}

// takes sums the usage of Takes racing with a tap's writers.
type takes struct {
	mu  sync.Mutex
	sum Usage
}

func (s *takes) take(tap *RealtimeTap) {
	u := tap.Take()
	s.mu.Lock()
	s.sum = s.sum.plus(u)
	s.mu.Unlock()
}

// Two writers calling Write at once, each call carrying whole frames, as
// reverse_proxy's graceful close does (one 4-byte close frame, in one Write)
// while its copier writes. A writer that interleaves partial frames with
// another's cannot be parsed, by this tap or by the client.
func TestRealtimeTapSerializesConcurrentWritersOfWholeFrames(t *testing.T) {
	t.Run("whole messages from both", func(t *testing.T) {
		tap := NewRealtimeTap(MaxEvent, noCeiling)
		var total takes
		var wg sync.WaitGroup
		for w := range 2 {
			wg.Go(func() {
				for i := range 500 {
					if i%3 == 0 { // several frames in one Write
						tap.Write(usagetest.Stream(usagetest.Text(usagetest.Done(w+1, 0)), usagetest.Text(usagetest.AudioDelta), usagetest.Text(usagetest.Done(w+1, 0))))
					} else {
						tap.Write(usagetest.Text(usagetest.Done(w+1, 0)))
					}
					if i%50 == 0 {
						total.take(tap) // a flush, racing with the writers
					}
				}
			})
		}
		wg.Wait()
		total.take(tap)
		// Each writer: 167 Writes of two events and 333 of one.
		want := Usage{Total: 667*1 + 667*2, Input: 2 * 667, Output: 2 * 2 * 667, UncachedInput: 2 * 667}
		if total.sum != want || tap.Unmetered() != 0 || tap.fault {
			t.Fatalf("usage %+v, unmetered %d, fault %v; want %+v, 0, false", total.sum, tap.Unmetered(), tap.fault, want)
		}
	})
	t.Run("fragments and control frames", func(t *testing.T) {
		tap := NewRealtimeTap(MaxEvent, noCeiling)
		var total takes
		done := []byte(usagetest.Done(2, 500))
		var wg sync.WaitGroup
		wg.Go(func() { // the copier, one frame per Write
			for range 300 {
				for i := 0; i < len(done); i += 100 {
					op := byte(usagetest.OpCont)
					if i == 0 {
						op = usagetest.OpText
					}
					tap.Write(usagetest.Frame{Op: op, Fin: i+100 >= len(done), Payload: done[i:min(i+100, len(done))]}.Bytes())
				}
			}
		})
		wg.Go(func() { // the graceful close, and pings
			for i := range 300 {
				if i%2 == 0 {
					tap.Write([]byte{0x88, 0x02, 0x03, 0xe9})
				} else {
					tap.Write(usagetest.Frame{Op: usagetest.OpPing, Fin: true, Payload: []byte("keepalive")}.Bytes())
				}
				if i%30 == 0 {
					total.take(tap)
				}
			}
		})
		wg.Wait()
		total.take(tap)
		if want := (Usage{Total: 300 * 2, Input: 300 * 1, Output: 300 * 2, UncachedInput: 300 * 1}); total.sum != want || tap.Unmetered() != 0 || tap.fault {
			t.Fatalf("usage %+v, unmetered %d, fault %v; want %+v, 0, false", total.sum, tap.Unmetered(), tap.fault, want)
		}
	})
}

func FuzzRealtimeTap(f *testing.F) {
	done := []byte(usagetest.Done(7, 0))
	f.Add(usagetest.Text(usagetest.Done(7, 0)), []byte{0})
	f.Add(usagetest.Stream(
		usagetest.Frame{Op: usagetest.OpText, Mask: []byte{1, 2, 3, 4}, Payload: done[:20]}.Bytes(),
		usagetest.Frame{Op: usagetest.OpPing, Fin: true, Payload: []byte("x")}.Bytes(),
		usagetest.Frame{Op: usagetest.OpCont, Fin: true, LenForm: 64, Payload: done[20:]}.Bytes(),
		usagetest.Frame{Op: usagetest.OpBinary, Fin: true, LenForm: 16, Payload: done}.Bytes(),
		usagetest.Frame{Op: usagetest.OpText, Fin: true, RSV: 0x40, Payload: done}.Bytes(),
		[]byte{0x88, 0x02, 0x03, 0xe9},
	), []byte{3, 1, 200, 7})
	f.Add(usagetest.Text(usagetest.Done(9, 400)), []byte{50, 0, 1})
	f.Add(usagetest.Stream(usagetest.Text(usagetest.AudioDelta), []byte{0x81, 0x7f, 0x80}), []byte{1})
	f.Fuzz(func(t *testing.T, stream []byte, cuts []byte) {
		const limit = 256 // small, so that the over-the-cap path is taken
		whole := feedTap(limit, stream)
		var chunks [][]byte
		for rest, i := stream, 0; len(rest) > 0; i++ {
			n := len(rest)
			if len(cuts) > 0 {
				n = min(n, 1+int(cuts[i%len(cuts)]))
			}
			chunks, rest = append(chunks, rest[:n]), rest[n:]
		}
		cut := feedTap(limit, chunks...)
		for _, tap := range []*RealtimeTap{whole, cut} {
			if tap.fault {
				t.Fatal("the tap recovered from a panic")
			}
			if cap(tap.buf) > limit {
				t.Fatalf("message buffer of %d bytes, over the cap of %d", cap(tap.buf), limit)
			}
		}
		if a, b := whole.Take(), cut.Take(); a != b {
			t.Fatalf("usage %+v whole, %+v when cut", a, b)
		}
		if a, b := whole.Unmetered(), cut.Unmetered(); a != b {
			t.Fatalf("unmetered %d whole, %d when cut", a, b)
		}
	})
}

// Between is true only where a whole message can go in without landing
// inside another: between frames, outside a fragmented message, and never
// after a close frame; Responses counts the response.done events counted.
func TestRealtimeTapSaysWhenItsStreamIsBetweenMessagesAndCountsResponses(t *testing.T) {
	done := []byte(usagetest.Done(3, 0))
	tap := NewRealtimeTap(MaxEvent, noCeiling)
	check := func(what string, want bool) {
		t.Helper()
		if got := tap.Between(); got != want {
			t.Fatalf("%s: Between() = %v, want %v", what, got, want)
		}
	}
	check("a new stream", true)
	whole := usagetest.Text(string(done))
	tap.Write(whole[:1])
	check("inside a header", false)
	tap.Write(whole[1:5])
	check("inside a payload", false)
	tap.Write(whole[5:])
	check("after a whole message", true)
	if n := tap.Responses(); n != 1 {
		t.Fatalf("Responses() = %d after one response.done, want 1", n)
	}
	tap.Write(usagetest.Frame{Op: usagetest.OpText, Payload: done[:4]}.Bytes())
	check("after a first fragment", false)
	tap.Write(usagetest.Frame{Op: usagetest.OpPing, Fin: true}.Bytes())
	check("after a ping inside a fragmented message", false)
	tap.Write(usagetest.Frame{Op: usagetest.OpCont, Fin: true, Payload: done[4:]}.Bytes())
	check("after the last fragment", true)
	if n := tap.Responses(); n != 2 {
		t.Fatalf("Responses() = %d after two response.done, want 2", n)
	}
	tap.Write(usagetest.Frame{Op: usagetest.OpPing, Fin: true}.Bytes())
	check("after a ping", true)
	tap.Write([]byte{0x88, 0x02, 0x03, 0xe9})
	check("after a close frame", false)

	corrupt := NewRealtimeTap(MaxEvent, noCeiling)
	corrupt.Write([]byte{0x83, 0x00}) // a reserved opcode
	if corrupt.Between() {
		t.Fatal("Between() after corrupt framing, want false: no frame boundary is known")
	}
}
