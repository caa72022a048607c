package ratelimit

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
)

// The collectors live with the process, so that counters keep counting across
// config reloads as Prometheus expects; every Provision registers them again
// in the new config's registry (each config load has a fresh one). No label
// carries an id: scope names and kinds are configuration, ids are not.
var (
	admissionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "admissions_total",
		Help: "Requests and realtime sessions seen, by outcome: admitted, refused, refused_empty_scope, refused_ambiguous_scope, refused_body_memory, refused_no_price, refused_bad_limit, shadow_refused (admitted, but a shadow limit would have refused it), failed_open, failed_closed, refused_connections, refused_unmetered_session (a WebSocket session over HTTP/2 or HTTP/3 whose chain meters tokens or spend).",
	}, []string{"outcome"})
	refusalsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "refusals_total",
		Help: "Refused requests (and realtime events a spent budget refuses), by the scope name, kind (requests, tokens, input_tokens, output_tokens, burst, too_large, concurrency, budget, provider: the provider's own quota, as a limit learned it; for a shadow limit also unreadable: a cap per request not given validly) and window (minute, day, or a budget's day, month; empty for a bucket or a concurrency cap) of the first refusing limit, and shadow: true for a request a shadow limit would have refused, which passed.",
	}, []string{"scope", "kind", "window", "shadow"})
	refusalsCachedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "refusals_cached_total",
		Help: "Refused requests answered from the refusal cache, without a Redis call; they also count in refusals_total.",
	})
	tokensChargedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "tokens_charged_total",
		Help: "Tokens charged to the chains of admitted responses and realtime sessions (a settled reservation counts what it finally charged), by kind: total (what tpm and tpd count), input, output; and model: the configured entry of the request's model (modelLabel).",
	}, []string{"kind", "model"})
	tokensReservedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "tokens_reserved_total",
		Help: "Tokens reserved by admitted requests on their chains' token windows, by kind: total, input, output; and model, as tokens_charged_total.",
	}, []string{"kind", "model"})
	tokensReturnedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "tokens_returned_total",
		Help: "Reserved tokens given back when responses settled below their reservation, by kind: total, input, output; and model, as tokens_charged_total.",
	}, []string{"kind", "model"})
	unmeteredTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "unmetered_total",
		Help: "Metered responses with no usage found, and realtime messages that could not be read, by what: response, realtime_message.",
	}, []string{"what"})
	usageClampedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "usage_clamped_total",
		Help: "Responses whose reported usage was over what one response can use, charged at the ceiling instead, by what: response, realtime_response.",
	}, []string{"what"})
	redisDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "redis_call_duration_seconds",
		Help:    "Redis calls of the limiter, by operation: admit, record_tokens, free_slots, renew_slots, peek, reset, learn.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
	}, []string{"op"})
	redisErrorsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "redis_errors_total",
		Help: "Redis calls of the limiter that failed, by operation.",
	}, []string{"op"})
	sessionsOpen = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "realtime_sessions_open",
		Help: "WebSocket sessions open through the limiter in this process.",
	}, func() float64 { return float64(openSessions.Load()) })
	requestBodyBytes = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "request_body_bytes",
		Help: "Memory held by the request bodies the limiter is reading in this process (body_memory caps it).",
	}, func() float64 { return float64(bodiesHeld.bytesHeld()) })
	spendReservedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "spend_reserved_nanodollars_total",
		Help: "Nano-dollars (1e-9 USD) reserved on budgets by admitted requests, by the price entry that priced them (its configured name).",
	}, []string{"price"})
	spendChargedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "spend_charged_nanodollars_total",
		Help: "Nano-dollars (1e-9 USD) charged to budgets for responses and realtime sessions (a settled reservation counts what it finally charged), by price entry.",
	}, []string{"price"})
	spendReturnedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "spend_returned_nanodollars_total",
		Help: "Nano-dollars (1e-9 USD) of reservations given back when responses settled below them, by price entry.",
	}, []string{"price"})
	waitDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "wait_duration_seconds",
		Help:    "How long requests that waited (wait) waited, admitted or refused in the end.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	waitingNow = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "waiting_requests",
		Help: "Requests waiting (wait) in this process.",
	}, func() float64 { return float64(waitingRequests.Load()) })
	thresholdsCrossedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "thresholds_crossed_total",
		Help: "Crossings of a limit's notify fractions, each counted once across every gateway (by the gateway whose admission reached it), by scope name, cap (rpm, tpm, …, bucket, concurrent, budget_day, budget_month) and percent.",
	}, []string{"scope", "cap", "percent"})
	waitsDeclinedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "waits_declined_total",
		Help: "Requests that wait would have held, refused at once because max_waiting requests were waiting already in this process.",
	})
	slotsHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "slots_held",
		Help: "Slots of caps on requests in flight that this process holds (its requests in flight under them), by the scope name of the cap.",
	}, []string{"scope"})
	memoryCounters = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "rolter_ratelimit", Name: "memory_counters",
		Help: "Counters the in-process store holds (one per limited scope id); idle ones are reclaimed.",
	}, countMemoryCounters)
)

