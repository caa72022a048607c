// Package ratelimit is the Caddy HTTP handler rolter_ratelimit
// (http.handlers.rolter_ratelimit) and its live view on the admin API
// (admin.api.rolter_ratelimit). It caps every scope of a request (API key,
// project, team, org, model, …) to requests and tokens (all of them, input
// or output) per minute and per day, to token buckets, and to requests in
// flight, with counters in Redis that every gateway replica shares, or in
// this process when no Redis is configured. The Caddyfile syntax is in
// [Handler.UnmarshalCaddyfile]; the JSON config is [Handler].
//
// # The chain
//
// A request's scopes, resolved from placeholders, form its chain, innermost
// first (key, project, team, org). Each scope id has the limits its scope
// gives it (its own, or the scope's "*" default). A scope whose value is
// empty is not in the chain, unless the scope is required: the request is
// then refused with 403. Counters are named by scope and id only, so every
// handler and every replica using the same store shares them.
//
// # The sliding window
//
// A limit caps up to eight windows (windowKind): requests, tokens, input
// and output tokens, per minute and per day. Each window's counter counts
// by periods of the store's clock: minutes (unix seconds / 60) or days (unix
// seconds / 86400). ("Period" is this time division; "bucket" is only ever
// a token bucket.) The estimate of the trailing minute or day weights the
// previous period by the part of it still inside the window:
//
//	estimate = current + previous × (length − time into the current period) / length
//
// A minute counts in milliseconds and a day in seconds, and every
// comparison is made on estimate × length, an integer: one more request fits
// while estimate + 1 ≤ its cap, tokens fit while estimate < theirs.
// admit.lua makes the same comparisons with Lua's doubles, exact below 2^53
// (which bounds every cap to 10^11), so both stores decide identically, and
// a refusal's Retry-After is the exact millisecond (a day's: second) at
// which the store would admit absent further traffic. The estimate can be off at period edges; the
// guarantees below do not depend on it.
//
// Token buckets (Spring Cloud Gateway's contract) hold a deficit in
// millionths of a token as of a moment, refilled from elapsed time at the
// configured rate; their arithmetic is exact in the same way (see
// tokenBucket).
//
// # One atomic admission
//
// A request is admitted only if every limit of its chain fits, and then
// charged one request on every request window, its cost on every token
// bucket and a slot of every cap on requests in flight; a refused request
// is charged nothing. On Redis the whole decision is one run of
// admit.lua, which reads every counter, decides and increments before Redis
// serves any other command: admission is exact under any concurrency and
// across any number of replicas. Concurrent admissions of one process share
// calls of the script, each decided in arrival order exactly as if it were
// sent alone (scriptBatch). The in-process store makes the same decisions
// under per-counter locks taken in one global order.
//
// On Redis Cluster every key of a chain carries the hash tag of the chain's
// root (its outermost scope with a value), so that the script runs on one
// shard.
//
// # Failures, and the one replay
//
// On a single node and Sentinel, go-redis never retries (MaxRetries -1): an
// admission whose connection was found dead is replayed by the module, as
// below. On Cluster the client itself follows one MOVED or ASK, or resends
// once after a dead connection, a timeout, TRYAGAIN or CLUSTERDOWN
// (MaxRedirects 1), which stands in for that replay. An admission ends within
// the timeout of its start, whatever it waits for: a coalesced call in
// flight, its own call, a connection. Its caller then gives up even on a
// call in flight, which may still decide and charge it: that errs towards
// stricter, as a lost reply does. On a single node, an admission whose
// connection was found dead is replayed once, on a fresh connection, within
// the same timeout:
// usually the first attempt never reached Redis, and if it did, the replay
// errs by one request towards stricter. Token charges are never replayed: a
// double charge would outlive the failure, nor are frees of slots. Any other
// failure applies on_redis_error (fail open by default, or 503).
//
// # Requests in flight
//
// A slot of a concurrency cap is taken by the admission and freed by the
// handler when the request ends, however it ends. Each store is a holder
// whose slots live under a lease that it renews, every third of the lease,
// by writing the count its ledger holds: a holder that dies frees its slots
// within a lease, and a free that was lost, or slots a restarted Redis
// lost, are mended by the next renewal (slots.go). A limit taken under two
// leases (two handlers' slot_lease, or a reload's) is held under the
// longer.
//
// # Tokens are reserved, then settled
//
// A request whose chain caps tokens reserves, in the same atomic step as the
// rest of its admission, what it may cost: an estimate of its input and the
// output cap it names, read from its body (internal/tokenest), or a default.
// A token window fits while its estimate plus its part of the reservation
// (all of it for tpm and tpd, the input for itpm and itpd, the output for
// otpm and otpd) is within it, so concurrent requests hold it however many
// are in flight. The response body is teed, unchanged, into the usage
// extractor (internal/usage), and the usage reported replaces the
// reservation, each kind in its windows, in the minute and day it was made
// in; where a reset (reset.go) took the reservation since, its usage is
// added whole.
// With reserve_tokens off, and for realtime sessions, tokens are reactive:
// charged once reported, so that requests admitted together before a window
// fills can overshoot it by their own usage.
//
// # Refusals cost Redis nothing
//
// A limit Redis refused on requests (per minute or per day) or a token
// bucket is refused by the
// store's refusal cache, without a call, until the moment Redis would admit
// it again (refusalCache). It is exact: traffic only makes those counters
// grow, and the gateway bounds Redis's clock from its own monotonic clock,
// so the cache never refuses what Redis would admit. Tokens refusals are
// left to Redis: a settlement can give tokens back.
//
// # What the client and the upstream choose
//
// A scope id must be what the upstream reads: a scope's header sent twice,
// or two credentials for the api_key placeholder, is refused before any
// store call (credential.go). A request's body, whose size the client
// chooses, is read only when the admission needs it, after every refusal
// that needs no body, in memory that grows with the bytes that arrive and
// is capped per process (body.go). A response's reported usage, which the
// upstream chooses, is charged at most a ceiling (usageCeiling): its output
// at most the request's own output cap times its choices, or without one
// far above any real response, so that one absurd report cannot lock a
// shared pool.
//
// # Secrets
//
// An id is written (in Redis keys, logs, metrics, the admin API's answers
// and error bodies) only as "#" and 32 hex digits of its SHA-256, unless its
// scope is declared readable (keyID).
//
// # Reloads
//
// Stores live in process-wide pools keyed by their settings: a reload that
// keeps them keeps the counters and the Redis connections, and a response or
// realtime session admitted under an old config still charges its tokens
// after the config is unloaded (lifetime).
package ratelimit
