package ratelimit

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
)

// headerFamilies is which rate-limit headers a handler sends.
type headerFamilies struct{ openai, ietf, scg, anthropic bool }

func parseHeaderFamilies(names []string) headerFamilies {
	if len(names) == 0 {
		return headerFamilies{openai: true}
	}
	var f headerFamilies
	for _, n := range names {
		f.openai = f.openai || n == "openai"
		f.ietf = f.ietf || n == "ietf"
		f.scg = f.scg || n == "scg"
		f.anthropic = f.anthropic || n == "anthropic"
	}
	return f
}

// families is which headers the handler sends a request of dialect d: the
// configured families, or by default the dialect's own (Anthropic's
// anthropic-ratelimit-*, else OpenAI's x-ratelimit-*).
func (h *Handler) families(d dialect) headerFamilies {
	if len(h.Headers) == 0 && d == dialectAnthropic {
		return headerFamilies{anthropic: true}
	}
	return h.configuredFamilies
}

func validateHeaderFamilies(names []string) error {
	for _, n := range names {
		switch n {
		case "openai", "ietf", "scg", "anthropic":
		case "off":
			if len(names) > 1 {
				return fmt.Errorf("headers off cannot be combined with other header families")
			}
		default:
			return fmt.Errorf("headers must be openai, ietf, scg, anthropic or off, not %q", n)
		}
	}
	return nil
}

func (f headerFamilies) any() bool { return f.openai || f.ietf || f.scg || f.anthropic }

// headerSet is the rate-limit headers of one answer, which replace any of the
// same families that the upstream sends.
type headerSet struct {
	families headerFamilies
	values   [][2]string
}

var (
	openaiHeaders = []string{
		"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
		"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
	}
	ietfHeaders = []string{"Ratelimit-Policy", "Ratelimit"}
	scgHeaders  = []string{
		"X-Ratelimit-Remaining", "X-Ratelimit-Burst-Capacity", "X-Ratelimit-Replenish-Rate", "X-Ratelimit-Requested-Tokens",
	}
	// by kind: requests, tokens, input tokens, output tokens
	anthropicHeaders = []string{
		"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset",
		"Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset",
		"Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset",
		"Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset",
	}
)

// sentFamilies are the header names of each family s sends.
func (s headerSet) sentFamilies() [4][]string {
	var sent [4][]string
	for i, f := range [...]struct {
		sent  bool
		names []string
	}{{s.families.openai, openaiHeaders}, {s.families.ietf, ietfHeaders}, {s.families.scg, scgHeaders}, {s.families.anthropic, anthropicHeaders}} {
		if f.sent {
			sent[i] = f.names
		}
	}
	return sent
}

// apply removes the families' headers already in h, then sets the set's.
// The names are canonical, as every key of h is (http.Header's methods and
// reverse_proxy canonicalize), so delete spares Del's canonicalization.
func (s headerSet) apply(h http.Header) {
	for _, names := range s.sentFamilies() {
		for _, name := range names {
			delete(h, name)
		}
	}
	// One array holds every value (a header's own slice is capped, so that
	// an Add to it copies).
	values := make([]string, len(s.values))
	for i, v := range s.values {
		values[i] = v[1]
		h[v[0]] = values[i : i+1 : i+1]
	}
}

// reapply applies s to h again, unless h holds exactly what s set: each of
// its headers once, with its value, and no other header of its families
// (an upstream's own, which reverse_proxy adds beside them, is not).
func (s headerSet) reapply(h http.Header) {
	set := 0
	for _, names := range s.sentFamilies() {
		for _, name := range names {
			if vs, ok := h[name]; ok {
				if len(vs) != 1 || !s.sets(name, vs[0]) {
					s.apply(h)
					return
				}
				set++
			}
		}
	}
	if set != len(s.values) {
		s.apply(h)
	}
}

// upstreamHeader is an answer's header as the upstream sent it: without
// the values this handler set (ours), which reverse_proxy adds the
// upstream's after (an upstream may send a header of the same name, such
// as OpenAI's x-ratelimit-*). Names are canonical.
type upstreamHeader struct {
	h    http.Header
	ours *headerSet
}

