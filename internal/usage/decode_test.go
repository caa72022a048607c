package usage

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"

	"github.com/rolter/caddy-ratelimit/internal/poll"
	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

func TestUsageTruncatedCompressedStreamChargesWhatWasDecodedBeforeTheCut(t *testing.T) {
	raw := usagetest.Read(t, "anthropic_messages_stream.sse")
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
		h := usagetest.Header("text/event-stream", usagetest.EncodingHeader(coding))
		for _, cut := range []int{firstFlush, firstFlush + 3, len(body) - 3} {
			for _, c := range usagetest.Chunkings()[:3] {
				u, metered := meterUsage(h, c.Split(body[:cut]))
				want := Usage{Total: 472 + 1024 + 2, Input: 472, Output: 2, UncachedInput: 472, CacheRead: 1024}
				if cut == len(body)-3 {
					want = Usage{Total: 472 + 1024 + 89, Input: 472, Output: 89, UncachedInput: 472, CacheRead: 1024}
				}
				if u != want || !metered {
					t.Errorf("%s cut at %d of %d (%s): got (%+v, %v), want (%+v, true)", coding, cut, len(body), c.Name, u, metered, want)
				}
			}
		}
	}
}

func TestUsageCorruptCompressedBodiesAreUnmeteredWithoutPanic(t *testing.T) {
	raw := usagetest.Read(t, "openai_chat.json")
	r := rand.New(rand.NewPCG(7, 7))
	for _, coding := range usagetest.Encodings[1:] {
		h := usagetest.Header("application/json", usagetest.EncodingHeader(coding))
		body := usagetest.Encode(t, coding, raw)
		// Garbage.
		garbage := make([]byte, 4096)
		for i := range garbage {
			garbage[i] = byte(r.Uint32())
		}
		if u, metered := meterUsage(h, [][]byte{garbage}); metered {
			t.Errorf("%s: garbage was metered (%+v)", coding, u)
		}
		// A valid body with its trailer or check bytes damaged.
		damaged := slices.Clone(body)
		damaged[len(damaged)-2] ^= 0xff
		u, metered := meterUsage(h, [][]byte{damaged})
		if coding != "deflate-raw" && coding != "br" && coding != "zstd" && metered {
			// gzip (CRC-32) and zlib (Adler-32) check their data; raw
			// deflate has no check, brotli none, and a zstd frame's checksum
			// is optional (off here).
			t.Errorf("%s: a body with a damaged trailer was metered (%+v)", coding, u)
		}
		// Every single damaged byte: never a panic.
		for i := range body {
			d := slices.Clone(body)
			d[i] ^= byte(1 + r.IntN(255))
			meterUsage(h, [][]byte{d[:i+1], d[i+1:]})
		}
	}
}

func TestUsageNoGoroutineOutlivesFinish(t *testing.T) {
	raw := usagetest.Read(t, "openai_chat_stream.sse")
	waitFor := func(want int) int {
		var n int
		poll.Until(5*time.Second, 10*time.Millisecond, func() error {
			if n = runtime.NumGoroutine(); n > want {
				return errors.New("more goroutines than wanted")
			}
			return nil
		})
		return n
	}
	time.Sleep(50 * time.Millisecond) // let goroutines of earlier tests end
	base := runtime.NumGoroutine()
	var meters []*Meter
	for _, coding := range usagetest.Encodings[1:] {
		body := usagetest.Encode(t, coding, raw)
		h := usagetest.Header("text/event-stream", usagetest.EncodingHeader(coding))
		for _, part := range [][]byte{nil, body[:len(body)/2], body, append(slices.Clone(body), "garbage"...)} {
			m := NewMeter(h)
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
	m := NewMeter(usagetest.Header("application/json", "zstd"))
	var slowest time.Duration
	for b := out.Bytes(); len(b) > 0; {
		n := min(32<<10, len(b))
		start := time.Now()
		m.Write(b[:n])
		slowest = max(slowest, time.Since(start))
		b = b[n:]
	}
	u, metered := m.Finish()
	t.Logf("%d compressed bytes; slowest Write %v", out.Len(), slowest)
	// What came before the cap was read.
	if u != (Usage{Total: 3, Input: 3, Output: 0, UncachedInput: 3}) || !metered {
		t.Fatalf("got (%+v, %v), want ({3 3 0 3}, true): the usage past the cap must not be read", u, metered)
	}
	if m.dec.decoded > maxDecodedBody+decodeBuffer {
		t.Fatalf("decoded %d bytes, cap %d", m.dec.decoded, maxDecodedBody)
	}
}
