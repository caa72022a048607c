package pricing

import (
	"strings"
	"testing"
)

// inline is Inline of a name priced at input $in/M, output $1/M.
func inline(t *testing.T, name, in string) Entry {
	t.Helper()
	e, err := Inline(name, in, "1", "", "")
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestLookupPrefersExactThenTheLongestPrefixThenStar(t *testing.T) {
	tbl, err := NewTable([]Entry{
		inline(t, "*", "1"),
		inline(t, "gpt-4o*", "2"),
		inline(t, "gpt-4o-mini*", "3"),
		inline(t, "gpt-4o-mini-2024", "4"),
		inline(t, "g*", "5"),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ model, name string }{
		{"gpt-4o-mini-2024", "gpt-4o-mini-2024"},
		{"gpt-4o-mini-2024-07-18", "gpt-4o-mini*"},
		{"gpt-4o-mini", "gpt-4o-mini*"},
		{"gpt-4o-2024-08-06", "gpt-4o*"},
		{"gpt-4o", "gpt-4o*"}, // a prefix matches itself
		{"gpt-4", "g*"},
		{"claude-sonnet-4", "*"},
		{"", "*"},
		{"GPT-4o", "*"}, // case-sensitive
		{"openai/gpt-4o", "*"},
	}
	for _, c := range cases {
		e, ok := tbl.Lookup(c.model)
		if !ok || e.Name != c.name {
			t.Errorf("Lookup(%q) = %q, %v; want %q", c.model, e.Name, ok, c.name)
		}
	}
}

func TestLookupWithoutAMatchOrStarIsNotFound(t *testing.T) {
	tbl, err := NewTable([]Entry{inline(t, "gpt-4o*", "2"), inline(t, "o3", "2")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"o3-mini", "gpt-4", "O3", "", "claude"} {
		if e, ok := tbl.Lookup(m); ok {
			t.Errorf("Lookup(%q) = %+v, want not found", m, e)
		}
	}
	var none *Table
	if _, ok := none.Lookup("o3"); ok {
		t.Error("a nil table found o3")
	}
}

func TestInlineEntriesBeatFileEntriesOfTheSameName(t *testing.T) {
	file, err := LoadLiteLLM("testdata/litellm_prices.json")
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := NewTable([]Entry{inline(t, "acme/reasoner", "7"), inline(t, "acme/cached*", "9")}, file)
	if err != nil {
		t.Fatal(err)
	}
	e, ok := tbl.Lookup("acme/reasoner")
	if want := inline(t, "acme/reasoner", "7"); !ok || e != want {
		t.Errorf("acme/reasoner: got %+v, %v; want the inline %+v", e, ok, want)
	}
	// An exact file name still beats an inline prefix: the kind of match
	// decides first, the source only between entries of one name.
	if e, ok := tbl.Lookup("acme/cached-chat"); !ok || e.Name != "acme/cached-chat" || e.Price.CacheWrite != rate(3.75e12) {
		t.Errorf("acme/cached-chat: got %+v, %v; want the file's", e, ok)
	}
	if e, ok := tbl.Lookup("acme/cached-other"); !ok || e.Name != "acme/cached*" {
		t.Errorf("acme/cached-other: got %+v, %v; want acme/cached*", e, ok)
	}
}

func TestLookupNamesTheConfiguredEntryNotTheModelAsked(t *testing.T) {
	tbl, err := NewTable([]Entry{inline(t, "claude-*", "3"), inline(t, "*", "1")}, []Entry{{"o3", Price{Input: rate(1)}}})
	if err != nil {
		t.Fatal(err)
	}
	for model, name := range map[string]string{"claude-sonnet-4-5": "claude-*", "llama": "*", "o3": "o3"} {
		if e, _ := tbl.Lookup(model); e.Name != name {
			t.Errorf("Lookup(%q).Name = %q, want %q", model, e.Name, name)
		}
	}
}

func TestNewTableRejectsBadOrRepeatedInlineNames(t *testing.T) {
	cases := []struct {
		entries []Entry
		want    string
	}{
		{[]Entry{inline(t, "a", "1"), inline(t, "a", "2")}, "price a: given twice"},
		{[]Entry{inline(t, "*", "1"), inline(t, "*", "2")}, "price *: given twice"},
		{[]Entry{{Name: "a*b"}}, "'*' only ends a prefix"},
		{[]Entry{{Name: ""}}, "empty model name"},
	}
	for _, c := range cases {
		if _, err := NewTable(c.entries, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.entries, err, c.want)
		}
	}
	// The same name inline and in the file is no error, nor twice in files.
	if _, err := NewTable([]Entry{inline(t, "a", "1")}, []Entry{{"a", Price{Input: rate(1)}}, {"a", Price{Input: rate(2)}}}); err != nil {
		t.Error(err)
	}
}

func TestNewTableLeavesOutFileEntriesThatPriceNoTokens(t *testing.T) {
	tbl, err := NewTable([]Entry{inline(t, "*", "1")}, []Entry{{"tts", Price{CacheRead: rate(5)}}})
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := tbl.Lookup("tts"); e.Name != "*" {
		t.Errorf("tts: got %q, want * (the file's tts gives no input or output price)", e.Name)
	}
}
