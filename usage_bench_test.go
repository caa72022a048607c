package ratelimit

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/usage"
	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// usageBigSSE is an event stream of about size bytes: OpenAI chat chunks of
// a stream with stream_options.include_usage (each has "usage":null), or
// Anthropic content_block_delta events, ending with the usage event.
func usageBigSSE(shape string, size int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < size; i++ {
		switch shape {
		case "anthropic":
			fmt.Fprintf(&b, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"token %d of a long answer, \\\"quoted\\\"\"}}\n\n", i)
		default:
			fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-B1xK9qW2eR3tY4uI5oP6aS7dF8\",\"object\":\"chat.completion.chunk\",\"created\":1739812400,\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_0aa8d3e20b\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token %d\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n", i)
		}
	}
	switch shape {
	case "anthropic":
		b.WriteString("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":40,\"output_tokens\":2}}\n\n")
	default:
		b.WriteString("data: {\"id\":\"chatcmpl-B1xK9qW2eR3tY4uI5oP6aS7dF8\",\"object\":\"chat.completion.chunk\",\"created\":1739812400,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"total_tokens\":42}}\n\ndata: [DONE]\n\n")
	}
	return b.Bytes()
}

// benchmarkUsageMeter meters body in Writes of 32 KiB, as reverse_proxy
// copies a response.
func benchmarkUsageMeter(b *testing.B, h http.Header, raw, body []byte) {
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		m := usage.NewMeter(h)
		for p := body; len(p) > 0; {
			n := min(32<<10, len(p))
			m.Write(p[:n])
			p = p[n:]
		}
		if u, metered := m.Finish(); u.Total != 42 || !metered {
			b.Fatalf("got (%+v, %v), want a total of 42", u, metered)
		}
	}
}

// BenchmarkUsageMeterSSE10MB: MB/s are of the decoded stream.
func BenchmarkUsageMeterSSE10MB(b *testing.B) {
	for _, shape := range []string{"openai", "anthropic"} {
		raw := usageBigSSE(shape, 10<<20)
		for _, coding := range []string{"identity", "gzip"} {
			body := usagetest.Encode(b, coding, raw)
			h := usagetest.Header("text/event-stream", usagetest.EncodingHeader(coding))
			b.Run(shape+"/"+coding, func(b *testing.B) { benchmarkUsageMeter(b, h, raw, body) })
		}
	}
}

// BenchmarkUsageMeterJSON10MB: MB/s are of the decoded body.
func BenchmarkUsageMeterJSON10MB(b *testing.B) {
	for _, shape := range []string{"content", "embeddings"} {
		raw := usagetest.BigJSON(shape, 10<<20)
		for _, coding := range []string{"identity", "gzip"} {
			body := usagetest.Encode(b, coding, raw)
			h := usagetest.Header("application/json", usagetest.EncodingHeader(coding))
			b.Run(shape+"/"+coding, func(b *testing.B) { benchmarkUsageMeter(b, h, raw, body) })
		}
	}
}
