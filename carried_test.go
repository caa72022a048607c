package ratelimit

import (
	"strconv"
	"testing"
)

// The record of the caps requests carried is bounded however many ids
// come: it holds at most two generations of carriedPerGeneration ids, and
// an id that keeps sending keeps its entry.
func TestTheCapsRequestsCarriedAreRememberedForBoundedIDs(t *testing.T) {
	var c carriedCaps
	rpm := perRequestCap{kind: capKinds[0], fallback: "60"}
	c.note("key", "steady", []carriedCap{{rpm, "120"}})
	for i := range 5 * carriedPerGeneration {
		c.note("key", strconv.Itoa(i), []carriedCap{{rpm, ""}})
		if i%(carriedPerGeneration/2) == 0 {
			c.note("key", "steady", []carriedCap{{rpm, "120"}})
		}
	}
	if n := len(c.newer) + len(c.older); n > 2*carriedPerGeneration {
		t.Fatalf("%d ids remembered, want at most %d", n, 2*carriedPerGeneration)
	}
	if got := described(c.of("key", "steady")); got[capKinds[0].name] != "120" {
		t.Errorf("the steady id's caps %v, want its 120", got)
	}
	if got := described(c.of("key", strconv.Itoa(5*carriedPerGeneration-1))); got[capKinds[0].name] != "60 (else)" {
		t.Errorf("the last id's caps %v, want the fallback it took, 60 (else)", got)
	}
	if got := c.of("key", "0"); got != nil {
		t.Errorf("the first id, long gone, is still remembered: %v", got)
	}
}
