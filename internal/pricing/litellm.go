package pricing

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// liteLLMFields are the members of a LiteLLM entry that are read, each a
// price in USD per token, and the part of a Price each gives.
var liteLLMFields = []struct {
	name string
	rate func(*Price) *Rate
}{
	{"input_cost_per_token", func(p *Price) *Rate { return &p.Input }},
	{"output_cost_per_token", func(p *Price) *Rate { return &p.Output }},
	{"cache_read_input_token_cost", func(p *Price) *Rate { return &p.CacheRead }},
	{"cache_creation_input_token_cost", func(p *Price) *Rate { return &p.CacheWrite }},
	{"output_cost_per_reasoning_token", func(p *Price) *Rate { return &p.Reasoning }},
	{"input_cost_per_audio_token", func(p *Price) *Rate { return &p.AudioInput }},
	{"output_cost_per_audio_token", func(p *Price) *Rate { return &p.AudioOutput }},
}

// liteLLMSpec is the key of the file's documentation entry, not a model.
const liteLLMSpec = "sample_spec"

// LoadLiteLLM is ParseLiteLLM of the file at path.
func LoadLiteLLM(path string) ([]Entry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("price file: %w", err)
	}
	return ParseLiteLLM(path, data)
}

// ParseLiteLLM reads the entries of a price file in the format of LiteLLM's
// model_prices_and_context_window.json: a JSON object whose keys are model
// names and whose values are objects of a model's facts. Each key is an
// exact model name (see Table.Lookup). The entries come sorted by name;
// file names the file in errors.
//
// Read from each entry, in USD per token, exactly from their decimal text
// (2.5e-06 is 2_500_000_000_000 atto-dollars, never a float64):
//
//	input_cost_per_token             Input
//	output_cost_per_token            Output
//	cache_read_input_token_cost      CacheRead
//	cache_creation_input_token_cost  CacheWrite
//	output_cost_per_reasoning_token  Reasoning
//	input_cost_per_audio_token       AudioInput
//	output_cost_per_audio_token      AudioOutput
//
// A field that is absent or null is not given; any other value that is not
// a non-negative JSON number exact to the atto-dollar and within an int64
// of them is an error naming the file, entry and field (so is an entry that
// is not an object). Every other field is ignored, whatever its value:
// context sizes, litellm_provider, mode, supports_* and the like, and every
// price that is not one plain price per token of the kinds above, as Cost
// has no count to price it by:
//
//   - tiered prices (*_above_128k_tokens, *_above_200k_tokens,
//     tiered_pricing): a long request is priced at the base price, below
//     what it is billed;
//   - cache_creation_input_token_cost_above_1hr: 1-hour cache writes are
//     priced as 5-minute ones;
//   - batch, flex and priority prices (*_batches, *_batch_requests, *_flex,
//     *_priority): every request is priced at the standard tier;
//   - input_cost_per_token_cache_hit: cache reads are priced by
//     cache_read_input_token_cost, else at the input price;
//   - image tokens (input_cost_per_image_token, output_cost_per_image_token,
//     cache_read_input_image_token_cost) and cached audio
//     (cache_creation_input_audio_token_cost,
//     cache_read_input_audio_token_cost): those tokens are priced as the
//     input, output or cache tokens they are counted in;
//   - prices per character, second, image, pixel, page, query, request,
//     session, GB or 1k calls, search_context_cost_per_query,
//     computer_use_*_per_1k_tokens, citation_cost_per_token and the
//     Databricks *_dbu_* / *_db_* prices.
//
// An entry that gives neither an input nor an output price per token (a
// model priced per character, second or image only) prices no tokens: it is
// left out, so a model of that name is priced by a prefix or "*" entry if
// there is one, and is not found otherwise. The "sample_spec" entry, the
// file's own documentation, is skipped.
//
// A file that is not one JSON object is an error naming the file and the
// line, column and byte offset of the JSON error. A key given twice is the
// last one, as in LiteLLM's own reading of the file.
func ParseLiteLLM(file string, data []byte) ([]Entry, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		var syntax *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syntax):
			return nil, fmt.Errorf("price file %s: %s: %w", file, position(data, syntax.Offset), err)
		case errors.As(err, &typ):
			return nil, fmt.Errorf("price file %s: %s: not a JSON object of models: %w", file, position(data, typ.Offset), err)
		}
		return nil, fmt.Errorf("price file %s: %w", file, err)
	}
	if raw == nil {
		return nil, fmt.Errorf("price file %s: null, not a JSON object of models", file)
	}
	entries := make([]Entry, 0, len(raw))
	for name, value := range raw {
		if name == liteLLMSpec {
			continue
		}
		p, err := parseLiteLLMEntry(value)
		if err != nil {
			return nil, fmt.Errorf("price file %s: entry %q: %w", file, name, err)
		}
		if p.Priced() {
			entries = append(entries, Entry{Name: name, Price: p})
		}
	}
	slices.SortFunc(entries, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	return entries, nil
}

// parseLiteLLMEntry is the price of one entry's value.
func parseLiteLLMEntry(value json.RawMessage) (Price, error) {
	var fields map[string]any
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	if err := dec.Decode(&fields); err != nil || fields == nil {
		return Price{}, errors.New("not a JSON object")
	}
	var p Price
	for _, f := range liteLLMFields {
		v, ok := fields[f.name]
		if !ok || v == nil {
			continue
		}
		n, ok := v.(json.Number)
		if !ok {
			return Price{}, fmt.Errorf("%s: %s, not a number", f.name, describe(v))
		}
		atto, _, err := parseDecimal(string(n), attoScale)
		if err != nil {
			return Price{}, fmt.Errorf("%s %s (USD per token): %w", f.name, n, err)
		}
		*f.rate(&p) = Rate{Atto: atto, Given: true}
	}
	return p, nil
}

// describe names the JSON type of a decoded value, for errors.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("string %q", v)
	case bool:
		return "a boolean"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	}
	return fmt.Sprintf("%T", v)
}

// position says where the JSON error at offset of data is, as "line L,
// column C (offset O)": O is encoding/json's offset, the bytes read up to
// and with the one at fault, and L and C (from 1, columns in bytes) are
// where that last byte read is.
func position(data []byte, offset int64) string {
	at := min(max(offset-1, 0), int64(len(data)))
	before := data[:at]
	line := bytes.Count(before, []byte("\n")) + 1
	col := len(before) - bytes.LastIndexByte(before, '\n')
	return fmt.Sprintf("line %d, column %d (offset %d)", line, col, offset)
}
