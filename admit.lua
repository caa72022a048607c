-- admit.lua: admissions against the limits of their chains, in one atomic
-- step (Redis runs a script to completion before serving any other command).
-- One call decides one request, or a batch of concurrent requests from one
-- gateway in arrival order, each all-or-nothing as if it had been sent alone.
--
-- KEYS      for each distinct limit of the call, in order: for each window
--           kind it caps (req if its rpm > 0, then tok if its tpm > 0) the key
--           of the current bucket, then of the previous one; then, if it has a
--           token bucket, the bucket's key. Every key the script touches is
--           declared, so that Redis Cluster routes, redirects and migrates
--           the call by the real keys.
-- Numbers in ARGV are hexadecimal, which Lua reads with strtoul rather than
-- the much slower strtod.
--
-- ARGV[1]   a pinned clock in unix milliseconds, or "" for Redis TIME, so that
--           replicas with skewed clocks agree.
-- ARGV[2]   the bucket the keys name (unix_seconds / 60 by the gateway's
--           clock). If Redis's clock is in another bucket, the script touches
--           nothing and answers {-1, now}: the caller names the keys again.
-- ARGV[3]   "a" to admit, or "p" to decide and charge nothing (the admin
--           API's live view).
-- ARGV[4]   L, the number of distinct limits.
-- then      per limit: rpm, tpm (0 is no cap), rate of its token bucket in
--           milli-tokens per second (0 is none), and if rate > 0 its burst
--           and cost.
-- then      one argument per admission, in arrival order: the positions
--           (1-based) of the limits of its chain, one byte each.
--
-- A request fits a window while estimate + 1 <= rpm and estimate < tpm, with
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
-- (the deficit refilled to now) before the call's charges: the caller replays
-- the admissions in order to know what each one read.

local tonumber, byte = tonumber, string.byte

local now = tonumber(ARGV[1], 16)
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local bucket = math.floor(now / 60000)
if bucket ~= tonumber(ARGV[2], 16) then
  return {-1, now}
end
local weight = 60000 - (now - bucket * 60000)
local charging = ARGV[3] == 'a'
local n = tonumber(ARGV[4], 16)
local vals = redis.call('MGET', unpack(KEYS))

-- Per limit: {rpm, tpm, rate, room, cost, req_cur, req_prev, tok_cur,
-- tok_prev, deficit, since, req_key, bucket_key, bucket_ttl, added}, built
-- by one constructor each; the reply gets its counts as read.
local limits = {}
local reply = {1, now}
local a, j = 5, 1
for i = 1, n do
  local r, t, q = tonumber(ARGV[a], 16), tonumber(ARGV[a + 1], 16), tonumber(ARGV[a + 2], 16)
  a = a + 3
  local c0, p0, c1, p1, d, since, rkey, bkey, ttl, room, cost = 0, 0, 0, 0, 0, now, false, false, 0, 0, 0
  if r > 0 then
    c0, p0, rkey = tonumber(vals[j]) or 0, tonumber(vals[j + 1]) or 0, KEYS[j]
    j = j + 2
  end
  if t > 0 then
    c1, p1 = tonumber(vals[j]) or 0, tonumber(vals[j + 1]) or 0
    j = j + 2
  end
  if q > 0 then
    local burst, c = tonumber(ARGV[a], 16), tonumber(ARGV[a + 1], 16)
    a = a + 2
    room, cost, bkey, ttl = (burst - c) * 1000000, c * 1000000, KEYS[j], 2 * math.ceil(burst * 1000000 / q)
    local sd, st = string.match(vals[j] or '', '^(%d+):(%d+)$')
    if sd then
      d, st = tonumber(sd), tonumber(st)
      if now > st then
        d = math.max(d - (now - st) * q, 0)
      else
        since = st -- a clock gone back refills nothing
      end
    end
    j = j + 1
  end
  limits[i] = {r, t, q, room, cost, c0, p0, c1, p1, d, since, rkey, bkey, ttl, 0}
  local k = 5 * i - 2
  reply[k], reply[k + 1], reply[k + 2], reply[k + 3], reply[k + 4] = c0, p0, c1, p1, d
end

local k = 5 * n + 2
for m = a, #ARGV do
  local chain = {byte(ARGV[m], 1, -1)}
  local fits = 1
  for x = 1, #chain do
    local l = limits[chain[x]]
    if l[1] > 0 and (l[6] + 1) * 60000 + l[7] * weight > l[1] * 60000
      or l[2] > 0 and l[8] * 60000 + l[9] * weight >= l[2] * 60000
      or l[3] > 0 and l[10] > l[4] then
      fits = 0
      break
    end
  end
  if fits == 1 and charging then
    for x = 1, #chain do
      local l = limits[chain[x]]
      if l[1] > 0 then l[6], l[15] = l[6] + 1, l[15] + 1 end
      l[10] = l[10] + l[5]
    end
  end
  k = k + 1
  reply[k] = fits
end

if charging then
  for i = 1, n do
    local l = limits[i]
    local added = l[15]
    -- The expiry is set only when the increment creates the key. (INCR
    -- spares the conversion of a number argument to a string.)
    if added == 1 and redis.call('INCR', l[12]) == 1
      or added > 1 and redis.call('INCRBY', l[12], added) == added then
      redis.call('EXPIRE', l[12], 120)
    end
    if l[13] and l[10] ~= reply[5 * i + 2] then
      redis.call('SET', l[13], string.format('%d:%d', l[10], l[11]), 'PX', l[14])
    end
  end
end
return reply
