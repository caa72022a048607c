-- admit.lua: admissions against the limits of their chains, in one atomic
-- step (Redis runs a script to completion before serving any other command).
-- One call decides one request, or a batch of concurrent requests from one
-- gateway in arrival order, each all-or-nothing as if it had been sent alone.
-- A call also charges the tokens of responses that ended before it, first,
-- so that its admissions read them; a charge that settles a reservation may
-- be negative, and gives back at most what its bucket holds.
--
-- KEYS      for each distinct limit of the call, in order: for each window
--           it caps, in windowKind order (window.go: rpm, tpm, itpm, otpm,
--           rpd, tpd, itpd, otpd), the key of the current bucket, then of
--           the previous one; then, if it has a token bucket, the bucket's
--           key. Then, for each token charge, the key it charges: the minute
--           charges first, then the day charges; a settlement's are its
--           reservation's buckets. Every key the script touches is declared,
--           so that Redis Cluster routes, redirects and migrates the call by
--           the real keys.
-- Numbers in ARGV are hexadecimal, which Lua reads with strtoul rather than
-- the much slower strtod, except the token charges: decimal, as INCRBY takes
-- them, which spares the script formatting a number (with "%.14g").
--
-- ARGV[1]   a pinned clock in unix milliseconds, or "" for Redis TIME, so that
--           replicas with skewed clocks agree.
-- ARGV[2]   the minute bucket the keys name (unix_seconds / 60 by the
--           gateway's clock; the day buckets are unix_seconds / 86400 of the
--           same minute). If Redis's clock is in another minute, the script
--           touches nothing and answers {-1, now}: the caller names the keys
--           again.
-- ARGV[3]   "a" to admit, "r" or "s" to admit with reservations (see
--           below), or "p" to decide and charge nothing (the admin API's
--           live view).
-- ARGV[4]   L, the number of distinct limits.
-- ARGV[5]   C, the number of minute token charges, and ARGV[6] D, of day
--           token charges (0 with "p").
-- ARGV[7]   K, the number of distinct caps among the limits: most limits of
--           a call share a handful (every key of one "limit key *" line has
--           the same), which are then passed and read once.
-- then      per charge, the tokens to add to its key, a decimal (negative
--           for a settlement that gives tokens back).
-- then      per distinct caps: the windows it caps, one argument of a byte
--           per window, its windowKind; the cap of each of them; the rate of a token bucket in
--           milli-tokens per second (0 is none), and if rate > 0 its burst
--           and cost.
-- then      one argument of L bytes: each limit's caps (1-based).
-- then      per admission, in arrival order: with "r", the tokens it
--           reserves, or with "s" (when the call caps input or output
--           tokens) the tokens in all, of input and of output; then the
--           positions (1-based) of the limits of its chain, one byte each.
--
-- A window counts requests, tokens, input tokens or output tokens, over a
-- minute (in milliseconds) or a day (in seconds, so that every number stays
-- exact in Lua's doubles, below 2^53, for caps up to 10^11). Its estimate is
-- current + previous * (length - into) / length, compared multiplied by
-- length so that every number is an integer. A request fits a request
-- window while estimate + 1 <= cap, and a token window while estimate <
-- cap, or with a reservation of r tokens of the window's kind while
-- estimate + r <= cap (then r is added to its current bucket). window.go
-- does the same arithmetic in Go.
--
-- A token bucket is stored as "<deficit>:<ms>": micro-tokens below full as
-- of a moment; it refills by rate micro-tokens per millisecond, and a missing
-- bucket is full. A request fits while deficit <= (burst - cost) * 10^6.
-- Each write sets the key to expire after twice the time an empty bucket
-- takes to fill (as Spring does): it is full by then. bucket.go does the same
-- arithmetic in Go.
--
-- Reply: {1, now_ms, then per limit, for each window it caps, the current
-- and previous count, then its bucket's deficit; then per admission 1
-- (admitted) or 0}, with the counts as read (the deficit refilled to now)
-- after the token charges and before the admissions: the caller replays the
-- admissions in order to know what each one read.

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
-- The weight of the previous bucket now: a minute's in milliseconds, a
-- day's in seconds (a bucket is 60000 and 86400 of them long; its keys live
-- 120 s and two days).
local secs = floor(now / 1000)
local mweight, dweight = 60000 - (now - bucket * 60000), 86400 - (secs - floor(secs / 86400) * 86400)
local split = ARGV[3] == 's'
local reserving = split or ARGV[3] == 'r'
local charging = reserving or ARGV[3] == 'a'
local n, nc, nd, ncaps = tonumber(ARGV[4], 16), tonumber(ARGV[5], 16), tonumber(ARGV[6], 16), tonumber(ARGV[7], 16)
-- Only the increment that creates a key sets its expiry.
local nk = #KEYS - nc - nd
for c = 1, nc + nd do
  local key, tokens = KEYS[nk + c], ARGV[7 + c]
  local v = redis.call('INCRBY', key, tokens)
  if v == tokens + 0 then redis.call('EXPIRE', key, c <= nc and 120 or 172800) end
  if v < 0 then redis.call('SET', key, 0, 'KEEPTTL') end
