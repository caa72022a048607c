package pricing

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Table is the prices of models by name, from inline entries and a LiteLLM
// file. A nil *Table has no entry.
type Table struct {
	exact    map[string]Entry
	prefixes []Entry // longest first
	star     Entry
	hasStar  bool
}

// NewTable merges inline entries (see Inline) and file entries (see
// ParseLiteLLM). An inline entry's name is a model name, a prefix ending in
// '*' or "*"; a file entry's name is a model name only, even if it holds a
// '*'. An inline entry beats a file entry of the same name; two inline
// entries of the same name are an error; of two file entries of the same
// name the later is kept. A file entry that does not price tokens (see
// Price.Priced) is left out.
func NewTable(inline, file []Entry) (*Table, error) {
	t := &Table{exact: make(map[string]Entry, len(inline)+len(file))}
	for _, e := range file {
		if e.Price.Priced() {
			t.exact[e.Name] = e
		}
	}
	seen := make(map[string]bool, len(inline))
	for _, e := range inline {
		if e.Name == "" {
			return nil, fmt.Errorf("price: empty model name")
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("price %s: given twice", e.Name)
		}
		seen[e.Name] = true
		switch i := strings.IndexByte(e.Name, '*'); {
		case i < 0:
			t.exact[e.Name] = e
		case i != len(e.Name)-1:
			return nil, fmt.Errorf("price %s: '*' only ends a prefix", e.Name)
		case e.Name == "*":
			t.star, t.hasStar = e, true
		default:
			t.prefixes = append(t.prefixes, e)
		}
	}
	slices.SortFunc(t.prefixes, func(a, b Entry) int { return cmp.Compare(len(b.Name), len(a.Name)) })
	return t, nil
}

// Lookup is the entry that prices model: the entry of that exact name, else
// the one of the longest prefix that model starts with ("gpt-4o*" prices
// "gpt-4o" and "gpt-4o-mini"; "gpt-4o-mini*" beats it for the latter), else
// "*". Names are compared byte for byte: case matters, and nothing is
// trimmed or normalised ("GPT-4o" is not "gpt-4o", "openai/gpt-4o" is not
// "gpt-4o"). The entry's Name is the name as configured, the prefix with
// its '*' for a prefix, never the model asked for unless it is that name.
// Without a matching entry and without "*", ok is false.
func (t *Table) Lookup(model string) (e Entry, ok bool) {
	if t == nil {
		return Entry{}, false
	}
	if e, ok := t.exact[model]; ok {
		return e, true
	}
	for _, p := range t.prefixes {
		if strings.HasPrefix(model, p.Name[:len(p.Name)-1]) {
			return p, true
		}
	}
	return t.star, t.hasStar
}
