// Package pricing says what an LLM request costs, from the tokens it used
// and a table of prices per model, so that a gateway can hold spend budgets
// (dollars per scope per day and month): reserve MaxCost at admission,
// settle at Cost of the usage the response reports. It uses none of the
// handler's types.
//
// # Money is integers
//
// No price or cost ever goes through a float. A price is a Rate, an int64
// of atto-dollars (1e-18 USD) per token, parsed exactly from its decimal
// text: "2.5e-06" USD per token and "2.50" USD per million tokens are both
// 2_500_000_000_000. A price finer than an atto-dollar per token (a float's
// shortest text in LiteLLM's file: 6.571428571428571e-06) is rounded up to
// the next atto-dollar, less than 1e-18 USD per token more; negative, NaN,
// Inf, beyond an int64 or not a number is an error. A budget is exact to
// the nano-dollar, or an error.
//
// A cost or a budget is an int64 of nano-dollars (1e-9 USD, NanoPerUSD to
// the dollar). Cost and MaxCost sum tokens × atto-dollars exactly in 128
// bits and round up once per request, to the next whole nano-dollar: a
// request never costs less than its exact price, and by less than a
// nano-dollar more. MaxBudget ($1,000,000) is the largest budget, so that
// counters in Redis stay exact in Lua's doubles (below 2^53).
//
// # Prices
//
// A Price gives, per kind of token, a Rate that is given or not (not given
// is not 0): input (uncached), output, cache read, cache write, reasoning,
// audio input and audio output. Cost says which tokens each prices and
// what stands for a price not given. Prices come from two sources, merged
// by NewTable into a Table:
//
//   - inline entries (Inline): a model name, a prefix ending in '*' or "*",
//     with input, output and optional cache read and write prices in USD
//     per million tokens;
//   - a file in the format of LiteLLM's model_prices_and_context_window.json
//     (ParseLiteLLM, LoadLiteLLM), read for its per-token prices only.
//
// An inline entry beats a file entry of the same name. Table.Lookup finds a
// model's entry by exact name, else by the longest prefix, else "*",
// comparing names byte for byte; the Entry it gives carries the name as
// configured, for metric labels.
package pricing
