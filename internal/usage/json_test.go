package usage

import (
	"runtime"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

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
		for _, ch := range usagetest.Chunkings() {
			u, metered := meterUsage(usagetest.Header("application/json", ""), ch.Split([]byte(c.body)))
			if u.Total != c.tokens || metered != c.metered {
				t.Errorf("%s (%s): got (%+v, %v), want (%d, %v)", c.name, ch.Name, u, metered, c.tokens, c.metered)
			}
		}
	}
}

// heapDuring reports the bytes allocated while f ran.
func heapDuring(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestUsageTenMegabyteJSONBodyIsMeteredInBoundedMemory(t *testing.T) {
	for _, shape := range []string{"content", "embeddings"} {
		raw := usagetest.BigJSON(shape, 10<<20)
		codings := []string{"identity", "gzip", "zstd", "br"}
		if shape == "embeddings" {
			codings = codings[:2] // random floats are slow to compress under -race
		}
		for _, coding := range codings {
			body := usagetest.Encode(t, coding, raw)
			h := usagetest.Header("application/json", usagetest.EncodingHeader(coding))
			var u Usage
			var metered bool
			allocated := heapDuring(func() {
				m := NewMeter(h)
				for b := body; len(b) > 0; {
					n := min(32<<10, len(b))
					m.Write(b[:n])
					b = b[n:]
				}
				u, metered = m.Finish()
			})
			if u != (Usage{Total: 42, Input: 42, Output: 0, UncachedInput: 42}) || !metered {
				t.Errorf("%s %s: got (%+v, %v), want ({42 42 0 42}, true)", shape, coding, u, metered)
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