end
local vals = nk > 0 and redis.call('MGET', unpack(KEYS, 1, nk)) or {}

-- caps[x] = {windows, rate, burst, cost}: windows lists, flat, the
-- windowKind and the cap of each window it caps.
local arg = 8 + nc + nd
local caps = {}
for x = 1, ncaps do
  local kinds = {byte(ARGV[arg], 1, -1)}
  arg = arg + 1
  local ws = {}
  for w = 1, #kinds do
    ws[2 * w - 1], ws[2 * w] = kinds[w], tonumber(ARGV[arg], 16)
    arg = arg + 1
  end
  local q = tonumber(ARGV[arg], 16)
  if q > 0 then
    caps[x] = {ws, q, tonumber(ARGV[arg + 1], 16), tonumber(ARGV[arg + 2], 16)}
    arg = arg + 3
  else
    caps[x] = {ws, 0}
    arg = arg + 1
  end
end
local capsof = {byte(ARGV[arg], 1, -1)}
arg = arg + 1

-- Per limit: left, the whole requests that still fit (a request takes 1);
-- added, the requests the call admitted; bkt, its token bucket's {ttl,
-- since, deficit, cost}, nil where it has none. A limit's room is the
-- least of its request windows' (how many requests fit below the cap), 0
-- if one of its token windows is full (without reservations, tokens are
-- charged after the fact, never by an admission, so that holds for the
-- whole call), and the requests its token bucket holds. With reservations,
-- each token window t has a room of its own, in flat arrays (no table per
-- window): troom[t] in the span's units times its length (a reservation of
-- r fits while troom >= r * length, and at least 1), twin, its windowKind,
-- tkey, and treserved, the tokens the call added; limit i owns the windows
-- tfrom[i] .. tto[i]. Without reservations the call makes none of these
-- tables: a table, and each rehash that grows it, costs Redis's Lua far
-- more than a comparison. (Strings from MGET become numbers by arithmetic,
-- which is cheaper than tonumber.) The reply gets the counts as read.
local inf = 1 / 0
local left, added, bkt = {}, {}, {}
local troom, twin, tkey, treserved, tfrom, tto
if reserving then
  troom, twin, tkey, treserved, tfrom, tto = {}, {}, {}, {}, {}, {}
