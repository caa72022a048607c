package ratelimit

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// benchUpstream stands in for reverse_proxy to bench/upstream: it reads the
// request body and copies bench/upstream's answer, as reverse_proxy does.
func benchUpstream(b *testing.B, quotaHeaders bool) caddyhttp.Handler {
	body, err := os.ReadFile("bench/upstream/completion.json")
	if err != nil {
		b.Fatal(err)
	}
	length := []string{strconv.Itoa(len(body))}
	// As OpenAI's answers report its quota; made once, as the stand-in's
	// other headers are, so that the benchmark counts the limiter's work.
	quota := map[string][]string{
		"X-Ratelimit-Limit-Requests": {"100000000"}, "X-Ratelimit-Remaining-Requests": {"99999999"}, "X-Ratelimit-Reset-Requests": {"1ms"},
		"X-Ratelimit-Limit-Tokens": {"1000000000"}, "X-Ratelimit-Remaining-Tokens": {"999990000"}, "X-Ratelimit-Reset-Tokens": {"1ms"},
	}
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		io.Copy(io.Discard, r.Body)
		h := w.Header()
		h["Content-Type"] = []string{"application/json"}
		h["Content-Length"] = length
		if quotaHeaders {
			for name, v := range quota {
				h[name] = v[:1:1] // an Add copies
			}
		}
		w.WriteHeader(http.StatusOK)
		_, err := io.Copy(w, bytes.NewReader(body))
		return err
	})
}

// discardWriter is a client connection that takes the answer and keeps nothing.
type discardWriter struct{ header http.Header }

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

// benchmarkHandler serves requests of 1000 keys sharing a project, team and
// org, each asking for at most 64 tokens, as bench/run's limited site does, through h (nil: no limiter), and
// reports the time, CPU time (cpu-ns/op: every thread of this process, so
// the gateway's side of a Redis call, not Redis's) and allocations of each
// request with the stand-in upstream; the difference to h == nil is what the
// limiter costs Caddy. With 32 clients on 2 cores, ns/op is wall time shared
// by the cores, and a request waiting on Redis costs wall time but no CPU.
// Every request carries its key's plan, X-Plan-Rpm, which only the
// per-request-cap chain reads.
func benchmarkHandler(b *testing.B, h *Handler) {
	upstream := benchUpstream(b, h != nil && slices.ContainsFunc(h.Limits, func(l LimitConfig) bool { return l.Learn }))
	body := []byte(`{"model":"gpt-4o-mini","max_tokens":64,"messages":[{"role":"user","content":"Say ok."}]}`)
	b.ReportAllocs()
	b.SetParallelism(16) // 32 clients on 2 cores, as bench/run's wrk
	start := processCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		w := &discardWriter{}
		for i := 0; pb.Next(); i++ {
			r, _ := http.NewRequest("POST", "http://gateway/v1/chat/completions", bytes.NewReader(body))
			r.Header = http.Header{
				"Content-Type": {"application/json"}, "X-Api-Key": {"bench-key-" + strconv.Itoa(i%1000)},
				"X-Project": {"bench-project"}, "X-Team": {"bench-team"}, "X-Org": {"bench-org"},
				"X-Plan-Rpm": {"1000000000"},
			}
			caddyhttp.NewTestReplacer(r)
			w.header = make(http.Header)
			var err error
			if h == nil {
				err = upstream.ServeHTTP(w, r)
			} else {
				err = h.ServeHTTP(w, r, upstream)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
}

// processCPU is the user and system CPU time of this process so far.
func processCPU(b *testing.B) time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		b.Fatal(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// chainVariant is what bench/run's 4-scope chain caps beside each limit's
// rpm and tpm.
type chainVariant uint8

const (
	plainChain      chainVariant = iota
	inFlightChain                // concurrent on each limit
	budgetChain                  // budget_month on each limit, the model priced
	perRequestChain              // the key's rpm from the request's X-Plan-Rpm
	rpmOnlyChain                 // rpm alone on each limit, and headers off: bench/run's memory-rpm site
	learnChain                   // the org's limit learns the provider's quota, which each answer reports
	floorsChain                  // and keeps 60% of it for the request's team, and 10% for another
	notifyChain                  // budgetChain whose every limit notifies at 80%, 95% and 100%, never reached
	topChain                     // plainChain tallying the top consumers of every scope
)

// benchmarkChainHandler limits the four scopes of bench/run's limited site,
// with caps that admit everything, in Redis (nil: in-process), reserving
// tokens or not, and with the caps of variant. It is provisioned before the
// benchmark's name is printed, so that its log line does not split the
// benchmark's output line.
func benchmarkChainHandler(b *testing.B, redis *RedisConfig, reserve bool, variant chainVariant) *Handler {
	h := &Handler{Redis: redis, ReserveTokens: &reserve}
	switch variant {
	case budgetChain, notifyChain:
		h.Prices = []PriceConfig{{Model: "gpt-4o-mini", Input: "0.15", Output: "0.60", CacheRead: "0.075"}}
	case topChain:
		h.Top = &TopConfig{Scopes: []string{"key", "project", "team", "org"}}
	case rpmOnlyChain:
		h.Headers = []string{"off"}
	}
	for _, s := range [][2]string{{"key", "X-Api-Key"}, {"project", "X-Project"}, {"team", "X-Team"}, {"org", "X-Org"}} {
		h.Scopes = append(h.Scopes, Scope{Name: s[0], Value: "{http.request.header." + s[1] + "}", Readable: s[0] != "key"})
		l := LimitConfig{Scope: s[0], ID: "*", RPM: 1e9, TPM: 1e12}
		switch variant {
		case inFlightChain:
			l.Concurrent = 1e9
		case budgetChain:
			l.BudgetMonth = "1000000"
		case notifyChain:
			l.BudgetMonth, l.Notify = "1000000", []json.Number{"0.8", "0.95", "1"}
		case perRequestChain:
			if s[0] == "key" {
				l.RPM, l.PerRequest = 0, map[string]PerRequestCap{"rpm": {Value: "{http.request.header.X-Plan-Rpm}"}}
			}
		case rpmOnlyChain:
			l.TPM = 0
		case learnChain:
			l.Learn = s[0] == "org"
		case floorsChain:
			if l.Learn = s[0] == "org"; l.Learn {
				l.Floors = []FloorConfig{{Scope: "team", ID: "bench-team", Percent: 60}, {Scope: "team", ID: "other-team", Percent: 10}}
			}
		}
		h.Limits = append(h.Limits, l)
	}
	parent := caddy.Context{Context: context.Background()}
	if variant == notifyChain { // its handler emits through the events app of a running config
		if err := caddy.Load([]byte(`{"admin":{"disabled":true}}`), true); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { caddy.Stop() })
		parent = caddy.ActiveContext()
	}
	ctx, cancel := caddy.NewContext(parent)
	b.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Cleanup() })
	return h
}

