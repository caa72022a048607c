// Package ratelimit is the Caddy HTTP handler rolter_ratelimit
// (http.handlers.rolter_ratelimit) and its admin API
// (admin.api.rolter_ratelimit). It caps every scope of a request (API key,
// project, team, org, model, …) to requests and tokens (all of them, input
// or output) per minute and per day, to token buckets, to requests in
// flight, and to US dollars spent per calendar day and month, with counters
// in Redis that every gateway replica shares, or in this process when no
// Redis is configured. Caps may come with each request, limits may be tried
// as shadow limits, and a refused request may wait for its turn instead.
// The Caddyfile syntax is in [Handler.UnmarshalCaddyfile]; the JSON config
// is [Handler]; the admin API is [AdminAPI] (its live view) and [ResetPath].
// The manual, for operators and clients, is the docs/ folder of the
// repository; what follows is the design: how each guarantee is kept.
//
// # The chain
//
// A request's scopes, resolved from placeholders, form its chain, innermost
// first (key, project, team, org). Each scope id has the limits its scope
// gives it (its own, the longest prefix that covers it, or the scope's "*"
// default). A scope whose value is empty is not in the chain, unless the
// scope is required: the request is then refused with 403. Counters are
// named by scope and id only, so every handler and every replica using the
// same store shares them.
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
// which the store would admit absent further traffic. The estimate can be
// off at period edges; the guarantees below do not depend on it.
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
// bucket, its reservation on every token window and budget, and a slot of
// every cap on requests in flight; a refused request is charged nothing. On
// Redis the whole decision is one run of admit.lua, which reads every
// counter, decides and increments before Redis serves any other command:
// admission is exact under any concurrency and across any number of
// replicas. Concurrent admissions of one process share calls of the script,
// each decided in arrival order exactly as if it were sent alone
// (scriptBatch). The in-process store makes the same decisions under
// per-counter locks taken in one global order.
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
// (MaxRedirects 1), which stands in for that replay. An admission ends
// within the timeout of its start, whatever it waits for: a coalesced call
// in flight, its own call, a connection. Its caller then gives up even on a
// call in flight, which may still decide and charge it: that errs towards
// stricter, as a lost reply does. On a single node, an admission whose
// connection was found dead is replayed once, on a fresh connection, within
// the same timeout: usually the first attempt never reached Redis, and if
// it did, the replay errs by one request towards stricter. Token charges
// are never replayed: a double charge would outlive the failure, nor are
// frees of slots. Any other failure applies on_redis_error (fail open by
// default, or 503); a request under a budget is refused either way, since
// its spend could not be counted.
//
// # Requests in flight
//
// A limit may cap how many requests of its scope id are in flight at once
// (concurrent). An admitted request takes one slot of every such limit of
// its chain, in the same atomic step as its windows and buckets, and frees
// them when it ends, however it ends: the handler frees them in a deferred
// call (a complete response, an error, a client or an upstream gone
// mid-stream, reverse_proxy's panic, handle_errors). A WebSocket session
// holds its slots for its whole life.
//
// Slots are counted per holder: each store (a gateway process's Redis
// client, or the in-process store) holds some of a limit's slots, written
// with the moment its lease on them ends. A holder that stops renewing (a
// process killed, a crash, a lost network) loses its slots once that lease
// has passed: a limit counts only its holders' slots whose lease has not.
// Each store renews everything it holds, in steps of a call each
// (renewalStep limits; on Redis Cluster, a pipeline of a call per chain
// root), writing the count it knows it holds: that count is the truth, so a
// free that never reached the store, or a Redis that restarted empty, is
// mended by the next renewal instead of leaking or being counted twice. No
// call that takes or frees slots is in flight while a step is
// (RedisStore.slotCalls), so its counts are exact. Lease times are the
// store's clock (Redis TIME), as every window's.
//
// One limit may be taken under several leases: two handlers, or a config
// and its reload, that cap the same scope id alike but with other
// slot_lease values. A holding's lease is then the longest its requests
// asked for: an admission never moves the end of a live holding closer,
// and the renewal writes the longest lease of the slots still held (a lease
// cut to a shorter one, renewed only every third of the longer, would let
// the slots lapse under requests still running). The renewal comes every
// third of the shortest of those leases, over every limit held, and at once
// when a slot is taken under a shorter lease than the one it waits out.
//
// # Tokens are reserved, then settled
//
// A request whose chain caps tokens reserves, in the same atomic step as
// the rest of its admission, what it may cost: an estimate of its input and
// the output cap it names, read from its body (internal/tokenest), or
// reserve_output. A token window fits while its estimate plus its part of
// the reservation (all of it for tpm and tpd, the input for itpm and itpd,
// the output for otpm and otpd) is within it, so concurrent requests hold
// it however many are in flight, as the providers count tokens up front. A
// request whose reservation alone is over a cap is refused at once, as too
// large. The response body is teed, unchanged, into the usage extractor
// (internal/usage), and the usage reported replaces the reservation, each
// kind in its windows, in the minute and day it was made in (meterResponse);
// where a reset (reset.go) took the reservation since, its usage is added
// whole. A response cut short before its final report is charged at least
// its reservation; only a request the provider cannot have processed (an
// upstream error status, an upstream never reached) gives it back. With
// reserve_tokens off, and for realtime sessions, tokens are reactive:
// charged once reported, so that requests admitted together before a
// window fills can overshoot it by their own usage.
//
// # Spend budgets
//
// A limit may cap what its scope id spends per calendar day and per
// calendar month (budget_day, budget_month), in US dollars, at the prices of
// the models its requests ask for (internal/pricing). Money is an int64 of
// nano-dollars throughout, never a float.
//
// Each budget's period keeps two counters: what is spent (the costs of the
// responses settled in it) and what is reserved (the largest costs of the
// requests admitted in it and not yet settled). A request is admitted only
// if, for every budget of its chain, spent + reserved + its largest cost is
// within the budget, in the same atomic step as everything else it is
// admitted on; it then adds its largest cost to what is reserved. When its
// response ends, the reservation is taken back from what is reserved and
// the real cost added to what is spent, in the period the reservation was
// made in, even if it has just ended (a response that runs past midnight is
// spent in the day it was admitted in), never taking a counter below zero.
// Periods before the previous one are left alone: no response outlives
// them. A settlement that fails is not retried (money is never replayed):
// its reservation then stays counted until its period ends, so spend is
// over-counted rather than lost. A request that reserves nothing
// (reserve_tokens off, a realtime session) is admitted while spent +
// reserved is below the budget, and its cost is charged as its usage is
// reported. A request whose store fails is refused whatever on_redis_error
// says, and one whose model has no price is refused before any store call:
// it is never let through at $0.
//
// A period is a calendar day or month in the time zone of
// budget_timezone, decided by the store's clock: the keys a call names are
// those of the gateway's minute, and admit.lua runs nothing in another
// minute than its own (window.go). Every time zone starts its days on a
// whole minute, so the minute decides the day and the month too. A
// period's counters are named by its start, "<prefix>spent:day:<unix
// seconds>" and "<prefix>reserved:day:<unix seconds>" (month for a month),
// and live a few days past their period for the settlements of long
// responses.
//
// # Caps per request
//
// A cap's value may be a placeholder, or hold one, resolved for each
// request (a plan's rpm in a header that forward_auth copies from an auth
// service's answer): the limit's counters are its scope id's as ever, and
// the cap that applies to them is the request's, so that a plan raised
// takes effect at the next request, with what was used still counted. A
// value is checked per request as the config's values are at load, and
// one whose placeholders are all known at load ({env.*}) is resolved then.
// One that resolves empty, or is not valid, never means unlimited: the
// limit's fallback (else) applies, and without one the request is refused
// with 503 before any store call (a shadow limit, which refuses nothing, is
// left out of that request instead).
//
// # Shadow limits
//
// A limit marked shadow (or every limit, with shadow on) is tried before it
// refuses anyone: it is read, decided and charged in the same atomic step
// as the enforced limits of the request's chain, but a request it would
// refuse passes. It is charged all the same, as Envoy's shadow mode
// charges, so that its counters show what the traffic really is: the
// counters it would enforce if it were. Its slots and reservations are its
// own keys', so it cannot refuse an enforced limit; it never delays a
// request, and a request too large for it is not refused. Caps that come
// with the request keep it a shadow (lineSettings), and a request that does
// not give one validly passes with the limit left out of its chain, marked
// as the limit, enforced, would refuse it (unreadable). The rate-limit
// headers describe the enforced limits only.
//
// A request a shadow limit would have refused has the outcome
// shadow_refused, with the would-be refusal's scope, kind, window and wait
// in the refusal placeholders; it counts in refusals_total with shadow
// "true", is logged at info (rate-limited, naming the scope and the id as
// stored), and with shadow_header on carries X-Ratelimit-Shadow.
//
// # Waiting instead of refusing
//
// With wait set, a request refused by a window or a bucket whose exact
// wait (the refusal's, from the store's own arithmetic) is within what is
// left of wait is held until then and admitted again through the normal
// atomic admission; refused again (others took the room meanwhile), it
// waits again while the total stays within wait, and otherwise gets the
// refusal then true. A refusal by a budget, by a cap on requests in flight
// (no wait is known), too large, a missing scope or a store failure never
// waits. A waiting request holds nothing in the store: no slot, reservation
// or spend. In one process, waiters stand in line per refusing limit, and
// only the head of a line sleeps until its release and tries: waking costs
// one store call per release, not one per waiter. The requests waiting in
// one process are capped (max_waiting); past the cap a request is refused
// at once. One whose client goes away ends its wait, charged nothing: its
// body is read whole before it waits, or it does not wait (heldWhole), and
// it takes a waiting place only once its body is read.
//
// # Realtime sessions
//
// A WebSocket handshake (a GET upgrading to websocket) is a session,
// admitted once, at its handshake, like a request, after a process-wide
// cap on open sessions (realtime max_connections) that never takes an rpm
// slot. Its responses are charged as their usage arrives, read from a copy
// of the frames the upstream sends (realtime_tap.go), every flush interval
// and when it ends; a full window never closes a live session. Once a
// budget of its chain is spent, the session goes on, but the events that
// make the model respond are refused: the gateway answers each with the
// Realtime API's own error event, on the same WebSocket, and never passes
// it to the upstream. That takes reading what the client sends:
// clientEvents holds each message the client sends until it is whole, and
// sessionGate judges it. A WebSocket over HTTP/2 or HTTP/3, whose frames
// the gateway cannot read, is refused where its tokens or spend would go
// uncounted.
//
// # Refusals cost Redis nothing
//
// A limit Redis refused on requests (per minute or per day) or a token
// bucket is refused by the store's refusal cache, without a call, until the
// moment Redis would admit it again (refusalCache). It is exact: traffic
// only makes those counters grow, and the gateway bounds Redis's clock from
// its own monotonic clock, so the cache never refuses what Redis would
// admit. Token, budget and concurrency refusals are left to Redis: a
// settlement can give tokens or money back, and a request in flight may end
// at any moment.
//
// # What the client and the upstream choose
//
// A scope id must be what the upstream reads, or a client could vary what
// the upstream ignores and be counted afresh each time. Two ways in are
// closed (credential.go): a header sent twice (a limiter that joins the
// values counts "K,x" while the upstream reads K), refused with 400 before
// any store call, and a credential sent in another provider's header, which
// the upstream of this API never reads: the api_key placeholder is the key
// as the request's API reads it, and nothing else. Likewise a body that
// names its model under two spellings of the key, and a path, read as a
// normalising upstream reads it (internal/llmapi).
//
// A request's body is read to estimate the tokens it reserves, to find the
// model it asks for and to add the stream option. Reading it costs memory
// that a client chooses, so it is read only when the admission needs it,
// after whatever can be refused without it, and in memory the client
// cannot inflate (body.go): a body holds none until its first byte arrives,
// its buffer then grows with the bytes that arrive, never with what
// Content-Length claims, and the bytes held by every body being read in
// this process are capped (body_memory). A body the cap has no room for
// takes the room of a body being read that gives way to it
// (bodyMemory.victimFor): one that has sent nothing for a while, or one of
// a client address that holds more than its own would; failing that it
// waits briefly for room, then is answered 503: it is never admitted
// unreserved. So one client cannot keep the memory from the others,
// whether it holds bodies back or stalls them half sent.
//
// A response's reported usage, which the upstream chooses, is charged at
// most a ceiling (usageCeiling): its output at most the request's own
// output cap times its choices, or without one far above any real response,
// so that one absurd report cannot lock a shared pool.
//
// # Answers
//
// Every answer of the handler's own goes through one path (Handler.answer),
// which sets the outcome, the placeholders, the metrics, the headers,
// on_refusal and the dialect once. The dialect is the API the request's
// path names (internal/llmapi), so that each provider's SDK reads a refusal
// as its own error: OpenAI's, Anthropic's or Google's error shape, a spent
// budget as each provider's exhausted quota, with Retry-After and
// retry-after-ms the exact wait, and x-should-retry false past a minute,
// which the SDKs obey rather than retry into the same refusal.
//
// # The admin API
//
// The live view ([AdminAPI]) reads, without charging, every limit that the
// loaded handlers apply to one scope id, on the store each uses. The reset
// ([ResetPath]) clears an id's windows and token buckets, and keeps its
// slots (requests still running) and its budgets (money spent). Both name
// an id only as stored.
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
