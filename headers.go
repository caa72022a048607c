package ratelimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
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

// apply removes the families' headers already in h, then sets the set's.
// The names are canonical, as every key of h is (http.Header's methods and
// reverse_proxy canonicalize), so delete spares Del's canonicalization.
func (s headerSet) apply(h http.Header) {
	for _, f := range [...]struct {
		sent  bool
		names []string
	}{{s.families.openai, openaiHeaders}, {s.families.ietf, ietfHeaders}, {s.families.scg, scgHeaders}, {s.families.anthropic, anthropicHeaders}} {
		if f.sent {
			for _, name := range f.names {
				delete(h, name)
			}
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

// tightest is, for one kind or window, the limit of the chain with the
// least remaining, the first of them in chain order.
type tightest struct {
	found          bool
	capacity, left int64
	resetMillis    int64       // windows
	bucket         tokenBucket // token buckets
}

// headersFor computes the headers of an answer. counted says whether the
// request itself was charged (admissions) or not (refusals). The headers of
// a kind (requests, tokens, input and output tokens) describe its tightest
// window, a minute or a day: the one with the least remaining, which will
// refuse first; the IETF family lists every window.
func (f headerFamilies) headersFor(chain []limit, d decision, counted bool) headerSet {
	at := [...]position{d.now.in(minute), d.now.in(day)}
	var byKind [4]tightest
	var byWindow [numWindows]tightest
	var bkt tightest
	for i, l := range chain {
		if l.shadow { // tried, not enforced: the caller's limits are the others
			continue
		}
		c := d.counts[i]
		if counted {
			c = d.countsAfter(l, c)
		}
		for k, capacity := range l.each {
			w := c.w[k]
			p := at[k.span()]
			t := tightest{capacity: capacity, left: remaining(w, capacity, p), resetMillis: resetIn(w, p)}
			byKind[k.kind()].consider(t)
			byWindow[k].consider(t)
		}
		if l.bucket.rate > 0 {
			bkt.consider(tightest{capacity: l.bucket.burst, left: l.bucket.left(c.deficit), bucket: l.bucket})
		}
	}
	s := headerSet{families: f, values: make([][2]string, 0, 8)}
	if f.openai {
		s.values = byKind[requests].appendOpenAI(s.values, openaiHeaders[:3])
		s.values = byKind[tokens].appendOpenAI(s.values, openaiHeaders[3:])
	}
	if f.anthropic {
		for k, t := range byKind {
			s.values = t.appendAnthropic(s.values, anthropicHeaders[3*k:3*k+3], d.now.unixMillis)
		}
	}
	if f.ietf {
		var policy, state []string
		for k, t := range byWindow {
			if t.found {
				name, wk := windowKind(k).kind().String(), windowKind(k)
				if wk.span() == day {
					name += "_per_day"
				}
				u := spans[wk.span()]
				policy = append(policy, fmt.Sprintf("%q;q=%d;w=%d", name, t.capacity, u.length*u.unitMillis/1000))
				state = append(state, fmt.Sprintf("%q;r=%d;t=%d", name, t.left, ceilSeconds(t.resetMillis, 0)))
			}
		}
		if len(policy) > 0 {
			s.values = append(s.values, [2]string{ietfHeaders[0], strings.Join(policy, ", ")}, [2]string{ietfHeaders[1], strings.Join(state, ", ")})
		}
	}
	if f.scg && bkt.found {
		// A refusal shows what the bucket holds, as Spring's script
		// returns its refilled level unchanged: above 0 when a request
		// costs more than one token.
		s.values = bkt.appendSCG(s.values, bkt.left)
	}
	return s
}

// failedOpenHeaders are the headers of a request let through because the
// store failed: with scg, Spring Cloud Gateway's X-RateLimit-Remaining -1
// beside the configuration of the bucket the chain's headers describe when
// every bucket is full; no other family has an answer without counters.
func (f headerFamilies) failedOpenHeaders(chain []limit) headerSet {
	s := headerSet{families: headerFamilies{scg: f.scg}}
	if !f.scg {
		return s
	}
	var bkt tightest
	for _, l := range chain {
		if b := l.bucket; b.rate > 0 && !l.shadow {
			bkt.consider(tightest{left: b.burst - b.cost, bucket: b})
		}
	}
	if bkt.found {
		s.values = bkt.appendSCG(make([][2]string, 0, len(scgHeaders)), -1)
	}
	return s
}

// appendSCG appends Spring's four headers of the bucket, with remaining.
func (t tightest) appendSCG(values [][2]string, remaining int64) [][2]string {
	return append(values,
		[2]string{scgHeaders[0], strconv.FormatInt(remaining, 10)},
		[2]string{scgHeaders[1], strconv.FormatInt(t.bucket.burst, 10)},
		[2]string{scgHeaders[2], t.bucket.rateText},
		[2]string{scgHeaders[3], strconv.FormatInt(t.bucket.cost, 10)},
	)
}

func (t *tightest) consider(candidate tightest) {
	if t.found && candidate.left >= t.left {
		return
	}
	*t = candidate
	t.found = true
}

// appendOpenAI appends the limit, remaining and reset headers of names.
func (t tightest) appendOpenAI(values [][2]string, names []string) [][2]string {
	if !t.found {
		return values
	}
	return append(values,
		[2]string{names[0], strconv.FormatInt(t.capacity, 10)},
		[2]string{names[1], strconv.FormatInt(t.left, 10)},
		[2]string{names[2], (time.Duration(t.resetMillis) * time.Millisecond).String()},
	)
}

// appendAnthropic appends the limit, remaining and reset headers of names,
// as Anthropic's API sends them: reset is the RFC 3339 time at which the
// limit is fully replenished, from the store's clock now.
func (t tightest) appendAnthropic(values [][2]string, names []string, now int64) [][2]string {
	if !t.found {
		return values
	}
	return append(values,
		[2]string{names[0], strconv.FormatInt(t.capacity, 10)},
		[2]string{names[1], strconv.FormatInt(t.left, 10)},
		[2]string{names[2], time.UnixMilli(now + t.resetMillis).UTC().Format(time.RFC3339)},
	)
}
