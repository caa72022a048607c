package usage

import (
	"strings"
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

// BenchmarkEventStreamMeter meters a MiB of Bedrock's streams, in writes of
// 4 KiB: ConverseStream's contentBlockDelta events of about 100 bytes of
// text each, then its metadata; and InvokeModelWithResponseStream's chunks,
// Anthropic's content_block_delta events in base64, then message_delta and
// message_stop with Bedrock's invocation metrics.
func BenchmarkEventStreamMeter(b *testing.B) {
	text := strings.Repeat("a token or two ", 7)
	converse, invoke := []string{`{"event":"messageStart","payload":{"role":"assistant"}}`}, []string{
		`{"bytes":{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":12,"output_tokens":1}}}}`,
	}
	for range 1 << 20 / 210 {
		converse = append(converse, `{"event":"contentBlockDelta","payload":{"contentBlockIndex":0,"delta":{"text":"`+text+`"},"p":"abcdefghij"}}`)
		invoke = append(invoke, `{"bytes":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`+text+`"}}}`)
	}
	converse = append(converse, `{"event":"metadata","payload":{"usage":{"inputTokens":19,"outputTokens":57,"totalTokens":76},"metrics":{"latencyMs":1024}}}`)
	invoke = append(invoke, `{"bytes":{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":88}}}`,
		`{"bytes":{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":12,"outputTokenCount":88,"invocationLatency":2410,"firstByteLatency":508}}}`)
	h := usagetest.Header("application/vnd.amazon.eventstream", "")
	for _, c := range []struct {
		name   string
		events []string
		output int64
	}{{"ConverseStream", converse, 57}, {"InvokeModelWithResponseStream", invoke, 88}} {
		stream := usagetest.EventStream(b, []byte("["+strings.Join(c.events, ",")+"]"))
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				m := NewMeter(h)
				for p := stream; len(p) > 0; p = p[min(4096, len(p)):] {
					m.Write(p[:min(4096, len(p))])
				}
				if u, metered := m.Finish(); !metered || u.Output != c.output {
					b.Fatalf("got (%+v, %v)", u, metered)
				}
			}
		})
	}
}
