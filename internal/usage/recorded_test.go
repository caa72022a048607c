package usage

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/usage/usagetest"
)

// TestRecordedResponsesChargeTheirReportedTotalAndParts meters every recorded
// body as it came over the wire (a gzip one decoded) and the realtime
// sessions' server messages through a tap, and checks the total against the
// manifest, and the priced parts (the uncached input among them) against
// what a plain encoding/json reading of the body's usage objects finds
// (recordedParts), itself checked against the manifest's usage_reported
// where it gives one.
func TestRecordedResponsesChargeTheirReportedTotalAndParts(t *testing.T) {
	entries, read := usagetest.Recorded(t)
	for _, e := range entries {
		body := read(e.File)
		identity := body
		if e.IdentityFile != "" {
			identity = read(e.IdentityFile)
		}
		var got Usage
		var metered bool
		kind := "json"
		switch {
		case strings.HasSuffix(e.File, ".server.jsonl"):
			kind = "realtime"
			tap := NewRealtimeTap(MaxEvent, noCeiling)
			for line := range bytes.SplitSeq(bytes.TrimSpace(body), []byte("\n")) {
				tap.Write(usagetest.Text(string(line)))
			}
			got = tap.Take()
			metered = got != Usage{}
			if tap.Unmetered() != 0 || tap.Faulted() {
				t.Errorf("%s: %d messages unmetered, faulted %v", e.File, tap.Unmetered(), tap.Faulted())
			}
		default:
			if strings.EqualFold(MediaType(e.ContentType), "text/event-stream") {
				kind = "sse"
			}
			encoding := ""
			if strings.HasSuffix(e.File, ".gz") {
				encoding = "gzip"
			}
			h := usagetest.Header(e.ContentType, encoding)
			for _, ch := range usagetest.Chunkings()[:3] { // whole, 1-byte, random
				u, m := meterUsage(h, ch.Split(body))
				if ch.Name == "whole" {
					got, metered = u, m
				} else if u != got || m != metered {
					t.Errorf("%s (%s): got (%+v, %v), whole (%+v, %v)", e.File, ch.Name, u, m, got, metered)
				}
			}
		}
		switch {
		case e.Expected == nil && metered:
			t.Errorf("%s: reports no usage, metered %+v", e.File, got)
		case e.Expected != nil && (!metered || got.Total != *e.Expected):
			t.Errorf("%s: got (%+v, %v), want total %d", e.File, got, metered, *e.Expected)
		}
		if !partsWithinWholes(got) {
			t.Errorf("%s: a part over its whole in %+v", e.File, got)
		}
		want, err := recordedParts(kind, e.Provider, identity)
		if err != nil {
			t.Errorf("%s: %v", e.File, err)
			continue
		}
		if len(e.Reported) > 0 && string(e.Reported) != "null" {
			var reported map[string]any
			if err := json.Unmarshal(e.Reported, &reported); err != nil {
				t.Errorf("%s: usage_reported: %v", e.File, err)
			} else if fromManifest := partsOf(e.Provider, flatten(reported), nil); fromManifest != want {
				t.Errorf("%s: the body's usage reads as %+v, the manifest's usage_reported as %+v", e.File, want, fromManifest)
			}
		}
		if parts := (Usage{UncachedInput: got.UncachedInput, CacheRead: got.CacheRead, CacheWrite: got.CacheWrite, Reasoning: got.Reasoning,
			AudioInput: got.AudioInput, AudioOutput: got.AudioOutput}); parts != want {
			t.Errorf("%s: got parts %+v, want %+v", e.File, parts, want)
		}
		t.Logf("%-55s total %6d in %6d out %5d | uncached in %6d | cache read %6d write %5d reasoning %5d audio in %4d out %4d",
			e.File, got.Total, got.Input, got.Output, got.UncachedInput, got.CacheRead, got.CacheWrite, got.Reasoning, got.AudioInput, got.AudioOutput)
	}
}