func (u upstreamHeader) Get(name string) string {
	vs := u.h[name]
	if len(vs) > 0 && u.ours.sets(name, vs[0]) {
		vs = vs[1:]
	}
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// sets reports whether s sets header name to value.
func (s headerSet) sets(name, value string) bool {
	for _, v := range s.values {
		if v[0] == name {
			return v[1] == value
		}
	}
	return false
}

// tightest is, for one kind or window, the limit of the chain with the
// least remaining, the first of them in chain order.
type tightest struct {
	found          bool
	capacity, left int64
	resetMillis    int64               // windows
	bucket         limiter.TokenBucket // token buckets
}

// headersFor computes the headers of an answer. counted says whether the
// request itself was charged (admissions) or not (refusals). The headers of
// a kind (requests, tokens, input and output tokens) describe its tightest
// window, a minute or a day: the one with the least remaining, which will
// refuse first; the IETF family lists every window.
func (f headerFamilies) headersFor(chain []limiter.Limit, d limiter.Decision, counted bool) headerSet {
	at := [...]limiter.Position{d.Now.In(limiter.Minute), d.Now.In(limiter.Day)}
	var byKind [4]tightest
	var byWindow [limiter.NumWindows]tightest
	var bkt tightest
	for i, l := range chain {
		if l.Shadow { // tried, not enforced: the caller's limits are the others
			continue
		}
		c := d.Counts[i]
		if counted {
			d.AddTo(l, &c)
		}
		for k, capacity := range l.Each {
			w := c.Window[k]
			p := at[k.Span()]
			t := tightest{capacity: capacity, left: limiter.Remaining(w, capacity, p), resetMillis: limiter.ResetIn(w, p)}
			byKind[k.Kind()].consider(t)
			byWindow[k].consider(t)
		}
		if l.Bucket.Rate > 0 {
			bkt.consider(tightest{capacity: l.Bucket.Burst, left: l.Bucket.Left(c.Deficit), bucket: l.Bucket})
		}
	}
	// The values' text stays on the stack unless every family's headers
	// outgrow it.
	var v headerValues
	var buf [256]byte
	text := buf[:0]
	if f.openai {
		text = byKind[limiter.Requests].appendOpenAI(&v, text, openaiHeaders[:3])
		text = byKind[limiter.Tokens].appendOpenAI(&v, text, openaiHeaders[3:])
	}
	if f.anthropic {
		for k, t := range byKind {
			text = t.appendAnthropic(&v, text, anthropicHeaders[3*k:3*k+3], d.Now.UnixMillis)
		}
	}
	if f.ietf {
		text = appendIETF(&v, text, &byWindow)
	}
	if f.scg && bkt.found {
		// A refusal shows what the bucket holds, as Spring's script
		// returns its refilled level unchanged: above 0 when a request
		// costs more than one token.
		text = bkt.appendSCG(&v, text, bkt.left)
	}
	return headerSet{families: f, values: v.values(text)}
}

// headerValues collects where the values of an answer's headers end in one
// text, which becomes one string: one allocation for the numbers of an
// answer rather than one for each. The text is the caller's, passed along
// and returned as append does, so that it can stay on the caller's stack.
type headerValues struct {
	names [maxHeaderValues]string
	ends  [maxHeaderValues]int // of each value in the text
	n     int
}

// maxHeaderValues is the most headers an answer has: every family's.
const maxHeaderValues = 24

// end ends the value of header name, which the text now ends with, and
// returns the text.
func (v *headerValues) end(name string, text []byte) []byte {
	v.names[v.n], v.ends[v.n] = name, len(text)
	v.n++
	return text
}

// values are the headers and their values, cut from one string of text.
func (v *headerValues) values(text []byte) [][2]string {
	if v.n == 0 {
		return nil
	}
	all, start := string(text), 0
	out := make([][2]string, v.n)
	for i := range v.n {
		out[i], start = [2]string{v.names[i], all[start:v.ends[i]]}, v.ends[i]
	}
	return out
}

// appendIETF appends the IETF family's two headers, which list every
// window capped: its policy and its state.
func appendIETF(v *headerValues, text []byte, byWindow *[limiter.NumWindows]tightest) []byte {
	for h, state := range [...]bool{false, true} {
		listed := false
		for k, t := range byWindow {
			if !t.found {
				continue
			}
			if listed {
				text = append(text, ", "...)
			}
			listed = true
			wk := limiter.WindowKind(k)
			text = append(text, '"')
			text = append(text, wk.Kind().String()...)
			if wk.Span() == limiter.Day {
				text = append(text, "_per_day"...)
			}
			if u := limiter.Spans[wk.Span()]; state {
				text = strconv.AppendInt(append(text, `";r=`...), t.left, 10)
				text = strconv.AppendInt(append(text, ";t="...), limiter.CeilSeconds(t.resetMillis, 0), 10)
			} else {
				text = strconv.AppendInt(append(text, `";q=`...), t.capacity, 10)
				text = strconv.AppendInt(append(text, ";w="...), u.Length*u.UnitMillis/1000, 10)
			}
		}
		if !listed {
			return text
		}
		text = v.end(ietfHeaders[h], text)
	}
	return text
}

// failedOpenHeaders are the headers of a request let through because the
// store failed: with scg, Spring Cloud Gateway's X-RateLimit-Remaining -1
// beside the configuration of the bucket the chain's headers describe when
// every bucket is full; no other family has an answer without counters.
func (f headerFamilies) failedOpenHeaders(chain []limiter.Limit) headerSet {
	s := headerSet{families: headerFamilies{scg: f.scg}}
	if !f.scg {
		return s
	}
	var bkt tightest
	for _, l := range chain {
		if b := l.Bucket; b.Rate > 0 && !l.Shadow {
			bkt.consider(tightest{left: b.Burst - b.Cost, bucket: b})
		}
	}
	if bkt.found {
		var v headerValues
		s.values = v.values(bkt.appendSCG(&v, nil, -1))
	}
	return s
}

// appendSCG appends Spring's four headers of the bucket, with remaining.
func (t tightest) appendSCG(v *headerValues, text []byte, remaining int64) []byte {
	text = v.end(scgHeaders[0], strconv.AppendInt(text, remaining, 10))
	text = v.end(scgHeaders[1], strconv.AppendInt(text, t.bucket.Burst, 10))
	text = v.end(scgHeaders[2], append(text, t.bucket.RateText...))
	return v.end(scgHeaders[3], strconv.AppendInt(text, t.bucket.Cost, 10))
}

func (t *tightest) consider(candidate tightest) {
	if t.found && candidate.left >= t.left {
		return
	}
	*t = candidate
	t.found = true
}

// appendOpenAI appends the limit, remaining and reset headers of names.
func (t tightest) appendOpenAI(v *headerValues, text []byte, names []string) []byte {
	if !t.found {
		return text
	}
	text = v.end(names[0], strconv.AppendInt(text, t.capacity, 10))
	text = v.end(names[1], strconv.AppendInt(text, t.left, 10))
	return v.end(names[2], appendMillis(text, t.resetMillis))
}

// appendMillis appends ms milliseconds as time.Duration's String writes
// them ("1m1.778s", "999ms", "0s"), without its allocation.
func appendMillis(b []byte, ms int64) []byte {
	switch {
	case ms == 0:
		return append(b, "0s"...)
	case ms < 0:
		return append(b, (time.Duration(ms) * time.Millisecond).String()...)
	case ms < 1000:
		return append(strconv.AppendInt(b, ms, 10), "ms"...)
	}
	h, m := ms/3_600_000, ms/60_000%60
	if h > 0 {
		b = append(strconv.AppendInt(b, h, 10), 'h')
	}
	if h > 0 || m > 0 {
		b = append(strconv.AppendInt(b, m, 10), 'm')
	}
	b = strconv.AppendInt(b, ms/1000%60, 10)
	if frac := ms % 1000; frac > 0 {
		digits := [3]byte{byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
		n := 3
		for digits[n-1] == '0' {
			n--
		}
		b = append(append(b, '.'), digits[:n]...)
	}
	return append(b, 's')
}

// appendAnthropic appends the limit, remaining and reset headers of names,
// as Anthropic's API sends them: reset is the RFC 3339 time at which the
// limit is fully replenished, from the store's clock now.
func (t tightest) appendAnthropic(v *headerValues, text []byte, names []string, now int64) []byte {
	if !t.found {
		return text
	}
	text = v.end(names[0], strconv.AppendInt(text, t.capacity, 10))
	text = v.end(names[1], strconv.AppendInt(text, t.left, 10))
	return v.end(names[2], time.UnixMilli(now+t.resetMillis).UTC().AppendFormat(text, time.RFC3339))
}
