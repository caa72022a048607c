-- admit.lua: one request against every limit of its chain, in one atomic step
-- (Redis runs a script to completion before serving any other command).
--
-- KEYS      for each limit in chain order: for each window kind it caps (req
--           if its rpm > 0, then tok if its tpm > 0) the key of the current
--           bucket, then of the previous one; then, if it has a token bucket,
--           the bucket's key. Every key the script touches is declared, so
--           that Redis Cluster routes, redirects and migrates the admission
--           by the real keys.
-- ARGV[1]   a pinned clock in unix milliseconds, or "" for Redis TIME, so that
--           replicas with skewed clocks agree.
-- ARGV[2]   the bucket the keys name (unix_seconds / 60 by the gateway's
--           clock). If Redis's clock is in another bucket, the script touches
--           nothing and answers {-1, now}: the caller names the keys again.
-- ARGV[5i-2 .. 5i+2]  limit i: rpm, tpm (0 is no cap), then its token
--           bucket: rate in milli-tokens per second (0 is none), burst, cost.
-- ARGV[5n+3], optional  "peek": decide and answer, but charge nothing (the
--           admin API's live view).
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
-- takes to fill (as Spring does): it is full by then.
-- bucket.go does the same arithmetic in Go.
--
-- Reply: {admitted (1|0), now_ms, then per limit: req_cur, req_prev, tok_cur,
-- tok_prev, deficit} with the counts as read (the deficit refilled to now),
-- before this request's charge.

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local bucket = math.floor(now / 60000)
if bucket ~= tonumber(ARGV[2]) then
  return {-1, now}
end
local weight = 60000 - (now - bucket * 60000)

local n = math.floor((#ARGV - 2) / 5)
local vals = redis.call('MGET', unpack(KEYS))

local reply = {1, now}
local charge = {} -- the keys of the current request buckets
local fill = {}   -- the token buckets: key, deficit after the charge, moment, ttl
local j = 1
for i = 1, n do
  local a = 5 * i - 2
  local rpm, tpm = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local rate, burst, cost = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local rc, rp, tc, tp, deficit = 0, 0, 0, 0, 0
  if rpm > 0 then
    rc, rp = tonumber(vals[j]) or 0, tonumber(vals[j + 1]) or 0
    charge[#charge + 1] = KEYS[j]
    j = j + 2
    if (rc + 1) * 60000 + rp * weight > rpm * 60000 then reply[1] = 0 end
  end
  if tpm > 0 then
    tc, tp = tonumber(vals[j]) or 0, tonumber(vals[j + 1]) or 0
    j = j + 2
    if tc * 60000 + tp * weight >= tpm * 60000 then reply[1] = 0 end
  end
  if rate > 0 then
    local at = now
    local d, t = string.match(vals[j] or '', '^(%d+):(%d+)$')
    if d then
      deficit, at = tonumber(d), math.max(tonumber(t), now)
      local elapsed = now - tonumber(t)
      if elapsed > 0 then deficit = math.max(deficit - elapsed * rate, 0) end
    end
    if deficit > (burst - cost) * 1000000 then reply[1] = 0 end
    fill[#fill + 1] = {KEYS[j], deficit + cost * 1000000, at, 2 * math.ceil(burst * 1000000 / rate)}
    j = j + 1
  end
  reply[#reply + 1] = rc
  reply[#reply + 1] = rp
  reply[#reply + 1] = tc
  reply[#reply + 1] = tp
  reply[#reply + 1] = deficit
end

if reply[1] == 1 and ARGV[5 * n + 3] ~= 'peek' then
  for _, key in ipairs(charge) do
    -- The expiry is set only when the increment creates the key.
    if redis.call('INCR', key) == 1 then redis.call('EXPIRE', key, 120) end
  end
  for _, b in ipairs(fill) do
    redis.call('SET', b[1], string.format('%d:%d', b[2], b[3]), 'PX', b[4])
  end
end
return reply
