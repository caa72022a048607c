// Package pricing says what an LLM request costs, in whole nano-dollars,
// from the tokens it used and a table of prices per model, so that spend
// budgets can be reserved at admission and settled from the usage the
// response reports. Money is integers throughout, never floats.
package pricing
