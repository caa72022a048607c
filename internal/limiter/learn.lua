-- learn.lua: what a provider's answer said of its own quota, learned by
-- the limits of the request's chain that learn it (learned.go's learn,
-- which the in-process store runs in Go).
--
-- KEYS      the learned keys of those limits (on Redis Cluster, of one
--           chain root).
-- ARGV[1]   the answer's moment, in unix milliseconds of Redis's clock.
-- ARGV[2]   "1" if the provider refused the request, ARGV[3] its wait in
--           milliseconds, and ARGV[4] where the wait came from (the
--           module's code of a header).
-- then      per quota (requests, tokens, input tokens, output tokens): its
--           limit (0: not reported), what remained, the milliseconds
--           until it is full again and where it came from.
--
-- A learned key holds its text as admit.lua reads it: the pause's end
-- and where from, then per quota its limit, deficit in millionths, the
-- deficit's moment, refill rate in millionths a millisecond (a double),
-- end, report's moment and where from. A report older than the one a quota holds leaves it; a quota
-- takes the report's deficit, or what it holds taken now if that is more
-- (requests admitted after the reported one may not have reached the
-- provider yet); one reported full, or full again at once, holds nothing
-- back unless it holds something taken now. The key
-- expires when its pause and its quotas end, and goes at once if they
-- already have.

local MICRO, NUM_LEARNED, MAX_LEARNED = 1000000, 4, 1000000000
local at, refused, wait, wait_from = tonumber(ARGV[1]), ARGV[2] == '1', tonumber(ARGV[3]), tonumber(ARGV[4])
for i = 1, #KEYS do
  local state, fields, shaped = {}, 0, true
  local text = redis.call('GET', KEYS[i])
  if text then
    -- Hexadecimal, but each rate (field 6 + 7k), a decimal double; a '|'
    -- before each quota.
    for field in string.gmatch(text, '[^:|]+') do
      fields = fields + 1
      local n
      if (fields - 6) % 7 == 0 and fields > 2 then n = tonumber(field) else n = tonumber(field, 16) end
      shaped = shaped and n ~= nil
      state[fields] = n or 0
    end
  end
  if not shaped or fields ~= 2 + 7 * NUM_LEARNED then -- none, or a key of another shape
    state = {}
    for f = 1, 2 + 7 * NUM_LEARNED do state[f] = 0 end
  end
  if refused and at + wait > state[1] then state[1], state[2] = at + wait, wait_from end
  for k = 0, NUM_LEARNED - 1 do
    local base, limit, remaining, reset, from = 2 + 7 * k, tonumber(ARGV[5 + 4 * k]), tonumber(ARGV[6 + 4 * k]), tonumber(ARGV[7 + 4 * k]), tonumber(ARGV[8 + 4 * k])
    if limit > 0 and limit <= MAX_LEARNED and at >= state[base + 6] then
      -- What the quota holds taken now, of the same limit (learned.go).
      local taken = 0
      if state[base + 1] > 0 and at < state[base + 5] and state[base + 1] == limit then
        taken = state[base + 2]
        local elapsed = at - state[base + 3]
        if elapsed > 0 then
          taken = taken - math.floor(state[base + 4] * elapsed)
          if taken < 0 then taken = 0 end
        end
      end
      if remaining < 0 then remaining = 0 elseif remaining > limit then remaining = limit end
      local deficit = (limit - remaining) * MICRO
      if (deficit == 0 or reset <= 0) and taken == 0 then
        state[base + 1], state[base + 2], state[base + 3], state[base + 4], state[base + 5], state[base + 6], state[base + 7] = 0, 0, 0, 0, 0, at, from
      elseif deficit == 0 or reset <= 0 then
        state[base + 6], state[base + 7] = at, from
      else
        local rate, ends = deficit / reset, at + reset
        if taken > deficit then deficit, ends = taken, at + math.ceil(taken / rate) end
        state[base + 1], state[base + 2], state[base + 3], state[base + 4], state[base + 5], state[base + 6], state[base + 7] = limit, deficit, at, rate, ends, at, from
      end
    end
  end
  local ends = state[1]
  for k = 0, NUM_LEARNED - 1 do
    if state[7 + 7 * k] > ends then ends = state[7 + 7 * k] end
  end
  if ends > at then
    local fields = {string.format('%x:%x', state[1], state[2])}
    for k = 0, NUM_LEARNED - 1 do
      local base = 2 + 7 * k
      fields[k + 2] = string.format('%x:%x:%x:%.17g:%x:%x:%x', state[base + 1], state[base + 2], state[base + 3], state[base + 4], state[base + 5], state[base + 6], state[base + 7])
    end
    redis.call('SET', KEYS[i], table.concat(fields, '|'), 'PXAT', string.format('%d', ends))
  else
    redis.call('DEL', KEYS[i])
  end
end
return 1
