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
// repository; what follows is the design: how each guarantee is kept. The
// counting core (limits, windows, buckets, slots, budgets, both stores and
// admit.lua) is the package internal/limiter, whose doc holds its design:
// the sliding window, the one atomic admission, failures and the replay,
// requests in flight, spend budgets and the refusal cache.
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
// it takes a waiting place only once its body is read. A refusal by the
// provider's own quota, as a limit learned it, waits as a window's does.
//
// # The provider's own quota
//
// A limit that learns (LimitConfig.Learn) reads every answer to its
// admitted requests for what the provider says of its own quota (learn.go,
// with internal/provider): its rate-limit headers as they are written,
// before this handler's own replace them, and a refusal's wait, from its
// headers or, for Gemini, its body's first bytes. The report goes to the
// store without the response waiting for it; the store learns it, and
// every admission of the id on every replica is decided within it in the
// same atomic step (internal/limiter's package doc, "The provider's own
// quota"). A report's moment is its request's admission by the store's
// clock plus what elapsed on this machine's monotonic clock, so that
// replicas order their reports alike. The live view shows what was
// learned; provider_paused_ids counts the pauses this process read.
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
// as its own error: OpenAI's, Anthropic's, Google's, Bedrock's or Cohere's
// error shape, a spent budget as each provider's exhausted quota, with
// Retry-After and retry-after-ms the exact wait, and x-should-retry false
// past a minute, which the OpenAI and Anthropic SDKs obey rather than retry
// into the same refusal. The AWS SDKs retry by the error code in
// x-amzn-ErrorType, after x-amz-retry-after, and the JavaScript one any
// 429; Cohere's any 429: so those dialects answer what no wait helps (a
// spent budget, a request too large) with their providers' 400 or 402
// (dialect.limitStatus).
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
