package limiter

import (
	"strconv"
	"strings"
)

// kind is what a limit counts: requests, tokens (all of them), input or
// output tokens, in a window; a token bucket's tokens (bucket.go); requests
// in flight (slots.go); dollars spent (budget.go); and, for refusals, a
// request whose reservation alone is over a cap.
type kind uint8

const (
	Requests kind = iota
	Tokens
	InputTokens
	OutputTokens
	Burst
	TooLarge
	Concurrency
	Budget
	// Provider is the provider's own quota, as a limit learned it.
	Provider
)

// String is the kind's name in placeholders, metrics and logs.
func (k kind) String() string {
	switch k {
	case Tokens:
		return "tokens"
	case InputTokens:
		return "input_tokens"
	case OutputTokens:
		return "output_tokens"
	case Burst:
		return "burst"
	case TooLarge:
		return "too_large"
	case Concurrency:
		return "concurrency"
	case Budget:
		return "budget"
	case Provider:
		return "provider"
	}
	return "requests"
}

// errorType is the kind in an OpenAI-style error body, whose types are
// "requests" and "tokens": a bucket and a concurrency cap meter requests;
// and "insufficient_quota", OpenAI's for a spent budget.
func (k kind) ErrorType() string {
	switch k {
	case Requests, Burst, Concurrency, Provider:
		return "requests"
	case Budget:
		return "insufficient_quota"
	}
	return "tokens"
}

// span is how long a window is: a minute or a day.
type span uint8

const (
	Minute span = iota
	Day
)

// Each span's arithmetic counts in a unit: milliseconds for a minute,
// seconds for a day, so that a day's estimate stays exact in Lua's doubles
// (maxCap × 86400 is below 2^53). A period is length units long. (Its keys
// live two of its lengths, as admit.lua sets them: a period is read until
// the end of the following one.)
type spanUnits struct {
	UnitMillis, Length int64
	Name               string // in placeholders, metrics and the live view
	Per                string // in messages: "tokens per min"
	suffix             string // of the caps' names: "tpm"
}

var Spans = [...]spanUnits{
	Minute: {UnitMillis: 1, Length: 60_000, Name: "minute", Per: "min", suffix: "m"},
	Day:    {UnitMillis: 1000, Length: 86_400, Name: "day", Per: "day", suffix: "d"},
}

// minuteMillis is a minute period's length; a day is dayMinutes of them.
const (
	MinuteMillis = 60_000
	dayMinutes   = 1440
)

// maxCap bounds every window cap, so that cap × length stays exact in Lua's
// doubles for a day too: 10^11 requests or tokens.
const MaxCap = 100_000_000_000

// windowKind is one window a limit may cap: a kind of count (requests,
// tokens, input, output) over a span. Its value indexes windowCaps and
// counts.w, minute windows first; admit.lua numbers them alike.
type WindowKind uint8

const (
	RPM WindowKind = iota
	TPM
	ITPM
	OTPM
	RPD
	TPD
	ITPD
	OTPD
	NumWindows
)

func (k WindowKind) Kind() kind { return kind(k % 4) }
func (k WindowKind) Span() span { return span(k / 4) }

// String is the cap's name in the config: rpm, tpm, itpm, otpm, rpd, …
func (k WindowKind) String() string {
	return [...]string{"r", "t", "it", "ot"}[k%4] + "p" + Spans[k.Span()].suffix
}

// windowKindNamed is the window whose cap is called name (rpm, …), or
// numWindows for none.
func WindowKindNamed(name string) WindowKind {
	for k := range NumWindows {
		if k.String() == name {
			return k
		}
	}
	return NumWindows
}

// noun is what the window counts, in messages.
func (k WindowKind) Noun() string {
	return [...]string{"requests", "tokens", "input tokens", "output tokens"}[k%4]
}

// unit is the cap's name in messages: RPM, ITPD.
func (k WindowKind) Unit() string { return strings.ToUpper(k.String()) }

// windowCaps are a limit's window caps, by windowKind; 0 is no cap.
type WindowCaps [NumWindows]int64

// mask has bit k set where windows k is capped.
func (w WindowCaps) Mask() uint8 {
	var m uint8
	for k, c := range w {
		if c > 0 {
			m |= 1 << k
		}
	}
	return m
}

// tokenCounts are tokens of a request: all of them, and the parts input and
// output caps count; and cost, what they cost in nano-dollars, which
// budgets count. A reservation's total is its input and output, and its
// cost the most they may cost; a response's usage may report a total above
// its parts (Anthropic's cache reads count only in the total).
type TokenCounts struct{ Total, Input, Output, Cost int64 }

// of is what a counter of kind k counts of t: tokens, or a budget's cost;
// a request is 1 request.
func (t TokenCounts) Of(k kind) int64 {
	switch k {
	case Tokens:
		return t.Total
	case InputTokens:
		return t.Input
	case OutputTokens:
		return t.Output
	case Budget:
		return t.Cost
	}
	return 1
}

func (t TokenCounts) Minus(u TokenCounts) TokenCounts {
	return TokenCounts{t.Total - u.Total, t.Input - u.Input, t.Output - u.Output, t.Cost - u.Cost}
}

func (t TokenCounts) IsZero() bool { return t == TokenCounts{} }

