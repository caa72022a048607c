package ratelimit

import (
	"testing"

	"github.com/rolter/caddy-ratelimit/internal/limiter"
)

// Each cap a limit line may give caps the one part of a limit its kind
// names, which the refusal, the admin API's reset and the load log of a
// cap per request read it by; and leaving that part out leaves nothing.
func TestEveryCapKindCapsThePartItNames(t *testing.T) {
	for _, k := range capKinds {
		t.Run(k.name, func(t *testing.T) {
			l := LimitConfig{Scope: "key", ID: "*"}
			given := []string{k.name}
			if k.part == limiter.BucketPart { // a bucket's caps come together
				given = append(given, "rate", "burst")
			}
			for _, name := range given {
				c, _ := capKindNamed(name)
				if err := c.set(&l, c.nominal); err != nil {
					t.Fatalf("%s %s: %v", name, c.nominal, err)
				}
			}
			if !k.given(&l) {
				t.Fatalf("the line does not give %s", k.name)
			}
			caps, err := l.caps()
			if err != nil {
				t.Fatal(err)
			}
			var parts []limiter.Part
			for p := range caps.Parts {
				parts = append(parts, p)
			}
			if len(parts) != 1 || parts[0] != k.part || !caps.Has(k.part) {
				t.Fatalf("caps of a line giving %v have parts %v, want only %v", given, parts, k.part)
			}
			caps.Without(k.part)
			if caps.Has(k.part) || caps.Windows != (limiter.WindowCaps{}) || caps.Capped != 0 {
				t.Fatalf("without %v the caps still have it: %+v", k.part, caps)
			}
		})
	}
}
