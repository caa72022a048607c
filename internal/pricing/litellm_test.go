package pricing

import (
	"strings"
	"testing"
)

func rate(atto int64) Rate { return Rate{atto, true} }

func TestLiteLLMFileReadsPerTokenPricesExactlyAndLeavesOutTheRest(t *testing.T) {
	entries, err := LoadLiteLLM("testdata/litellm_prices.json")
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{
		{"acme/*", Price{Input: rate(5e12), Output: rate(5e12)}},
		{"acme/audio-chat", Price{Input: rate(2.5e12), Output: rate(10e12), CacheRead: rate(1.25e12), AudioInput: rate(40e12), AudioOutput: rate(80e12)}},
		// Tiered, 1-hour cache write, batch and per-query prices are not read.
		{"acme/cached-chat", Price{Input: rate(3e12), Output: rate(15e12), CacheRead: rate(0.3e12), CacheWrite: rate(3.75e12)}},
		{"acme/embedder", Price{Input: rate(1e8), Output: rate(0)}},
		{"acme/free", Price{Input: rate(0), Output: rate(0)}},
		{"acme/half-null", Price{Output: rate(2e12)}},
		{"acme/reasoner", Price{Input: rate(1.1e12), Output: rate(4.4e12), Reasoning: rate(8e12)}},
		// acme/speech, acme/transcriber and acme/painter price no tokens;
		// sample_spec is no model.
	}
	if len(entries) != len(want) {
		t.Fatalf("got %d entries %+v, want %d", len(entries), entries, len(want))
	}
	for i := range want {
		if entries[i] != want[i] {
			t.Errorf("entry %d: got %+v, want %+v", i, entries[i], want[i])
		}
	}
}

func TestLiteLLMFileKeysAreExactNamesEvenWithAStar(t *testing.T) {
	entries, err := LoadLiteLLM("testdata/litellm_prices.json")
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := NewTable(nil, entries)
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := tbl.Lookup("acme/other"); ok {
		t.Errorf("acme/other found as %q: a file's acme/* is no prefix", e.Name)
	}
	if e, ok := tbl.Lookup("acme/*"); !ok || e.Name != "acme/*" {
		t.Errorf("acme/*: got %+v, %v", e, ok)
	}
	for _, m := range []string{"acme/speech", "acme/transcriber", "acme/painter", "sample_spec"} {
		if _, ok := tbl.Lookup(m); ok {
			t.Errorf("%s has no token price, but is found", m)
		}
	}
}

func TestMalformedLiteLLMFilesAreErrorsSayingWhere(t *testing.T) {
	cases := []struct {
		name, body string
		want       []string
	}{
		{"syntax", "{\n  \"m\": {\n    \"input_cost_per_token\": 1e-06,,\n  }\n}", []string{"price file f.json", "line 3, column 35 (offset 46)", "invalid character ','"}},
		{"truncated", "{\"m\": {\"input_cost_per_token\": 1e-06", []string{"price file f.json", "line 1, column 36 (offset 36)", "unexpected end of JSON input"}},
		{"trailing junk", "{} x", []string{"price file f.json", "line 1, column 4 (offset 4)", "after top-level value"}},
		{"empty", "", []string{"price file f.json", "unexpected end of JSON input"}},
		{"an array", "[1, 2]", []string{"price file f.json", "line 1", "not a JSON object of models"}},
		{"null", "null", []string{"price file f.json", "null, not a JSON object"}},
		{"an entry that is not an object", `{"m": [1]}`, []string{`price file f.json: entry "m": not a JSON object`}},
		{"a null entry", `{"m": null}`, []string{`entry "m": not a JSON object`}},
		{"a string price", `{"m": {"input_cost_per_token": "2e-06"}}`, []string{`entry "m": input_cost_per_token: string "2e-06", not a number`}},
		{"a boolean price", `{"m": {"output_cost_per_audio_token": true}}`, []string{`entry "m": output_cost_per_audio_token: a boolean, not a number`}},
		{"a negative price", `{"m": {"output_cost_per_token": -1e-06}}`, []string{`entry "m": output_cost_per_token -1e-06 (USD per token): negative`}},
		{"a price beyond int64", `{"m": {"output_cost_per_reasoning_token": 1e400}}`, []string{`entry "m": output_cost_per_reasoning_token 1e400`, "too large"}},
		{"a bad price on an unpriced entry", `{"m": {"input_cost_per_audio_token": "x", "input_cost_per_second": 1}}`, []string{`entry "m": input_cost_per_audio_token`}},
	}
	for _, c := range cases {
		_, err := ParseLiteLLM("f.json", []byte(c.body))
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", c.name, err, w)
			}
		}
	}
	if _, err := LoadLiteLLM("testdata/no-such-file.json"); err == nil || !strings.Contains(err.Error(), "no-such-file.json") {
		t.Errorf("missing file: %v", err)
	}
}

func TestUnknownLiteLLMFieldsOfAnyValueAreIgnored(t *testing.T) {
	body := `{"m": {"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06,
		"input_cost_per_token_above_128k_tokens": "junk", "max_tokens": "LEGACY", "x": {"y": [null, -1e999]},
		"output_cost_per_image": -5, "supports_vision": "yes"}}`
	entries, err := ParseLiteLLM("f.json", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if want := []Entry{{"m", Price{Input: rate(1e12), Output: rate(2e12)}}}; len(entries) != 1 || entries[0] != want[0] {
		t.Errorf("got %+v, want %+v", entries, want)
	}
}

func TestALiteLLMKeyGivenTwiceIsTheLastOne(t *testing.T) {
	entries, err := ParseLiteLLM("f.json", []byte(`{"m": {"input_cost_per_token": 1e-06}, "m": {"input_cost_per_token": 2e-06}}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Price.Input != rate(2e12) {
		t.Errorf("got %+v", entries)
	}
}

// LiteLLM's file writes prices as a float's shortest text, which may be
// finer than an atto-dollar: such a price loads, rounded up to the next
// atto-dollar, never down.
func TestALiteLLMPriceFinerThanAnAttoDollarLoadsRoundedUp(t *testing.T) {
	entries, err := ParseLiteLLM("prices.json", []byte(`{"m": {"input_cost_per_token": 6.571428571428571e-06, "output_cost_per_token": 1e-06}}`))
	if err != nil || len(entries) != 1 {
		t.Fatalf("%v, %v", entries, err)
	}
	if in := entries[0].Price.Input; in != (Rate{Atto: 6_571_428_571_429, Given: true}) {
		t.Fatalf("input %+v, want 6571428571428.571 atto-dollars rounded up", in)
	}
}