// Outcomes of an admission, as metric labels and the outcome placeholder.
const (
	outcomeAdmitted          = "admitted"
	outcomeRefused           = "refused"
	outcomeRefusedEmptyScope = "refused_empty_scope"
	// A scope's header sent twice, or two credentials: 400.
	outcomeRefusedAmbiguousScope = "refused_ambiguous_scope"
	// No room under body_memory: 503.
	outcomeRefusedBodyMemory = "refused_body_memory"
	// Under a budget, a model without a price: 400.
	outcomeRefusedNoPrice = "refused_no_price"
	// A cap per request missing or not valid, without a fallback: 503.
	outcomeRefusedBadLimit = "refused_bad_limit"
	// Admitted, but a shadow limit would have refused it.
	outcomeShadowRefused      = "shadow_refused"
	outcomeFailedOpen         = "failed_open"
	outcomeFailedClosed       = "failed_closed"
	outcomeRefusedConnections = "refused_connections"
	// A WebSocket session over HTTP/2 or HTTP/3 under a chain that meters
	// tokens or spend: 400.
	outcomeRefusedUnmetered = "refused_unmetered_session"
)

// outcomeRecord is what an outcome sets: its placeholder's value, boxed
// once, and its series of admissions_total, looked up once. Every request
// sets one.
type outcomeRecord struct {
	placeholder any
	admissions  prometheus.Counter
}

var outcomeRecords = func() map[string]outcomeRecord {
	records := make(map[string]outcomeRecord)
	for _, o := range []string{outcomeAdmitted, outcomeRefused, outcomeRefusedEmptyScope, outcomeRefusedAmbiguousScope, outcomeRefusedBodyMemory,
		outcomeRefusedNoPrice, outcomeRefusedBadLimit, outcomeShadowRefused, outcomeFailedOpen, outcomeFailedClosed, outcomeRefusedConnections, outcomeRefusedUnmetered} {
		records[o] = outcomeRecord{placeholder: o, admissions: admissionsTotal.WithLabelValues(o)}
	}
	return records
}()

// registerMetrics registers the process's collectors in a config's registry.
func registerMetrics(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{admissionsTotal, refusalsTotal, refusalsCachedTotal, tokensChargedTotal, tokensReservedTotal, tokensReturnedTotal, spendReservedTotal, spendChargedTotal, spendReturnedTotal, unmeteredTotal, usageClampedTotal, redisDuration, redisErrorsTotal, sessionsOpen, requestBodyBytes, waitDuration, waitingNow, waitsDeclinedTotal, thresholdsCrossedTotal, slotsHeld, memoryCounters, providerPausedIDs} {
		if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	return nil
}

// tokenCounters are a token counter's series by kind (total, input,
// output), looked up once: every admission and response adds to them.
type tokenCounters [3]prometheus.Counter

// tokenMetrics are the token counters of one model label: charged,
// reserved and returned.
type tokenMetrics struct{ charged, reserved, returned tokenCounters }

// tokenMetricsByModel holds each model label's counters, made once: the
// labels are the configured entries, a bounded set.
var tokenMetricsByModel sync.Map // model label → *tokenMetrics

// tokensOfModel is the token counters of the model label.
func tokensOfModel(model string) *tokenMetrics {
	if m, ok := tokenMetricsByModel.Load(model); ok {
		return m.(*tokenMetrics)
	}
	of := func(c *prometheus.CounterVec) tokenCounters {
		return tokenCounters{c.WithLabelValues("total", model), c.WithLabelValues("input", model), c.WithLabelValues("output", model)}
	}
	m, _ := tokenMetricsByModel.LoadOrStore(model, &tokenMetrics{of(tokensChargedTotal), of(tokensReservedTotal), of(tokensReturnedTotal)})
	return m.(*tokenMetrics)
}

// modelLabel is the model label of a request's token and spend metrics:
// the configured entry of its model, never the model the request names
// (any string a client sends would be a series): the price entry that
// priced it (its name as configured: gpt-4o-mini, claude-sonnet-4*, *),
// else the id of the limit of a scope whose value is the model that its
// chain holds as configured (an id, a prefix pool such as gpt-4o*, or *),
// else "".
func modelLabel(price *pricing.Entry, modelEntry string) string {
	if price != nil {
		return price.Name
	}
	return modelEntry
}

// add adds the tokens of each kind that t has.
func (c tokenCounters) add(t limiter.TokenCounts) {
	for i, n := range [...]int64{t.Total, t.Input, t.Output} {
		if n > 0 {
			c[i].Add(float64(n))
		}
	}
}

// storeMetrics counts what the stores tell their Observer.
type storeMetrics struct{}

func init() { limiter.Observe(storeMetrics{}) }

func (storeMetrics) RedisCall(op string, took time.Duration, err error) {
	redisDuration.WithLabelValues(op).Observe(took.Seconds())
	if err != nil {
		redisErrorsTotal.WithLabelValues(op).Inc()
	}
}

func (storeMetrics) RefusedFromCache() { refusalsCachedTotal.Inc() }

func (storeMetrics) SlotsHeld(scope string) limiter.Adder { return slotsHeld.WithLabelValues(scope) }