// BenchmarkHandler is Caddy's time per request without the limiter, and with
// it on bench/run's 4-scope chain in each store, reserving tokens (the
// default), reactive, with every limit capping requests in flight too, and
// with every limit holding a monthly budget too (the request priced, its
// cost reserved and settled), and with the key's rpm taken from a request
// header (rpm {http.request.header.X-Plan-Rpm}), and with rpm alone on each
// limit and headers off (the least the limiter does for a request): the
// differences are what reservation, a cap on requests in flight, a budget,
// a cap per request and the token limits cost; and with the org's limit
// learning the provider's quota, which each answer reports as OpenAI's do,
// and with floors on it, of which the request's team has one; and the
// budget chain notifying at 80%, 95% and 100%, and the plain chain
// tallying the top consumers of its four scopes.
func BenchmarkHandler(b *testing.B) {
	b.Run("none", func(b *testing.B) { benchmarkHandler(b, nil) })
	names, configs := []string{"memory"}, []*RedisConfig{nil}
	if url := os.Getenv(redistest.URLEnv); url != "" {
		names, configs = append(names, "redis"), append(configs, &RedisConfig{URL: url})
	}
	for i, name := range names {
		h, reactive := benchmarkChainHandler(b, configs[i], true, plainChain), benchmarkChainHandler(b, configs[i], false, plainChain)
		inFlight, budget := benchmarkChainHandler(b, configs[i], true, inFlightChain), benchmarkChainHandler(b, configs[i], true, budgetChain)
		perRequest := benchmarkChainHandler(b, configs[i], true, perRequestChain)
		rpmOnly := benchmarkChainHandler(b, configs[i], true, rpmOnlyChain)
		learn, floors := benchmarkChainHandler(b, configs[i], true, learnChain), benchmarkChainHandler(b, configs[i], true, floorsChain)
		notify, top := benchmarkChainHandler(b, configs[i], true, notifyChain), benchmarkChainHandler(b, configs[i], true, topChain)
		b.Run(name, func(b *testing.B) { benchmarkHandler(b, h) })
		b.Run(name+"/reactive", func(b *testing.B) { benchmarkHandler(b, reactive) })
		b.Run(name+"/in-flight-cap", func(b *testing.B) { benchmarkHandler(b, inFlight) })
		b.Run(name+"/budget", func(b *testing.B) { benchmarkHandler(b, budget) })
		b.Run(name+"/per-request-cap", func(b *testing.B) { benchmarkHandler(b, perRequest) })
		b.Run(name+"/rpm-only", func(b *testing.B) { benchmarkHandler(b, rpmOnly) })
		b.Run(name+"/learn", func(b *testing.B) { benchmarkHandler(b, learn) })
		b.Run(name+"/learn/floors", func(b *testing.B) { benchmarkHandler(b, floors) })
		b.Run(name+"/budget/notify", func(b *testing.B) { benchmarkHandler(b, notify) })
		b.Run(name+"/top", func(b *testing.B) { benchmarkHandler(b, top) })
	}
}

// BenchmarkCapsFor is what a limit's caps cost to find for a request: a
// limit of plain caps, and the same limit whose rpm comes from a request
// header (the difference BenchmarkHandler's per-request-cap case is too
// noisy to show).
func BenchmarkCapsFor(b *testing.B) {
	r, _ := http.NewRequest("POST", "http://gateway/v1/chat/completions", nil)
	r.Header.Set("X-Plan-Rpm", "1000000000")
	req := &request{Request: r}
	for _, tc := range []struct {
		name string
		lc   LimitConfig
	}{
		{"static", LimitConfig{Scope: "key", ID: "*", RPM: 1e9, TPM: 1e12}},
		{"header", LimitConfig{Scope: "key", ID: "*", TPM: 1e12, PerRequest: map[string]PerRequestCap{"rpm": {Value: "{http.request.header.X-Plan-Rpm}"}}}},
	} {
		nominal, err := tc.lc.nominal()
		if err != nil {
			b.Fatal(err)
		}
		caps, err := nominal.caps()
		if err != nil {
			b.Fatal(err)
		}
		spec := newLimitSpec(tc.lc, caps, lineSettings{})
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, bad := spec.capsFor(req); bad != "" {
					b.Fatal(bad)
				}
			}
		})
	}
}
