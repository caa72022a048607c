// Package limiter is the counting core of rolter_ratelimit: limits and
// their caps, the window, bucket, slot and budget arithmetic, the decisions
// and refusals an admission reaches, and the two stores that keep the
// counters, in this process (MemoryStore) or in Redis (RedisStore, with
// admit.lua, renew.lua and reset.lua), behind one interface, Store. It
// knows nothing of HTTP or Caddy: the module in the repository's root
// resolves a request's chain of limits, asks a Store to admit it, and
// answers. It reaches the module's metrics through an Observer, and every
// key it writes is spelled in keys.go.
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
// What a limit counts is its parts (Part): each window it caps, its token
// bucket, its requests in flight, each budget. Every reader of its counters
// walks them in one order (Caps.Parts): the keys of a call of admit.lua,
// the caps it passes and the reply it reads, the decision's counts after
// an admission (AddTo), the refusal, the reset, and the in-process
// store's reads and writes. A new kind of cap is a part, its case in each
// of those, and its arithmetic in both stores, which the differential test
// keeps alike.
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
// # The provider's own quota
//
// A limit that learns (Caps.Learn) also admits within what the provider
// last said of its own quota for the limit's id (Store.Learn, with what
// the module read of the provider's answer). OpenAI and Anthropic refill
// their quotas continuously, and their reset is the moment a quota is
// full again: so a report is a bucket, which held what remained at the
// report, holds the limit at the reset, and refills evenly between. The
// requests admitted and the tokens reserved since the report are taken
// from it as the admission takes them from a bucket, and once it is full
// again it holds nothing back. Each of the four quotas a provider may
// report (requests, tokens, input and output tokens) is such a bucket, and
// a provider's refusal pauses the limit until its wait ends. A report older
// than the one a quota holds never overwrites it; a report never raises a
// configured cap, which is decided beside it. All of it is read and
// charged in the one atomic admission, on both stores: a limit's learned
// key holds it on Redis (admit.lua), where it expires when the last of its
// pause and quotas ends. The counts are in millionths, the refill rate a
// double both stores compute and round alike, so that every number stays
// exact below 2^53 for quotas of up to 10^9 (MaxLearned).
//
// # Priority floors
//
// A limit's floors (Caps.Floors) keep a percent of each of its shares
// (each window, the bucket, each learned quota) for the requests of a
// class (Limit.Class, which the module finds per request), while the
// class asks: for FloorAskingMillis after one of its requests came to an
// admission of the limit, admitted or not. A request fits a share beside
// what the floors of the other classes that ask hold of it: each floor's
// percent of the share's cap, whole, less what its class uses of it, if
// that is less (FloorCounts). A class alone is held nothing from; a class
// that asks is never refused for what its floor still has, as long as
// what the others use came while it asked.
//
// What a class uses of a window is counted in windows of its own beside
// the limit's, in the same periods, so that the estimates add up; a
// settlement moves both. What it uses of a deficit share (the bucket, a
// learned quota) is its part of the deficit, kept with the deficit it was
// written beside (its basis) and scaled in proportion as the deficit
// refills, in the same double operations in both stores
// (scaledDeficit): the classes' parts never add up to more than the
// deficit, so that what floors hold never strands what nobody holds.
//
// Floors refuse nothing themselves (FloorsPart): they take from each
// share's room, which stays one number per share in a call of admit.lua
// because a call holds one class of a limit. A chain with floors is never
// refused from the refusal cache: its refusal is its class's asking,
// which the store writes.
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
package limiter
