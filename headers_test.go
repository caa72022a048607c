package ratelimit

import (
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"
)

// Setting an answer's headers again when the response's header is written
// leaves the header exactly as setting them afresh would, whatever the
// upstream or another handler did to it meanwhile: a header of ours given a
// second value or another, deleted, or one of our families that we do not
// set; and a header that is as we set it is not set again.
func TestReappliedHeadersAreWhatApplyingThemAfreshGives(t *testing.T) {
	s := headerSet{families: headerFamilies{openai: true}, values: [][2]string{
		{"X-Ratelimit-Limit-Requests", "10"}, {"X-Ratelimit-Remaining-Requests", "9"}, {"X-Ratelimit-Reset-Requests", "6s"},
	}}
	for _, tc := range []struct {
		name   string
		change func(http.Header)
	}{
		{"untouched", func(http.Header) {}},
		{"another header added", func(h http.Header) { h.Set("Content-Type", "application/json") }},
		{"a second value of ours", func(h http.Header) { h.Add("X-Ratelimit-Limit-Requests", "99999") }},
		{"ours changed", func(h http.Header) { h.Set("X-Ratelimit-Remaining-Requests", "99998") }},
		{"ours deleted", func(h http.Header) { h.Del("X-Ratelimit-Reset-Requests") }},
		{"one of our family we do not set", func(h http.Header) { h.Set("X-Ratelimit-Limit-Tokens", "99999") }},
		{"another family's", func(h http.Header) { h.Set("Ratelimit", `"requests";r=1;t=1`) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Server": {"Caddy"}}
			s.apply(h)
			tc.change(h)
			want := h.Clone()
			s.apply(want)
			before := h["X-Ratelimit-Limit-Requests"]
			s.reapply(h)
			if !maps.EqualFunc(h, want, func(a, b []string) bool { return slices.Equal(a, b) }) {
				t.Fatalf("reapplied %v, want %v", h, want)
			}
			if tc.name == "untouched" && &h["X-Ratelimit-Limit-Requests"][0] != &before[0] {
				t.Fatal("headers as they were set were set again")
			}
		})
	}
}

// A reset is written as time.Duration's String writes it, without its
// allocation: every millisecond up to three minutes, and a sample of longer
// ones up to two days.
func TestResetTimesAreWrittenAsDurationsStringWritesThem(t *testing.T) {
	check := func(ms int64) {
		if got, want := string(appendMillis(nil, ms)), (time.Duration(ms) * time.Millisecond).String(); got != want {
			t.Fatalf("%d ms written %q, want %q", ms, got, want)
		}
	}
	for ms := int64(-1000); ms <= 180_000; ms++ {
		check(ms)
	}
	for ms := int64(180_000); ms <= 2*86_400_000; ms += 997 {
		check(ms)
	}
}
