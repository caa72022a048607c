-- record.lua: charge tokens to the current tok bucket of every limit given.
--
-- KEYS[i]  the current tok bucket key of a limit that has a tpm.
-- ARGV[1]  a pinned clock in unix milliseconds, or "" for Redis TIME.
-- ARGV[2]  the bucket the keys name. If Redis's clock is in another bucket,
--          nothing is charged and the answer is {-1, now}: the caller names
--          the keys again (nothing ran, so that is no replay).
-- ARGV[3]  the tokens, a positive integer.

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if math.floor(now / 60000) ~= tonumber(ARGV[2]) then
  return {-1, now}
end
local tokens = tonumber(ARGV[3])
for _, key in ipairs(KEYS) do
  -- Only the increment that creates the key sets its expiry.
  if redis.call('INCRBY', key, tokens) == tokens then redis.call('EXPIRE', key, 120) end
end
return {1, now}