// recordedParts reads a body's usage objects with encoding/json, as the
// providers document them, and returns the priced parts they report: of a
// realtime session the sum over its response.done events; else the latest
// value of each field over the body's documents (a Gemini usageMetadata
// replacing the earlier ones whole), and for Anthropic the sum over the
// latest iterations array where there is one.
func recordedParts(kind, provider string, body []byte) (Usage, error) {
	var docs []map[string]any
	switch kind {
	case "realtime":
		var sum Usage
		for line := range bytes.SplitSeq(bytes.TrimSpace(body), []byte("\n")) {
			var doc map[string]any
			if err := json.Unmarshal(line, &doc); err != nil {
				return Usage{}, err
			}
			if doc["type"] != "response.done" {
				continue
			}
			if u, ok := usageObject(doc); ok {
				sum = sum.plus(partsOf(provider, flatten(u), nil))
			}
		}
		return sum, nil
	case "sse":
		sc := bufio.NewScanner(bytes.NewReader(bytes.ReplaceAll(body, []byte("\r\n"), []byte("\n"))))
		sc.Buffer(nil, MaxEvent)
		var data []string
		flush := func() {
			var doc map[string]any
			if len(data) > 0 && json.Unmarshal([]byte(strings.Join(data, "\n")), &doc) == nil {
				docs = append(docs, doc)
			}
			data = data[:0]
		}
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				flush()
			case strings.HasPrefix(line, "data:"):
				data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
			}
		}
		flush()
		if err := sc.Err(); err != nil {
			return Usage{}, err
		}
	default:
		dec := json.NewDecoder(bytes.NewReader(body))
		for {
			var v any
			if err := dec.Decode(&v); err == io.EOF {
				break
			} else if err != nil {
				return Usage{}, err
			}
			switch v := v.(type) {
			case map[string]any:
				docs = append(docs, v)
			case []any:
				for _, e := range v {
					if d, ok := e.(map[string]any); ok {
						docs = append(docs, d)
					}
				}
			}
		}
	}
	latest := map[string]float64{}
	var iterations []any
	for _, doc := range docs {
		u, ok := usageObject(doc)
		if !ok {
			continue
		}
		if _, gemini := doc["usageMetadata"]; gemini {
			clear(latest)
		}
		for k, v := range flatten(u) {
			latest[k] = v
		}
		if it, ok := u["iterations"].([]any); ok {
			iterations = it
		}
	}
	return partsOf(provider, latest, iterations), nil
}

// usageObject is a document's usage object, where the meter looks for it.
func usageObject(doc map[string]any) (map[string]any, bool) {
	for _, k := range []string{"usage", "usageMetadata"} {
		if u, ok := doc[k].(map[string]any); ok {
			return u, true
		}
	}
	for _, w := range []string{"message", "response"} {
		if wrapper, ok := doc[w].(map[string]any); ok {
			if u, ok := wrapper["usage"].(map[string]any); ok {
				return u, true
			}
		}
	}
	return nil, false
}

// flatten is a usage object's numbers by key, and its nested objects'
// numbers by "object.key".
func flatten(u map[string]any) map[string]float64 {
	out := map[string]float64{}
	for k, v := range u {
		switch v := v.(type) {
		case float64:
			out[k] = v
		case map[string]any:
			for k2, v2 := range v {
				if n, ok := v2.(float64); ok {
					out[k+"."+k2] = n
				}
			}
		}
	}
	return out
}

// partsOf is the priced parts a provider's usage fields report. The
// uncached input is the input less what of it was read from a cache (OpenAI,
// Gemini), or Anthropic's input_tokens, which counts neither cache writes
// nor cache reads.
func partsOf(provider string, f map[string]float64, iterations []any) Usage {
	n := func(keys ...string) int64 {
		var s float64
		for _, k := range keys {
			s += f[k]
		}
		return int64(s)
	}
	switch provider {
	case "openai":
		cached := n("prompt_tokens_details.cached_tokens", "input_tokens_details.cached_tokens", "input_token_details.cached_tokens")
		return Usage{
			UncachedInput: n("prompt_tokens", "input_tokens") - cached,
			CacheRead:     cached,
			AudioInput:    n("prompt_tokens_details.audio_tokens", "input_token_details.audio_tokens"),
			Reasoning:     n("completion_tokens_details.reasoning_tokens", "output_tokens_details.reasoning_tokens"),
			AudioOutput:   n("completion_tokens_details.audio_tokens", "output_token_details.audio_tokens"),
		}
	case "anthropic":
		if len(iterations) > 0 {
			var sum Usage
			for _, it := range iterations {
				if m, ok := it.(map[string]any); ok {
					sum = sum.plus(partsOf(provider, flatten(m), nil))
				}
			}
			return sum
		}
		return Usage{UncachedInput: n("input_tokens"), CacheRead: n("cache_read_input_tokens"), CacheWrite: n("cache_creation_input_tokens")}
	case "gemini":
		return Usage{UncachedInput: n("promptTokenCount", "toolUsePromptTokenCount") - n("cachedContentTokenCount"),
			CacheRead: n("cachedContentTokenCount"), Reasoning: n("thoughtsTokenCount")}
	}
	return Usage{}
}

// Every recorded body (identity-encoded; the realtime sessions aside) that
// reports usage is final exactly from the end of its terminal event on,
// cut at every line end and at every byte around its final report: a
// recorded stream cut earlier is charged by the gateway at least what it
// reserved.
func TestRecordedResponsesAreFinalOnlyFromTheirTerminalEvent(t *testing.T) {
	entries, read := usagetest.Recorded(t)
	for _, e := range entries {
		if e.Expected == nil || strings.HasSuffix(e.File, ".gz") || strings.HasSuffix(e.File, ".jsonl") {
			continue
		}
		body := read(e.File)
		stream := strings.EqualFold(MediaType(e.ContentType), "text/event-stream")
		first, last := finalAt(body, stream)
		cuts := []int{len(body)}
		for i, c := range body {
			if c == '\n' || i >= first-64 && i <= last+64 {
				cuts = append(cuts, i, i+1)
			}
		}
		checkFinalFromItsTerminalEvent(t, e.File, e.ContentType, body, cuts)
	}
}
