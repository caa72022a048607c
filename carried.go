package ratelimit

import (
	"cmp"
	"sync"
)

// carriedCaps remembers, for each scope id whose limit takes caps per
// request, the caps the last request of it carried, as this process read
// them, so that the live view can show them beside the fallback. Ids come
// and go with tenants: two generations of at most carriedPerGeneration ids
// bound the memory, the older dropped when the newer fills, so that an id
// still sending keeps its entry.
type carriedCaps struct {
	mu           sync.Mutex
	newer, older map[carriedKey][]carriedCap
}

// carriedCap is a cap per request as a request carried it: its value, or
// "" where the request took the fallback.
type carriedCap struct {
	cap   perRequestCap
	value string
}

// described is the caps as the live view shows them: by name, the value
// the request carried ("120"), or the fallback it took ("60 (else)").
func described(caps []carriedCap) map[string]string {
	if caps == nil {
		return nil
	}
	m := make(map[string]string, len(caps))
	for _, c := range caps {
		m[c.cap.kind.name] = cmp.Or(c.value, c.cap.fallback+" (else)")
	}
	return m
}

// carriedKey is a limit's scope name and id as stored.
type carriedKey struct{ scope, id string }

// carriedPerGeneration bounds each generation of carriedCaps.
const carriedPerGeneration = 10_000

// lastCarried is the process's record of the caps requests carried.
var lastCarried carriedCaps

// note records caps as the last that a request of id in scope carried.
func (c *carriedCaps) note(scope, id string, caps []carriedCap) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.newer) >= carriedPerGeneration {
		c.older, c.newer = c.newer, nil
	}
	if c.newer == nil {
		c.newer = make(map[carriedKey][]carriedCap)
	}
	c.newer[carriedKey{scope, id}] = caps
}

// of is the caps the last request of id in scope carried; nil if none is
// remembered.
func (c *carriedCaps) of(scope, id string) []carriedCap {
	c.mu.Lock()
	defer c.mu.Unlock()
	if caps, ok := c.newer[carriedKey{scope, id}]; ok {
		return caps
	}
	return c.older[carriedKey{scope, id}]
}
