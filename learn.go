package ratelimit

import (
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/provider"
)

// learning is what the answer to an admitted request teaches the limits of
// its chain that learn the provider's own quota (LimitConfig.Learn): read
// from the answer's status and headers as they are written, before the
// handler's own rate-limit headers replace the provider's, and written to
// the store at once. A refusal that gives no wait in its headers may give
// it in its body (Gemini's RetryInfo): it is written at once with the
// default wait, so that a body slow to come (or a client slow to read it)
// delays no replica's pause, and again with the body's wait, read from its
// first bytes, when the response ends.
type learning struct {
	h     *Handler
	chain []limiter.Limit
	// The admission's moment by the store's clock, and by this machine's
	// monotonic one: a report's moment is the first plus what has elapsed
	// on the second, so that replicas with skewed clocks order their
	// reports alike.
	admittedAt int64
	since      time.Time
	refusal    *provider.Report // a refusal written with the default wait, whose own may be in its body
	body       []byte           // that body's first bytes
}

// A provider report's quotas are the store's, kind for kind: requests,
// tokens, input tokens, output tokens (this fails to compile otherwise).
var _ [limiter.NumLearned]limiter.ReportedQuota = [provider.NumKinds]limiter.ReportedQuota{}

// refusalBodyRead is how much of a refusal's body is read for its wait:
// Gemini's error bodies are a few hundred bytes to a couple of KiB.
const refusalBodyRead = 8 << 10

// learnsQuota reports whether a limit of chain learns the provider's quota.
func learnsQuota(chain []limiter.Limit) bool {
	for _, l := range chain {
		if l.Learn {
			return true
		}
	}
	return false
}

// newLearning is the learning of the answer to an admission of chain
// decided at d, or nil if no limit of chain learns.
func (h *Handler) newLearning(chain []limiter.Limit, d limiter.Decision) *learning {
	if !learnsQuota(chain) {
		return nil
	}
	return &learning{h: h, chain: chain, admittedAt: d.Now.UnixMillis, since: time.Now()}
}

// header reads the answer's status and headers.
func (l *learning) header(status int, header provider.Header) {
	r := provider.Of(status, header, time.Now())
	if r.Refused && r.WaitHeader == "" && status == http.StatusTooManyRequests {
		l.refusal = &r
	}
	if r.Reports() {
		l.write(r)
	}
}

// read keeps the first bytes of a refusal's body.
func (l *learning) read(p []byte) {
	if l.refusal != nil && len(l.body) < refusalBodyRead {
		l.body = append(l.body, p[:min(len(p), refusalBodyRead-len(l.body))]...)
	}
}

// end writes a refusal again with the wait its body gives, if it gives
// one: the store keeps the later of two pauses.
func (l *learning) end() {
	if l.refusal == nil {
		return
	}
	if wait, ok := provider.WaitInBody(l.body); ok {
		l.refusal.Wait, l.refusal.WaitHeader = wait, "RetryInfo"
		l.write(*l.refusal)
	}
	l.refusal = nil
}

// write has the store learn r, without waiting for it: the store stays
// usable until it has.
func (l *learning) write(r provider.Report) {
	report := limiter.Report{At: l.admittedAt + time.Since(l.since).Milliseconds(), Refused: r.Refused, Wait: ceilMillis(r.Wait), WaitFrom: learnedSource(r.WaitHeader)}
	for k, q := range r.Quotas {
		report.Quotas[k] = limiter.ReportedQuota{Limit: q.Limit, Remaining: q.Remaining, ResetMillis: ceilMillis(q.Reset), From: learnedSource(q.Header)}
	}
	if r.Refused {
		providerPauses.paused(l.chain, time.Now().Add(r.Wait))
		if l.h.logger.Core().Enabled(zap.DebugLevel) {
			l.h.logger.Debug("the provider refused: its quota's limits pause", zap.String("scope", l.chain[0].Scope),
				zap.Duration("wait", r.Wait), zap.String("from", r.WaitHeader))
		}
	}
	l.h.store.Hold()
	l.h.store.Learn(l.chain, report, func(err error) {
		if err != nil { // an outage is one line per interval, not one per answer
			l.h.learnWarn.log(l.h.logger, "the provider's report could not be written to the rate limit store", zap.Error(err))
		}
		l.h.store.Release()
	})
}

// learnedSources are where a report may come from, as the store keeps it:
// a code, the source's index plus one (0: none).
var learnedSources = []string{
	"x-ratelimit-limit-requests", "x-ratelimit-limit-tokens",
	"anthropic-ratelimit-requests-limit", "anthropic-ratelimit-tokens-limit", "anthropic-ratelimit-input-tokens-limit", "anthropic-ratelimit-output-tokens-limit",
	"retry-after-ms", "retry-after", "RetryInfo", "default",
}

// learnedSource is the code of the source named name ("" is the default
// wait).
func learnedSource(name string) int64 {
	if name == "" {
		name = "default"
	}
	return int64(slices.Index(learnedSources, name) + 1)
}

// learnedFrom is the source of code, "" for none or one unknown.
func learnedFrom(code int64) string {
	if code < 1 || code > int64(len(learnedSources)) {
		return ""
	}
	return learnedSources[code-1]
}

// ceilMillis is d in whole milliseconds, rounded up: a quota is not full
// before the provider said.
func ceilMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// providerPauses are the learning limits that this process saw the
// provider pause, by key prefix: the gauge of ids paused now reads them.
var providerPauses = pauseLedger{until: make(map[string]pausedLimit)}

type pauseLedger struct {
	mu    sync.Mutex
	until map[string]pausedLimit
}

type pausedLimit struct {
	scope string
	until time.Time
}

// paused records that the learning limits of chain are paused until.
func (p *pauseLedger) paused(chain []limiter.Limit, until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.until) >= 1024 { // bounded by the pauses running now, scraped or not
		p.forgetEnded(time.Now())
	}
	for _, l := range chain {
		if l.Learn && until.After(p.until[l.Prefix].until) {
			p.until[l.Prefix] = pausedLimit{scope: l.Scope, until: until}
		}
	}
}

// byScope counts the limits paused now, by scope name, and forgets those
// whose pause has ended.
func (p *pauseLedger) byScope() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forgetEnded(time.Now())
	counts := make(map[string]int)
	for _, l := range p.until {
		counts[l.scope]++
	}
	return counts
}

// forgetEnded forgets the pauses ended by now, under p.mu.
func (p *pauseLedger) forgetEnded(now time.Time) {
	for prefix, l := range p.until {
		if !now.Before(l.until) {
			delete(p.until, prefix)
		}
	}
}

// pausedIDs is the gauge of the ids paused now, by scope name.
type pausedIDs struct{ desc *prometheus.Desc }

var providerPausedIDs = pausedIDs{prometheus.NewDesc("caddy_rolter_ratelimit_provider_paused_ids",
	"Ids of limits that learn the provider's quota which the provider's refusals pause now, as this process learned them, by scope name.", []string{"scope"}, nil)}

func (c pausedIDs) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c pausedIDs) Collect(ch chan<- prometheus.Metric) {
	for scope, n := range providerPauses.byScope() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), scope)
	}
}