end
local nt = 0
local reply = {1, now}
local nr = 2
local j = 1
for i = 1, n do
  local cap = caps[capsof[i]]
  local ws = cap[1]
  local room = inf
  if reserving then tfrom[i] = nt + 1 end
  for w = 1, #ws, 2 do
    local k, c = ws[w], ws[w + 1]
    local len, wt = 60000, mweight
    if k >= 4 then len, wt = 86400, dweight end
    local cur, prev = 0, 0
    local v, u = vals[j], vals[j + 1]
    if v then cur = v + 0 end
    if u then prev = u + 0 end
    local slack = (c - cur) * len - prev * wt
    local m = k % 4
    if m == 0 then
      local f = floor(slack / len)
      if f * len > slack then f = f - 1 end -- a quotient rounded up
      if f < room then room = f end
    elseif reserving then
      nt = nt + 1
      troom[nt], twin[nt], tkey[nt], treserved[nt] = slack, k, j, 0
    elseif slack <= 0 then
      room = 0
    end
    reply[nr + 1], reply[nr + 2] = cur, prev
    nr = nr + 2
    j = j + 2
  end
  if reserving then tto[i] = nt end
  local d = 0
  local q = cap[2]
  if q > 0 then
    local since, full, cost = now, (cap[3] - cap[4]) * 1000000, cap[4] * 1000000
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
    if f + 1 < room then room = f + 1 end
    bkt[i] = {2 * math.ceil(cap[3] * 1000000 / q), since, d, cost}
    j = j + 1
  end
  nr = nr + 1
  reply[nr] = d
  left[i], added[i] = room, 0
end

local step = split and 4 or reserving and 2 or 1
-- size[kind]: what an admission adds to a window of that kind
local size = reserving and {1, 0, 0, 0}
for m = arg, #ARGV, step do
  local chain = {byte(ARGV[m + step - 1], 1, -1)}
  if reserving then
    size[2] = tonumber(ARGV[m], 16)
  end
  if split then
    size[3], size[4] = tonumber(ARGV[m + 1], 16), tonumber(ARGV[m + 2], 16)
  end
  local fits = 1
  for x = 1, #chain do
    local i = chain[x]
    if left[i] < 1 then
      fits = 0
      break
    end
    if reserving then
      for t = tfrom[i], tto[i] do
        local k = twin[t]
        local r = size[k % 4 + 1]
        if troom[t] < (r > 0 and r * (k >= 4 and 86400 or 60000) or 1) then
          fits = 0
          break
        end
      end
      if fits == 0 then break end
    end
  end
  if fits == 1 and charging then
    for x = 1, #chain do
      local i = chain[x]
      left[i], added[i] = left[i] - 1, added[i] + 1
      if reserving then
        for t = tfrom[i], tto[i] do
          local k = twin[t]
          local r = size[k % 4 + 1]
          troom[t], treserved[t] = troom[t] - r * (k >= 4 and 86400 or 60000), treserved[t] + r
        end
      end
    end
  end
  nr = nr + 1
  reply[nr] = fits
end

if charging then
  -- The keys in the order KEYS declares them: jk is limit i's first.
  local jk = 1
  for i = 1, n do
    local a, ws, b = added[i], caps[capsof[i]][1], bkt[i]
    if a > 0 then
      -- The expiry is set only when the increment creates the key. (INCR
      -- spares the conversion of a number argument to a string.)
      for w = 1, #ws, 2 do
        local k = ws[w]
        if k % 4 == 0 then
          local key = KEYS[jk + w - 1]
          if a == 1 and redis.call('INCR', key) == 1 or a > 1 and redis.call('INCRBY', key, a) == a then
            redis.call('EXPIRE', key, k >= 4 and 172800 or 120)
          end
        end
      end
      if b then
        redis.call('SET', KEYS[jk + #ws], string.format('%d:%d', b[3] + a * b[4], b[2]), 'PX', b[1])
      end
    end
    jk = jk + #ws
    if b then jk = jk + 1 end
  end
  for t = 1, nt do
    local r = treserved[t]
    if r > 0 then
      local key = KEYS[tkey[t]]
      if redis.call('INCRBY', key, string.format('%d', r)) == r then redis.call('EXPIRE', key, twin[t] >= 4 and 172800 or 120) end
    end
  end
end
return reply
