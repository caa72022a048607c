package ratelimit

import (
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// warnLimiter logs store failures at most once per interval, with the number
// of failures it did not log, so that an outage is visible but never one log
// line per request. A mutex rather than two atomics: the count a warning
// carries must be exactly the failures suppressed before it, which two
// separate atomic operations cannot guarantee against a failure counted
// between them; and it is taken only on the failure path.
type warnLimiter struct {
	mu         sync.Mutex
	next       time.Time // nothing is logged before it
	suppressed int64
}

const warnInterval = 10 * time.Second

func (l *warnLimiter) log(logger *zap.Logger, msg string, fields ...zap.Field) {
	l.logAt(logger, zap.WarnLevel, msg, fields...)
}

// logAt logs at level, at most once per interval, as log does.
func (l *warnLimiter) logAt(logger *zap.Logger, level zapcore.Level, msg string, fields ...zap.Field) {
	now := time.Now()
	l.mu.Lock()
	if now.Before(l.next) {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.next = now.Add(warnInterval)
	suppressed := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	logger.Log(level, msg, append(fields, zap.Int64("suppressed_since_last", suppressed))...)
}
