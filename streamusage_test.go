package ratelimit

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// streamUsageCases are request bodies and what the upstream gets of each:
// the body plus the option, or the body unchanged ("").
var streamUsageCases = []struct{ name, body, want string }{
	{"stream without options",
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"<b>&</b>"}]}`,
		`{"model":"m","stream":true,"messages":[{"role":"user","content":"<b>&</b>"}],"stream_options":{"include_usage":true}}`},
	{"keys in the client's order, numbers and escapes as written",
		`{"z":1E+02,"stream":true,"a":-0.0,"s":"caf\u00e9 \/ \"q\" café"}`,
		`{"z":1E+02,"stream":true,"a":-0.0,"s":"caf\u00e9 \/ \"q\" café","stream_options":{"include_usage":true}}`},
	{"whitespace and newlines",
		"{\n  \"stream\" : true ,\n  \"n\": 2\n}\n",
		"{\n  \"stream\" : true ,\n  \"n\": 2\n,\"stream_options\":{\"include_usage\":true}}\n"},
	{"null options",
		`{"stream":true,"stream_options": null ,"n":1}`,
		`{"stream":true,"stream_options": {"include_usage":true} ,"n":1}`},
	{"stream that declined usage",
		`{"stream":true,"stream_options":{ "include_usage" : false }}`,
		`{"stream":true,"stream_options":{ "include_usage" : true }}`},
	{"include_usage null",
		`{"stream":true,"stream_options":{"include_usage":null,"x":1}}`,
		`{"stream":true,"stream_options":{"include_usage":true,"x":1}}`},
	{"include_usage of another type",
		`{"stream":true,"stream_options":{"include_usage":"true"}}`,
		`{"stream":true,"stream_options":{"include_usage":true}}`},
	{"stream with other options",
		`{"stream":true,"stream_options":{"include_obfuscation":false}}`,
		`{"stream":true,"stream_options":{"include_obfuscation":false,"include_usage":true}}`},
	{"empty options",
		`{"stream":true,"stream_options":{ }}`,
		`{"stream":true,"stream_options":{ "include_usage":true}}`},
	{"stream that asked for usage", `{"stream":true,"stream_options":{"include_usage":true}}`, ""},
	{"the last include_usage is true", `{"stream":true,"stream_options":{"include_usage":false,"include_usage":true}}`, ""},
	{"the last include_usage is false",
		`{"stream":true,"stream_options":{"include_usage":true,"include_usage":false}}`,
		`{"stream":true,"stream_options":{"include_usage":true,"include_usage":true}}`},
	{"the last stream is true",
		`{"stream":false,"stream":true}`,
		`{"stream":false,"stream":true,"stream_options":{"include_usage":true}}`},
	{"the last stream is false", `{"stream":true,"stream":false}`, ""},
	{"the last stream_options is null",
		`{"stream":true,"stream_options":{"include_usage":true},"stream_options":null}`,
		`{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"include_usage":true}}`},
	{"the last stream_options asks for usage", `{"stream":true,"stream_options":null,"stream_options":{"include_usage":true}}`, ""},
	{"escaped keys",
		`{"stre\u0061m":true,"stream\u005foptions":{"include\u005Fusage":false}}`,
		`{"stre\u0061m":true,"stream\u005foptions":{"include\u005Fusage":true}}`},
	{"escaped keys that ask for usage", `{"\u0073tream":true,"stream_options":{"\u0069nclude_usage":true}}`, ""},
	{"a key that unescapes to another", `{"stream\u00e9":true}`, ""},
	{"nested stream keys", `{"metadata":{"stream":true},"messages":[{"stream":true}]}`, ""},
	{"nested stream_options",
		`{"stream":true,"metadata":{"stream_options":null}}`,
		`{"stream":true,"metadata":{"stream_options":null},"stream_options":{"include_usage":true}}`},
	{"nested include_usage",
		`{"stream":true,"stream_options":{"x":{"include_usage":true}}}`,
		`{"stream":true,"stream_options":{"x":{"include_usage":true},"include_usage":true}}`},
	{"not a stream", `{"model":"m","messages":[]}`, ""},
	{"stream false", `{"stream":false}`, ""},
	{"stream a string", `{"stream":"true"}`, ""},
	{"not JSON", `stream=true`, ""},
	{"cut short", `{"stream":true`, ""},
	{"more after the object", `{"stream":true} {}`, ""},
	{"an array", `[{"stream":true}]`, ""},
	{"stream options of the wrong type", `{"stream":true,"stream_options":[1]}`, ""},
	{"stream options a string", `{"stream":true,"stream_options":"include_usage"}`, ""},
}

func TestStreamUsageRewriteAddsTheOptionAndChangesNothingElse(t *testing.T) {
	for _, c := range streamUsageCases {
		t.Run(c.name, func(t *testing.T) {
			edit, ok := streamUsageEdit([]byte(c.body))
			if ok != (c.want != "") {
				t.Fatalf("edited %v, want %q", ok, c.want)
			}
			if got := edit.apply([]byte(c.body)); ok && string(got) != c.want {
				t.Fatalf("got\n%s\nwant\n%s", got, c.want)
			}
		})
	}
}

// FuzzStreamUsageRewrite holds the rewrite, for any body, to: an edit
// exactly when encoding/json reads the body as a stream that does not ask
// for usage, with stream_options absent, null or an object; an edited body
// that reads as the body plus include_usage true; and an edit that puts the
// option's bytes in the place of nothing, of a null stream_options or of
// the include_usage value, so that the rest of the body is its bytes.
func FuzzStreamUsageRewrite(f *testing.F) {
	for _, c := range streamUsageCases {
		f.Add([]byte(c.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		edit, ok := streamUsageEdit(body)
		sent, valid := decodeJSON(body)
		if ok != (valid && wantsStreamUsage(sent)) {
			t.Fatalf("edited %v the body %s", ok, body)
		}
		if !ok {
			return
		}
		replaced := body[edit.start:edit.end]
		switch edit.text {
		case `,"stream_options":{"include_usage":true}`, `"include_usage":true`, `,"include_usage":true`:
			if len(replaced) > 0 {
				t.Fatalf("the edit of %s replaced %s with a member", body, replaced)
			}
		case `{"include_usage":true}`:
			if string(replaced) != "null" {
				t.Fatalf("the edit of %s replaced %s with the options", body, replaced)
			}
		case "true":
			if !json.Valid(replaced) {
				t.Fatalf("the edit of %s replaced %s, not a value, with true", body, replaced)
			}
		default:
			t.Fatalf("the edit of %s added %s", body, edit.text)
		}
		out := edit.apply(body)
		got, valid := decodeJSON(out)
		if !valid {
			t.Fatalf("the edit of %s made %s, not JSON", body, out)
		}
		want := sent.(map[string]any)
		if opts, isObject := want["stream_options"].(map[string]any); isObject {
			opts["include_usage"] = true
		} else {
			want["stream_options"] = map[string]any{"include_usage": true}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s reads as %v, want %v", out, got, want)
		}
	})
}

// decodeJSON decodes b as encoding/json does, each number as written.
func decodeJSON(b []byte) (any, bool) {
	if !json.Valid(b) {
		return nil, false
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	return v, d.Decode(&v) == nil
}

// wantsStreamUsage reports whether a decoded request is a stream whose
// stream_options can take include_usage and does not have it true.
func wantsStreamUsage(req any) bool {
	m, ok := req.(map[string]any)
	if !ok || m["stream"] != true {
		return false
	}
	switch opts := m["stream_options"].(type) {
	case nil:
		return true
	case map[string]any:
		return opts["include_usage"] != true
	}
	return false
}

func TestRewrittenRequestGetsItsNewContentLengthAndAnIdentityStream(t *testing.T) {
	body := `{"stream":true,"model":"m"}`
	r := httptest.NewRequest("POST", "/v1/chat/completions", io.NopCloser(strings.NewReader(body)))
	r.Header.Set("Content-Type", "application/json; charset=utf-8")
	r.Header.Set("Accept-Encoding", "gzip, br")
	r.ContentLength = -1
	r.TransferEncoding = []string{"chunked"}
	if requestStreamUsage(requestOf(r), readWhole(t, r)) == nil {
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
		{"not JSON", "POST", "/v1/chat/completions", "application/x-www-form-urlencoded", `stream=true&model=m`},
		{"a GET", "GET", "/v1/chat/completions", "application/json", `{"stream":true}`},
		{"asked already", "POST", "/v1/chat/completions", "application/json", `{"stream":true,"stream_options":{"include_usage":true}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
			r.Header.Set("Content-Type", c.contentType)
			r.Header.Set("Accept-Encoding", "gzip")
			if requestStreamUsage(requestOf(r), readWhole(t, r)) != nil {
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
				if err := s.flushTail(&out); err != nil {
					t.Fatal(err)
				}
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
				if requestStreamUsage(requestOf(r), readWhole(t, r)) != nil {
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
	requestStreamUsage(requestOf(r), readWhole(t, r))
	if got, err := io.ReadAll(r.Body); string(got) != `{"model":` || err != io.ErrUnexpectedEOF {
		t.Fatalf("passed on %q then %v", got, err)
	}
}
