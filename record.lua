-- record.lua: charge tokens to the current tok bucket of limits, in one
-- atomic step. One call charges one response, or the summed charges of
-- concurrent responses.
--
-- Numbers in ARGV are hexadecimal, which Lua reads with strtoul.
--
-- KEYS[i]    the current tok bucket key of a limit that has a tpm.
-- ARGV[1]    a pinned clock in unix milliseconds, or "" for Redis TIME.
-- ARGV[2]    the bucket the keys name. If Redis's clock is in another bucket,
--            nothing is charged and the answer is {-1, now}: the caller names
--            the keys again (nothing ran, so that is no replay).
-- ARGV[2+i]  the tokens to charge to KEYS[i], a positive integer.

local now = tonumber(ARGV[1], 16)
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
if math.floor(now / 60000) ~= tonumber(ARGV[2], 16) then
  return {-1, now}
end
for i, key in ipairs(KEYS) do
  local tokens = tonumber(ARGV[2 + i], 16)
  -- Only the increment that creates the key sets its expiry.
  if redis.call('INCRBY', key, tokens) == tokens then redis.call('EXPIRE', key, 120) end
end
return {1, now}