// window holds the two periods of one counter that an estimate reads: the
// sliding window of the package doc, in exact integer arithmetic, with the
// comparisons admit.lua makes.
type Window struct {
	Cur, Prev int64
}

// moment is a store's clock reading.
type moment struct {
	UnixMillis int64
	Minute     int64 // minute: unix_seconds / 60
	into       int64 // milliseconds into the minute period, [0, minuteMillis)
}

func MomentAt(unixMillis int64) moment {
	b := FloorDiv(unixMillis, MinuteMillis)
	return moment{UnixMillis: unixMillis, Minute: b, into: unixMillis - b*MinuteMillis}
}

// floorDiv rounds down, for pinned test clocks before the epoch.
func FloorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// dayOf is the day period (unix_seconds / 86400) of a minute period.
func DayOf(minute int64) int64 { return FloorDiv(minute, dayMinutes) }

// position is a moment within one span's periods.
type Position struct {
	span       span
	Period     int64 // unix_seconds / 60, or / 86400
	into       int64 // units into the period
	intoMillis int64 // milliseconds into the period
}

func (m moment) In(s span) Position {
	if s == Minute {
		return Position{span: Minute, Period: m.Minute, into: m.into, intoMillis: m.into}
	}
	b := FloorDiv(m.UnixMillis, 86_400_000)
	intoMillis := m.UnixMillis - b*86_400_000
	return Position{span: Day, Period: b, into: intoMillis / 1000, intoMillis: intoMillis}
}

// weighted is the estimate × length at offset into.
func (w Window) weighted(into, length int64) int64 {
	return w.Cur*length + w.Prev*(length-into)
}

// estimate is the trailing window's estimate at p.
func (w Window) Estimate(p Position) float64 {
	length := Spans[p.span].Length
	return float64(w.weighted(p.into, length)) / float64(length)
}

// fits reports whether an admission that adds size to the counter fits at
// p: while estimate + size ≤ capacity. A request has size 1; a token
// reservation its tokens. Size 0 is tokens not reserved, which exist only
// once a response reports them: they fit while estimate < capacity.
func fits(w Window, capacity, size int64, p Position) bool {
	return fitsBeside(w, capacity, size, 0, p)
}

// fitsBeside is fits with held (in units times length) taken from the
// window's room: what floors hold of it for other classes (floors.go).
func fitsBeside(w Window, capacity, size, held int64, p Position) bool {
	length := Spans[p.span].Length
	if size == 0 {
		return w.weighted(p.into, length)+held < capacity*length
	}
	return w.weighted(p.into, length)+held+size*length <= capacity*length
}

// releaseIn is how many milliseconds after p a counter that refuses an
// admission of size would admit it, absent further traffic: the earliest
// whole unit (millisecond or second) at which fits holds. While the current
// period alone fits, what refuses is the previous period's weight, which
// falls during this period; otherwise the current period must first become
// the previous one. size is at most capacity.
func releaseIn(w Window, capacity, size int64, p Position) int64 {
	u := Spans[p.span]
	// room is how much the weighted estimate may reach, strict or not.
	room, strict := (capacity-size)*u.Length, size == 0
	var at int64 // units after the start of the current period
	if w.Cur*u.Length < room || !strict && w.Cur*u.Length == room {
		// Admits at the earliest t in this period with prev × (length − t) within room − cur.
		at = max(u.Length-maxWeight(room-w.Cur*u.Length, w.Prev, u.Length, strict), p.into)
	} else {
		// In the next period cur is the previous one and the new current is empty.
		at = 2*u.Length - maxWeight(room, w.Cur, u.Length, strict)
	}
	return max(at*u.UnitMillis-p.intoMillis, 0)
}

// maxWeight is the largest integer m ≤ length with count × m ≤ room (or
// < room when strict).
func maxWeight(room, count, length int64, strict bool) int64 {
	if count <= 0 {
		return length
	}
	q := room / count // room ≥ 0 and count > 0 here
	if strict && q*count == room {
		q--
	}
	return min(q, length)
}

// remaining is what is left of capacity after the estimate at p, rounded
// down and never negative. For requests the caller counts the request
// itself in w.
func Remaining(w Window, capacity int64, p Position) int64 {
	length := Spans[p.span].Length
	left := capacity*length - w.weighted(p.into, length)
	if left <= 0 {
		return 0
	}
	return left / length
}

// resetIn is how many milliseconds after p the estimate is back to zero
// absent further traffic.
func ResetIn(w Window, p Position) int64 {
	u := Spans[p.span]
	switch {
	case w.Cur > 0:
		return 2*u.Length*u.UnitMillis - p.intoMillis
	case w.Prev > 0:
		return u.Length*u.UnitMillis - p.intoMillis
	}
	return 0
}

// writeInt writes n in base to text.
func writeInt(text *strings.Builder, n int64, base int) {
	var digits [64]byte
	text.Write(strconv.AppendInt(digits[:0], n, base))
}

// AtLeast is t with each count, and its cost, at least r's, and its total
// at least its input and output together: the charge of a response whose
// reservation r bounds what it may have used better than the report t it
// was cut before finishing.
func (t TokenCounts) AtLeast(r TokenCounts) TokenCounts {
	in, out := max(t.Input, r.Input), max(t.Output, r.Output)
	return TokenCounts{Total: max(t.Total, r.Total, in+out), Input: in, Output: out, Cost: max(t.Cost, r.Cost)}
}
