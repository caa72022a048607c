package usage

import (
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// BenchmarkMeterGoldens meters each golden sample in one Write: bodies of a
// few hundred bytes, where reading the usage is most of the work.
func BenchmarkMeterGoldens(b *testing.B) {
	for _, g := range usagetest.Goldens {
		body := usagetest.Read(b, g.File)
		h := usagetest.Header(usagetest.ContentType(g.File), "")
		b.Run(g.File, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				m := NewMeter(h)
				m.Write(body)
				if u, metered := m.Finish(); u != goldenUsage(g) || metered != g.Metered {
					b.Fatalf("got (%+v, %v), want (%+v, %v)", u, metered, goldenUsage(g), g.Metered)
				}
			}
		})
	}
}

// BenchmarkRealtimeTap reads a response's worth of realtime events: audio
// deltas, then its response.done.
func BenchmarkRealtimeTap(b *testing.B) {
	var frames [][]byte
	for range 50 {
		frames = append(frames, usagetest.Text(usagetest.AudioDelta))
	}
	stream := usagetest.Stream(append(frames, usagetest.Text(usagetest.Done(42, 0)))...)
	tap := NewRealtimeTap(MaxEvent, noCeiling)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		tap.Write(stream)
		if got := tap.Take(); got != (Usage{Total: 42, Input: 1, Output: 2, UncachedInput: 1}) {
			b.Fatalf("took %+v, want {42 1 2 1}", got)
		}
	}
}
