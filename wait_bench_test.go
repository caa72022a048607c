package ratelimit

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/rolter/caddy-ratelimit/internal/redistest"
)

// BenchmarkWaiting is what a waited request costs, with 1,000 requests of
// one key waiting at once on a bucket of rate 1000 burst 1 in each store:
// each op is one request admitted after waiting in line, each client sending
// its next as soon as one is answered. It reports the gateway's CPU per
// waited request (cpu-ns/op: the whole process, the stand-in upstream
// included) and, on Redis, the script calls and Redis's own time per waited
// request (from INFO commandstats); ns/op is the bucket's pace, not a cost.
// It counts from the moment the first 1,000 were admitted, when every
// waiter has come through the line once, to b.N admissions later; the
// requests still waiting then hang up, uncounted.
func BenchmarkWaiting(b *testing.B) {
	const waiters = 1000
	names, configs := []string{"memory"}, []*RedisConfig{nil}
	url := os.Getenv(redistest.URLEnv)
	if url != "" {
		names, configs = append(names, "redis"), append(configs, &RedisConfig{URL: url, Timeout: caddy.Duration(2 * time.Second)})
	}
	for i, name := range names {
		h := &Handler{
			Redis:  configs[i],
			Scopes: []Scope{{Name: "key", Value: "{http.request.header.X-Api-Key}"}},
			Limits: []LimitConfig{{Scope: "key", ID: "*", Rate: "1000", Burst: 1}},
			Wait:   caddy.Duration(time.Hour),
		}
		h.MaxWaiting, h.OnRedisError = 2*waiters, "deny"
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		if err := h.Provision(ctx); err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			upstream := benchUpstream(b, false)
			body := []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say ok."}]}`)
			key := "bench-wait-" + redistest.UniqueID(b)
			hangUp, stop := context.WithCancel(context.Background())
			defer stop()
			var admitted atomic.Int64
			var start, cpu time.Duration
			var startCalls, calls int64
			var startUsec, usec float64
			started := make(chan struct{}) // closed once start is read
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.StopTimer()
			for range waiters {
				wg.Go(func() {
					w := &discardWriter{}
					for hangUp.Err() == nil {
						r, _ := http.NewRequestWithContext(hangUp, "POST", "http://gateway/v1/chat/completions", bytes.NewReader(body))
						r.Header = http.Header{"Content-Type": {"application/json"}, "X-Api-Key": {key}}
						caddyhttp.NewTestReplacer(r)
						w.header = make(http.Header)
						if err := h.ServeHTTP(w, r, upstream); err != nil && hangUp.Err() == nil {
							b.Error(err)
							return
						}
						if hangUp.Err() != nil {
							break
						}
						switch admitted.Add(1) {
						case waiters:
							start = processCPU(b)
							startCalls, startUsec = redisScriptStats(b, url, name)
							b.StartTimer()
							close(started)
						case waiters + int64(b.N):
							<-started
							b.StopTimer()
							cpu = processCPU(b) - start
							calls, usec = redisScriptStats(b, url, name)
							stop()
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
			if name == "redis" {
				b.ReportMetric(float64(calls-startCalls)/float64(b.N), "redis-calls/op")
				b.ReportMetric((usec-startUsec)/float64(b.N), "redis-µs/op")
			}
		})
		h.Cleanup()
		cancel()
	}
}

// redisScriptStats is the EVALSHA commandstats of the Redis at url for the store name,
// and nothing for the in-process store.
func redisScriptStats(b *testing.B, url, name string) (calls int64, usec float64) {
	if name != "redis" {
		return 0, 0
	}
	return redistest.CommandStats(b, redistest.TestClient(b, url), "evalsha")
}
