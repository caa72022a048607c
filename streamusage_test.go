package ratelimit

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

func TestStreamUsageIsAddedOnlyToStreamsThatDoNotAskForIt(t *testing.T) {
	for _, c := range []struct {
		name, body string
		added      bool
	}{
		{"stream without options", `{"model":"m","stream":true,"messages":[{"role":"user","content":"<b>&</b>"}]}`, true},
		{"stream with other options", `{"stream":true,"stream_options":{"include_obfuscation":false}}`, true},
		{"stream that declined usage", `{"stream":true,"stream_options":{"include_usage":false}}`, true},
		{"stream with null options", `{"stream":true,"stream_options":null}`, true},
		{"stream that asked for usage", `{"stream":true,"stream_options":{"include_usage":true}}`, false},
		{"not a stream", `{"model":"m","messages":[]}`, false},
		{"stream with an escaped key", `{"\u0073tream":true}`, true},
		{"stream false", `{"stream":false}`, false},
		{"not JSON", `stream=true`, false},
		{"stream options of the wrong type", `{"stream":true,"stream_options":[1]}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, added := withStreamUsage([]byte(c.body))
			if added != c.added {
				t.Fatalf("added %v, want %v", added, c.added)
			}
			if !added {
				return
			}
			var got, sent map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("rewritten body %s: %v", out, err)
			}
			json.Unmarshal([]byte(c.body), &sent)
			if got["stream_options"].(map[string]any)["include_usage"] != true {
				t.Fatalf("include_usage not set in %s", out)
			}
			delete(got, "stream_options")
			if opts, ok := sent["stream_options"].(map[string]any); ok {
				delete(opts, "include_usage")
				for k, v := range opts { // the client's other options are kept
					if !strings.Contains(string(out), `"`+k+`":`+mustJSON(v)) {
						t.Fatalf("option %s lost in %s", k, out)
					}
				}
			}
			delete(sent, "stream_options")
			if mustJSON(got) != mustJSON(sent) {
				t.Fatalf("rewritten body %s changed more than stream_options", out)
			}
			if strings.Contains(string(out), `\u003c`) {
				t.Fatalf("the client's text was escaped: %s", out)
			}
		})
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestRewrittenRequestGetsItsNewContentLengthAndAnIdentityStream(t *testing.T) {
	body := `{"stream":true,"model":"m"}`
	r := httptest.NewRequest("POST", "/v1/chat/completions", io.NopCloser(strings.NewReader(body)))
	r.Header.Set("Content-Type", "application/json; charset=utf-8")
	r.Header.Set("Accept-Encoding", "gzip, br")
	r.ContentLength = -1
	r.TransferEncoding = []string{"chunked"}
	if requestStreamUsage(r, readWhole(t, r)) == nil {
		t.Fatal("no stripper for a streaming chat completion")
	}
	got, _ := io.ReadAll(r.Body)
	if r.ContentLength != int64(len(got)) || r.Header.Get("Content-Length") != strconv.Itoa(len(got)) {
		t.Fatalf("Content-Length %d / %q for a body of %d", r.ContentLength, r.Header.Get("Content-Length"), len(got))
	}
	if r.TransferEncoding != nil || r.Header.Get("Accept-Encoding") != "identity" {
		t.Fatalf("transfer encoding %v, accept-encoding %q", r.TransferEncoding, r.Header.Get("Accept-Encoding"))
	}
}

func TestRequestBodiesOverTheCapOrNotChatCompletionsPassUnmodified(t *testing.T) {
	big := `{"stream":true,"pad":"` + strings.Repeat("x", maxReadBody) + `"}`
	for _, c := range []struct {
		name, method, path, contentType, body string
	}{
		{"over the cap", "POST", "/v1/chat/completions", "application/json", big},
		{"another endpoint", "POST", "/v1/responses", "application/json", `{"stream":true}`},
		{"not JSON", "POST", "/v1/chat/completions", "text/plain", `{"stream":true}`},
		{"a GET", "GET", "/v1/chat/completions", "application/json", `{"stream":true}`},
		{"asked already", "POST", "/v1/chat/completions", "application/json", `{"stream":true,"stream_options":{"include_usage":true}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
			r.Header.Set("Content-Type", c.contentType)
			r.Header.Set("Accept-Encoding", "gzip")
			if requestStreamUsage(r, readWhole(t, r)) != nil {
				t.Fatal("the request was rewritten")
			}
			got, _ := io.ReadAll(r.Body)
			if string(got) != c.body || r.Header.Get("Accept-Encoding") != "gzip" {
				t.Fatalf("the request changed: %d bytes, accept-encoding %q", len(got), r.Header.Get("Accept-Encoding"))
			}
		})
	}
}

