package pricing

import (
	"math"
	"math/bits"
)

// Tokens are the tokens of one request, by how they are priced. Each part
// is a count of its own, except that Reasoning and AudioOutput are parts of
// Output and AudioInput a part of Input. A negative count is 0.
type Tokens struct {
	// Input is the input served from no cache, AudioInput included: a
	// caller whose provider reports cached input inside its input count
	// (OpenAI's prompt_tokens, Gemini's promptTokenCount) subtracts it.
	Input int64
	// CacheRead is the input served from a cache.
	CacheRead int64
	// CacheWrite is the input written to a cache.
	CacheWrite int64
	// Output is the whole output, Reasoning and AudioOutput included.
	Output int64
	// Reasoning is the part of Output that is reasoning.
	Reasoning int64
	// AudioInput is the part of Input that is audio.
	AudioInput int64
	// AudioOutput is the part of Output that is audio.
	AudioOutput int64
}

// Cost is what t costs at p, in nano-dollars: the exact sum over the parts
// of tokens × atto-dollars per token, rounded up once to a whole
// nano-dollar (3 tokens at $0.0375 per million are 112.5 nano-dollars:
// 113). The parts and their prices:
//
//	Input − AudioInput           Input
//	AudioInput                   AudioInput, else Input
//	CacheRead                    CacheRead, else Input
//	CacheWrite                   CacheWrite, else Input
//	Output − Reasoning − Audio   Output
//	Reasoning                    Reasoning, else Output
//	AudioOutput                  AudioOutput, else Output
//
// where "else" is the price used when the first is not given. An Input or
// Output price not given prices its tokens at 0 (Priced tells an entry
// with neither). A part larger than what it is a part of counts only up to
// it: Reasoning up to Output, AudioOutput up to what Reasoning leaves of
// it, AudioInput up to Input; so Cost never passes MaxCost(p, Input +
// CacheRead + CacheWrite, Output).
//
// The sum is exact in 128 bits (10^7 tokens at $1000 per million is
// 10^22 atto-dollars, beyond int64); a cost that does not fit an int64 of
// nano-dollars, far beyond any budget, is math.MaxInt64.
func Cost(p Price, t Tokens) int64 {
	in := max(t.Input, 0)
	audioIn := min(max(t.AudioInput, 0), in)
	out := max(t.Output, 0)
	reasoning := min(max(t.Reasoning, 0), out)
	audioOut := min(max(t.AudioOutput, 0), out-reasoning)
	var s sum
	s.add(in-audioIn, p.Input)
	s.add(audioIn, p.AudioInput.Or(p.Input))
	s.add(max(t.CacheRead, 0), p.CacheRead.Or(p.Input))
	s.add(max(t.CacheWrite, 0), p.CacheWrite.Or(p.Input))
	s.add(out-reasoning-audioOut, p.Output)
	s.add(reasoning, p.Reasoning.Or(p.Output))
	s.add(audioOut, p.AudioOutput.Or(p.Output))
	return s.nano()
}

// MaxCost is the largest cost a request may reach, in nano-dollars, for
// its reservation: inputEstimate tokens at the highest price an input
// token may have (input, cache read, cache write, audio input: what of the
// input a cache serves or takes, and what is audio, is known only from the
// response), plus outputReserved tokens at the highest price an output
// token may have (output, reasoning, audio output), rounded up as Cost
// rounds. So Cost of a response whose input, cache reads and cache writes
// are at most inputEstimate and whose output is at most outputReserved is
// at most MaxCost. A negative count is 0.
func MaxCost(p Price, inputEstimate, outputReserved int64) int64 {
	var s sum
	s.add(max(inputEstimate, 0), highest(p.Input, p.CacheRead.Or(p.Input), p.CacheWrite.Or(p.Input), p.AudioInput.Or(p.Input)))
	s.add(max(outputReserved, 0), highest(p.Output, p.Reasoning.Or(p.Output), p.AudioOutput.Or(p.Output)))
	return s.nano()
}

// highest is the highest of rates given; not given if none is.
func highest(rates ...Rate) Rate {
	var h Rate
	for _, r := range rates {
		if r.Given && (!h.Given || r.Atto > h.Atto) {
			h = r
		}
	}
	return h
}

// sum is a non-negative 128-bit sum of atto-dollars, saturating: once it
// passes 2^128 − 1 it stays over.
type sum struct {
	hi, lo uint64
	over   bool
}

// add adds n tokens at r (0 if r is not given); n ≥ 0.
func (s *sum) add(n int64, r Rate) {
	if !r.Given || n <= 0 || r.Atto <= 0 {
		return
	}
	hi, lo := bits.Mul64(uint64(n), uint64(r.Atto))
	var carry uint64
	s.lo, carry = bits.Add64(s.lo, lo, 0)
	s.hi, carry = bits.Add64(s.hi, hi, carry)
	if carry != 0 {
		s.over = true
	}
}

// nano is the sum in nano-dollars, rounded up, or math.MaxInt64 if that
// does not fit an int64.
func (s *sum) nano() int64 {
	const attoPerNano = 1_000_000_000
	if s.over || s.hi >= attoPerNano {
		return math.MaxInt64
	}
	q, r := bits.Div64(s.hi, s.lo, attoPerNano)
	if q >= math.MaxInt64 {
		return math.MaxInt64
	}
	if r != 0 {
		q++
	}
	return int64(q)
}
