package ratelimit

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"go.uber.org/zap"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
	"github.com/rolter/caddy-ratelimit/internal/pricing"
)

// ThresholdEvent is the name of the Caddy event a crossing of a limit's
// notify fraction emits (through Caddy's events app, which any event
// handler module can subscribe to).
const ThresholdEvent = "rolter_ratelimit.threshold"

// fractionRE is a notify fraction as JSON writes it: from 0 to 1, of
// whole percents (0.8, 0.95, 1), trailing zeros allowed.
var fractionRE = regexp.MustCompile(`^(0|1)(?:\.([0-9]+))?$`)

// notifyPercents are the limit's notify fractions in whole percents, from
// low to high; an error says what is wrong with them.
func (l LimitConfig) notifyPercents() ([limiter.MaxNotify]uint8, error) {
	var out [limiter.MaxNotify]uint8
	if len(l.Notify) > limiter.MaxNotify {
		return out, fmt.Errorf("limit for scope %q id %q: %d notify fractions, at most %d", l.Scope, l.ID, len(l.Notify), limiter.MaxNotify)
	}
	percents := make([]int, 0, len(l.Notify))
	for _, f := range l.Notify {
		p, ok := percentOf(string(f))
		if !ok {
			return out, fmt.Errorf("limit for scope %q id %q: notify %s: a fraction is a whole percent above 0 and at most 1, such as 0.8 (80%%)", l.Scope, l.ID, f)
		}
		if slices.Contains(percents, p) {
			return out, fmt.Errorf("limit for scope %q id %q: notify %d%% is given twice", l.Scope, l.ID, p)
		}
		percents = append(percents, p)
	}
	slices.Sort(percents)
	for i, p := range percents {
		out[i] = uint8(p)
	}
	return out, nil
}

// percentOf is the whole percent a notify fraction is.
func percentOf(fraction string) (int, bool) {
	m := fractionRE.FindStringSubmatch(fraction)
	if m == nil {
		return 0, false
	}
	digits := strings.TrimRight(m[2], "0")
	if len(digits) > 2 {
		return 0, false
	}
	frac, _ := strconv.Atoi((digits + "00")[:2])
	p := 100*int(m[1][0]-'0') + frac
	return p, p >= 1 && p <= 100
}

// parseNotify reads the percents after a limit line's notify: notify 80%
// 95% 100%, up to the next word that is not one.
func parseNotify(d *caddyfile.Dispenser) ([]json.Number, error) {
	var fractions []json.Number
	for d.NextArg() {
		digits, ok := strings.CutSuffix(d.Val(), "%")
		if !ok {
			d.Prev()
			break
		}
		n, err := strconv.Atoi(digits)
		if err != nil || n < 1 || n > 100 {
			return nil, d.Errf("notify %s: a fraction is a whole percent from 1%% to 100%%, such as 80%%", d.Val())
		}
		fractions = append(fractions, json.Number(strconv.FormatFloat(float64(n)/100, 'f', -1, 64)))
	}
	if len(fractions) == 0 {
		return nil, d.Err("notify needs the percents of each cap it reports the crossing of: notify 80% 95% 100%")
	}
	return fractions, nil
}

// notifies reports whether a limit of the handler notifies.
func (h *Handler) notifies() bool {
	return slices.ContainsFunc(h.Limits, func(l LimitConfig) bool { return len(l.Notify) > 0 })
}

// crossingsQueued is how many crossings' events may wait for the events
// app's handlers, which one goroutine per handler runs in turn: beyond,
// an event is dropped (its log line and count stay), so that a slow
// subscriber and ids made up to cross fractions hold no more than this.
const crossingsQueued = 1024

// provisionEvents gets Caddy's events app, through which crossings are
// emitted, when a limit notifies, and starts the goroutine that emits
// them until the config is unloaded.
func (h *Handler) provisionEvents(ctx caddy.Context) error {
	if !h.notifies() {
		return nil
	}
	app, err := ctx.App("events")
	if err != nil {
		return fmt.Errorf("getting the events app: %v", err)
	}
	events, queue := app.(*caddyevents.App), make(chan map[string]any, crossingsQueued)
	go func() {
		for {
			select {
			case data := <-queue:
				events.Emit(ctx, ThresholdEvent, data)
			case <-ctx.Done():
				return
			}
		}
	}()
	h.crossingEvents = queue
	return nil
}

// admit is the store's admission of chain with reserve, its crossings
// reported.
func (h *Handler) admit(req *request, chain []limiter.Limit, reserve limiter.TokenCounts) (limiter.Admission, error) {
	a, err := h.store.Admit(req.Context(), chain, reserve)
	if err == nil && h.crossingEvents != nil {
		h.reportCrossings(chain, a)
	}
	return a, err
}

// reportCrossings reports the crossings the admission a of chain was the
// first to reach: each as a Caddy event, a line of the log at info level
// and a count of thresholds_crossed_total. The event is queued for the
// goroutine that emits them: a subscriber's work never delays the request.
func (h *Handler) reportCrossings(chain []limiter.Limit, a limiter.Admission) {
	for _, c := range limiter.Crossings(chain, a.Decision) {
		l := chain[c.Limit]
		data := crossingData(l, c)
		thresholdsCrossedTotal.WithLabelValues(l.Scope, c.Part.String(), strconv.Itoa(int(c.Percent))).Inc()
		fields := make([]zap.Field, 0, len(data))
		for _, k := range slices.Sorted(maps.Keys(data)) {
			fields = append(fields, zap.Any(k, data[k]))
		}
		h.logger.Info("threshold crossed", fields...)
		select {
		case h.crossingEvents <- data:
		default:
			h.eventsWarn.log(h.logger, "threshold events are dropped: the events app's handlers fall behind (their log lines and counts stay)")
		}
	}
}

// crossingData is what a crossing reports: the scope, the id as stored
// (digested unless the scope is readable), the cap, the fraction, the
// period's first moment (for a window or a budget), the cap's level and
// its cap in its unit.
func crossingData(l limiter.Limit, c limiter.Crossing) map[string]any {
	value, limit, unit := crossingValue(c)
	data := map[string]any{
		"scope":    l.Scope,
		"id":       l.ID,
		"cap":      c.Part.String(),
		"percent":  int(c.Percent),
		"fraction": float64(c.Percent) / 100,
		"value":    value,
		"limit":    limit,
		"unit":     unit,
	}
	if c.Period != 0 {
		data["period"] = time.UnixMilli(c.Period).UTC().Format(time.RFC3339)
	}
	return data
}

// crossingValue is a crossing's level and cap in the cap's own unit: a
// window's estimate (rounded down) and cap, the bucket's tokens taken and
// burst, the requests in flight and their cap, a budget's dollars held
// (spent and reserved) and cap, as decimals.
func crossingValue(c limiter.Crossing) (value, limit any, unit string) {
	if k, ok := c.Part.Window(); ok {
		length := limiter.Spans[k.Span()].Length
		return c.Level / length, c.Whole / length, strings.ReplaceAll(k.Noun(), " ", "_")
	}
	switch c.Part {
	case limiter.BucketPart:
		return c.Level / limiter.MicroTokens, c.Whole / limiter.MicroTokens, "tokens"
	case limiter.SlotsPart:
		return c.Level, c.Whole, "requests_in_flight"
	}
	return pricing.FormatUSD(c.Level), pricing.FormatUSD(c.Whole), "usd"
}
