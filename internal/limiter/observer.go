package limiter

import "time"

// Observer is told what the stores do, so that the module's metrics can
// count it without the counting core knowing them.
type Observer interface {
	// RedisCall is one call to Redis, of the operation op: how long it
	// took, and its failure.
	RedisCall(op string, took time.Duration, err error)
	// RefusedFromCache is a refusal that the refusal cache answered without
	// a call to Redis.
	RefusedFromCache()
	// SlotsHeld is the count of the slots this process holds under caps of
	// the scope; the stores add to it what they take and free.
	SlotsHeld(scope string) Adder
}

// Adder is a count that is added to, as a Prometheus gauge is.
type Adder interface{ Add(float64) }

// watch is the stores' Observer, set once by Observe.
var watch Observer = unobserved{}

// Observe makes o the stores' Observer. It is meant to be called once,
// from an init function, before any store exists.
func Observe(o Observer) { watch = o }

// unobserved is the Observer of a process that counts nothing.
type unobserved struct{}

func (unobserved) RedisCall(string, time.Duration, error) {}
func (unobserved) RefusedFromCache()                      {}
func (unobserved) SlotsHeld(string) Adder                 { return noCount{} }

type noCount struct{}

func (noCount) Add(float64) {}
