package ratelimit

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/llmapi"
)

// requestOf is r as ServeHTTP reads it, without a replacer.
func requestOf(r *http.Request) *request {
	call := llmapi.Of(r.URL.Path)
	return &request{Request: r, call: call, dia: dialectOf("", call)}
}

// readWhole reads r's body as the handler does and returns it when it was
// read whole, else nil; its memory is given back when the test ends, as
// ServeHTTP gives it back when the request ends.
func readWhole(t *testing.T, r *http.Request) []byte {
	t.Helper()
	req := requestOf(r)
	body, err := readRequestBody(req, defaultBodyMemory)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(req.held.release)
	return body.whole()
}

// A body longer than the read limit reserves the estimate of what was read
// of it, so that it never reserves less than a shorter body that begins
// alike; it still reaches the upstream whole.
func TestABodyOverTheReadLimitReservesNoLessThanOneUnderIt(t *testing.T) {
	h := &Handler{}
	chain := []limit{newLimit("org", "o", 0, maxCap)}
	reserve := func(content int) tokenCounts {
		body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", content) + `"}]}`
		r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		read, err := readRequestBody(requestOf(r), defaultBodyMemory)
		if err != nil {
			t.Fatal(err)
		}
		if read.complete != (len(body) <= maxReadBody) {
			t.Fatalf("a body of %d bytes read complete: %v", len(body), read.complete)
		}
		reserved, _ := h.reservation(estimate(llmapi.Of(r.URL.Path), read), chain, nil)
		if forwarded, err := io.ReadAll(r.Body); err != nil || string(forwarded) != body {
			t.Fatalf("a body of %d bytes forwarded as %d bytes (%v)", len(body), len(forwarded), err)
		}
		return reserved
	}
	under, over := reserve(maxReadBody-100), reserve(maxReadBody+100)
	if over.input < under.input || under.input < (maxReadBody-100)/4 {
		t.Fatalf("a body over the read limit reserves %d input tokens, one under it %d", over.input, under.input)
	}
}

// Every byte a body holds under body_memory is given back once the next
// handler has read it, or closed it, or the request ends unread.
func TestABodysMemoryIsGivenBackOnceReadClosedOrReleased(t *testing.T) {
	for name, finish := range map[string]func(req *request){
		"read":     func(req *request) { io.ReadAll(req.Body) },
		"closed":   func(req *request) { req.Body.Close() },
		"released": func(req *request) { req.held.release() },
	} {
		r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"`+strings.Repeat("m", 40000)+`"}`))
		r.Header.Set("Content-Type", "application/json")
		req := requestOf(r)
		b, err := readRequestBody(req, defaultBodyMemory)
		if err != nil {
			t.Fatal(err)
		}
		if bodiesHeld.bytesHeld() < int64(len(b.bytes)) {
			t.Fatalf("%s: %d bytes held for a body of %d", name, bodiesHeld.bytesHeld(), len(b.bytes))
		}
		finish(req)
		req.held.release() // as ServeHTTP does at the end, whatever came before
		if held := bodiesHeld.bytesHeld(); held != 0 {
			t.Fatalf("%s: %d bytes still held", name, held)
		}
	}
}
