-- record.lua: charge tokens to the current tok bucket of every limit given.
--
-- KEYS[i]  the prefix of a limit that has a tpm, "rolter:rl:<scope>:<id>:".
-- ARGV[1]  a pinned clock in unix milliseconds, or "" for Redis TIME.
-- ARGV[2]  the tokens, a positive integer.

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local suffix = 'tok:' .. string.format('%d', math.floor(now / 60000))
local tokens = tonumber(ARGV[2])
for i = 1, #KEYS do
  local key = KEYS[i] .. suffix
  -- Only the increment that creates the key sets its expiry.
  if redis.call('INCRBY', key, tokens) == tokens then redis.call('EXPIRE', key, 120) end
end
return 1
