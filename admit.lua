-- admit.lua: admissions against the limits of their chains, in one atomic
-- step (Redis runs a script to completion before serving any other command).
-- One call decides one request, or a batch of concurrent requests from one
-- gateway in arrival order, each all-or-nothing as if it had been sent alone.
-- A call also charges the tokens of responses that ended before it, first,
-- so that its admissions read them; a charge that settles a reservation may
-- be negative, and gives back at most what its bucket holds.
--
-- KEYS      for each distinct limit of the call, in order: for each window
--           kind it caps (req if its rpm > 0, then tok if its tpm > 0) the key
--           of the current bucket, then of the previous one; then, if it has a
--           token bucket, the bucket's key. Then, for each token charge, the
--           tok key it charges: the current one, or a settlement's own. Every key the script
--           touches is declared, so that Redis Cluster routes, redirects and
--           migrates the call by the real keys.
-- Numbers in ARGV are hexadecimal, which Lua reads with strtoul rather than
-- the much slower strtod, except the token charges: decimal, as INCRBY takes
-- them, which spares the script formatting a number (with "%.14g").
--
-- ARGV[1]   a pinned clock in unix milliseconds, or "" for Redis TIME, so that
--           replicas with skewed clocks agree.
-- ARGV[2]   the bucket the keys name (unix_seconds / 60 by the gateway's
--           clock). If Redis's clock is in another bucket, the script touches
--           nothing and answers {-1, now}: the caller names the keys again.
-- ARGV[3]   "a" to admit, "r" to admit with reservations (see below), or "p"
--           to decide and charge nothing (the admin API's live view).
-- ARGV[4]   L, the number of distinct limits.
-- ARGV[5]   C, the number of token charges (0 with "p").
-- ARGV[6]   K, the number of distinct caps among the limits: most limits of
--           a call share a handful (every key of one "limit key *" line has
--           the same), which are then passed and read once.
-- then      per charge, the tokens to add to its key, a decimal (negative
--           for a settlement that gives tokens back).
-- then      per distinct caps: rpm, tpm (0 is no cap), rate of a token bucket
--           in milli-tokens per second (0 is none), and if rate > 0 its burst
--           and cost.
-- then      one argument of L bytes: each limit's caps (1-based).
-- then      per admission, in arrival order: with "r", the tokens it reserves
--           on every tpm of its chain; then the positions (1-based) of the
--           limits of its chain, one byte each.
--
-- A request fits a window while estimate + 1 <= rpm, and estimate < tpm, or
-- with a reservation of r tokens estimate + r <= tpm (then r is added to
-- the current tok bucket of every tpm of its chain), with
-- estimate = current + previous * (60000 - ms_into_bucket) / 60000, compared
-- multiplied by 60000 so that every number is an integer (exact in Lua's
-- doubles below 2^53). window.go does the same arithmetic in Go.
--
-- A token bucket is stored as "<deficit>:<ms>": micro-tokens below full as
-- of a moment; it refills by rate micro-tokens per millisecond, and a missing
-- bucket is full. A request fits while deficit <= (burst - cost) * 10^6.
-- Each write sets the key to expire after twice the time an empty bucket
-- takes to fill (as Spring does): it is full by then. bucket.go does the same
-- arithmetic in Go.
--
-- Reply: {1, now_ms, then per limit req_cur, req_prev, tok_cur, tok_prev,
-- deficit, then per admission 1 (admitted) or 0}, with the counts as read
-- (the deficit refilled to now) after the token charges and before the
-- admissions: the caller replays the admissions in order to know what each
-- one read.

local tonumber, byte, floor = tonumber, string.byte, math.floor

local now = tonumber(ARGV[1], 16)
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000 + floor(t[2] / 1000)
end
local bucket = floor(now / 60000)
if bucket ~= tonumber(ARGV[2], 16) then
  return {-1, now}
end
local weight = 60000 - (now - bucket * 60000)
local reserving = ARGV[3] == 'r'
local charging = reserving or ARGV[3] == 'a'
local n, nc, ncaps = tonumber(ARGV[4], 16), tonumber(ARGV[5], 16), tonumber(ARGV[6], 16)
-- Only the increment that creates a key sets its expiry.
local nk = #KEYS - nc
for c = 1, nc do
  local key, tokens = KEYS[nk + c], ARGV[6 + c]
  local v = redis.call('INCRBY', key, tokens)
  if v == tokens + 0 then redis.call('EXPIRE', key, 120) end
  if v < 0 then redis.call('SET', key, 0, 'KEEPTTL') end
end
local vals = nk > 0 and redis.call('MGET', unpack(KEYS, 1, nk)) or {}

local arg = 7 + nc
local caps = {}
for x = 1, ncaps do
  local q = tonumber(ARGV[arg + 2], 16)
  if q > 0 then
    caps[x] = {tonumber(ARGV[arg], 16), tonumber(ARGV[arg + 1], 16), q, tonumber(ARGV[arg + 3], 16), tonumber(ARGV[arg + 4], 16)}
    arg = arg + 5
  else
    caps[x] = {tonumber(ARGV[arg], 16), tonumber(ARGV[arg + 1], 16), 0}
    arg = arg + 3
  end
end
local capsof = {byte(ARGV[arg], 1, -1)}
arg = arg + 1

-- Per limit: left, the room for more requests in 60000ths of a request (a
-- request fits while left >= 60000, and takes 60000 of it); added, the
-- requests the call admitted; rkey, the key of its current req bucket; bkt,
-- its token bucket's {key, ttl, since, deficit, cost}; false where it has
-- none. A limit's room is the least of its caps': its rpm's slack (how far
-- the window is below the rpm), 0 if its token window is full (without
-- reservations, tokens are charged after the fact, never by an admission,
-- so that holds for the whole call), and the requests its token bucket
-- holds. With reservations, a tpm has a room of its own, tleft, in 60000ths
-- of a token (a reservation of r fits while tleft >= r * 60000, and at least
-- 1), reserved tokens the call added, and tkey, its current tok key. (Strings from MGET become
-- numbers by arithmetic, which is cheaper than tonumber.) The reply gets the
-- counts as read.
local inf = 1 / 0
local left, added, rkey, bkt = {}, {}, {}, {}
local tleft, reserved, tkey = {}, {}, {}
local reply = {1, now}
local j = 1
for i = 1, n do
  local cap = caps[capsof[i]]
  local r, t, q = cap[1], cap[2], cap[3]
  local c0, p0, c1, p1, d = 0, 0, 0, 0, 0
  local room = inf
  rkey[i], bkt[i], tleft[i] = false, false, false
  if r > 0 then
    local v, w = vals[j], vals[j + 1]
    if v then c0 = v + 0 end
    if w then p0 = w + 0 end
    room, rkey[i] = (r - c0) * 60000 - p0 * weight, j
    j = j + 2
  end
  if t > 0 then
    local v, w = vals[j], vals[j + 1]
    if v then c1 = v + 0 end
    if w then p1 = w + 0 end
    local est = c1 * 60000 + p1 * weight
    if reserving then
      tleft[i], reserved[i], tkey[i] = t * 60000 - est, 0, j
    elseif est >= t * 60000 then
      room = 0
    end
    j = j + 2
  end
  if q > 0 then
    local since, full, cost = now, (cap[4] - cap[5]) * 1000000, cap[5] * 1000000
    local sd, st = string.match(vals[j] or '', '^(%d+):(%d+)$')
    if sd then
      d, st = sd + 0, st + 0
      if now > st then
        d = d - (now - st) * q
        if d < 0 then d = 0 end
      else
        since = st -- a clock gone back refills nothing
      end
    end
    -- A request fits while deficit <= full, and adds cost to it.
    local f = floor((full - d) / cost)
    if f * cost > full - d then f = f - 1 end -- a quotient rounded up
    if (f + 1) * 60000 < room then room = (f + 1) * 60000 end
    bkt[i] = {j, 2 * math.ceil(cap[4] * 1000000 / q), since, d, cost}
    j = j + 1
  end
  left[i], added[i] = room, 0
  local k = 5 * i - 2
  reply[k], reply[k + 1], reply[k + 2], reply[k + 3], reply[k + 4] = c0, p0, c1, p1, d