// The stripper's output must be the stream minus the usage chunk, however
// the stream is split into writes.
func TestUsageChunkIsRemovedWhateverTheWriteBoundaries(t *testing.T) {
	for _, file := range []string{"openai_chat_stream.sse", "openai_stream_without_usage.sse"} {
		stream := usagetest.Read(t, file)
		want := stream
		if bytes.Contains(stream, []byte(`"choices":[]`)) {
			want = withoutUsageChunk(t, stream)
		}
		for _, c := range usagetest.Chunkings() {
			t.Run(file+"/"+c.Name, func(t *testing.T) {
				s := newUsageStripper()
				var out bytes.Buffer
				for _, p := range c.Split(stream) {
					if n, err := s.write(&out, p); n != len(p) || err != nil {
						t.Fatalf("write returned %d, %v", n, err)
					}
				}
				s.flushTail(&out)
				if !bytes.Equal(out.Bytes(), want) {
					t.Fatalf("got\n%s\nwant\n%s", out.Bytes(), want)
				}
			})
		}
	}
}

func TestStripperAppliesOnlyToUncompressedEventStreams(t *testing.T) {
	for _, c := range []struct {
		contentType, encoding string
		applies               bool
	}{
		{"text/event-stream", "", true},
		{"text/event-stream; charset=utf-8", "identity", true},
		{"text/event-stream", "gzip", false},
		{"application/json", "", false},
	} {
		h := http.Header{"Content-Type": {c.contentType}}
		if c.encoding != "" {
			h.Set("Content-Encoding", c.encoding)
		}
		if got := new(usageStripper).applies(h); got != c.applies {
			t.Errorf("%s %s: applies %v", c.contentType, c.encoding, got)
		}
	}
}

// Reading the body to look for "stream" must pass on exactly the client's
// bytes, whatever length the request declares (or none) and however the body
// arrives, and stop at the cap with the rest still to be read.
func TestForwardedBodyIsTheClientsWhateverItsLengthAndChunking(t *testing.T) {
	small := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say ok."}]}`
	big := `{"model":"m","pad":"` + strings.Repeat("x", maxReadBody) + `"}`
	for _, body := range []string{small, strings.Repeat(" ", 511) + small, big} {
		for _, declared := range []int64{int64(len(body)), -1, int64(len(body)) / 2} {
			for name, wrap := range map[string]func(io.Reader) io.Reader{
				"whole": func(r io.Reader) io.Reader { return r }, "one byte at a time": iotest.OneByteReader,
				"with EOF on the last read": iotest.DataErrReader,
			} {
				if name == "one byte at a time" && len(body) > maxReadBody {
					continue // 4 MiB one byte at a time is slow, and the other two cover the cap
				}
				r := httptest.NewRequest("POST", "/v1/chat/completions", wrap(strings.NewReader(body)))
				r.ContentLength = declared
				r.Header.Set("Content-Type", "application/json")
				if requestStreamUsage(r, readWhole(t, r)) != nil {
					t.Fatal("a request that is no stream was rewritten")
				}
				if got, err := io.ReadAll(r.Body); err != nil || string(got) != body {
					t.Fatalf("%d bytes declared %d, %s: passed on %d bytes (%v)", len(body), declared, name, len(got), err)
				}
			}
		}
	}
	// A read error is passed on after the bytes read before it.
	failing := io.MultiReader(strings.NewReader(`{"model":`), iotest.ErrReader(io.ErrUnexpectedEOF))
	r := httptest.NewRequest("POST", "/v1/chat/completions", failing)
	r.Header.Set("Content-Type", "application/json")
	requestStreamUsage(r, readWhole(t, r))
	if got, err := io.ReadAll(r.Body); string(got) != `{"model":` || err != io.ErrUnexpectedEOF {
		t.Fatalf("passed on %q then %v", got, err)
	}
}
