package usagetest

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// Encodings are the content codings the meter decodes. "deflate" is
// zlib-wrapped as HTTP says; "deflate-raw" is sent as "deflate" too.
var Encodings = []string{"identity", "gzip", "x-gzip", "deflate", "deflate-raw", "br", "zstd"}

// Encode compresses b as the coding says (the header value is
// EncodingHeader of it).
func Encode(t testing.TB, coding string, b []byte) []byte {
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

// EncodingHeader is the Content-Encoding a body in coding is sent with.
func EncodingHeader(coding string) string {
	switch coding {
	case "identity":
		return ""
	case "deflate-raw":
		return "deflate"
	}
	return coding
}

// BigJSON is a JSON body of about size bytes with its usage at the end:
// a chat completion with one long content string, or an embeddings list.
func BigJSON(shape string, size int) []byte {
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