end

local k = 5 * n + 2
local step = reserving and 2 or 1
for m = arg, #ARGV, step do
  local chain = {byte(ARGV[m + step - 1], 1, -1)}
  local r, need = 0, 1
  if reserving then
    r = tonumber(ARGV[m], 16)
    if r > 0 then need = r * 60000 end
  end
  local fits = 1
  for x = 1, #chain do
    local i = chain[x]
    local tl = tleft[i]
    if left[i] < 60000 or tl and tl < need then
      fits = 0
      break
    end
  end
  if fits == 1 and charging then
    for x = 1, #chain do
      local i = chain[x]
      left[i], added[i] = left[i] - 60000, added[i] + 1
      if tleft[i] then
        tleft[i], reserved[i] = tleft[i] - r * 60000, reserved[i] + r
      end
    end
  end
  k = k + 1
  reply[k] = fits
end

if charging then
  for i = 1, n do
    local a = added[i]
    if a > 0 then
      local rj, b = rkey[i], bkt[i]
      -- The expiry is set only when the increment creates the key. (INCR
      -- spares the conversion of a number argument to a string.)
      if rj and (a == 1 and redis.call('INCR', KEYS[rj]) == 1
        or a > 1 and redis.call('INCRBY', KEYS[rj], a) == a) then
        redis.call('EXPIRE', KEYS[rj], 120)
      end
      if b then
        redis.call('SET', KEYS[b[1]], string.format('%d:%d', b[4] + a * b[5], b[3]), 'PX', b[2])
      end
    end
    local r = reserved[i]
    if r and r > 0 then
      local tokens = string.format('%d', r)
      if redis.call('INCRBY', KEYS[tkey[i]], tokens) == r then redis.call('EXPIRE', KEYS[tkey[i]], 120) end
    end
  end
end
return reply
