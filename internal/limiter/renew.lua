-- renew.lua: a holder's slots of concurrency caps, written as the holder
-- counts them, with a lease from now (slots.go). The holder's count is the
-- truth: a free that never reached Redis, or a Redis that lost the holding,
-- is mended here.
--
-- KEYS      the slots keys of the limits the holder holds slots of (on
--           Redis Cluster, those of one chain root).
-- ARGV[1]   a pinned clock in unix milliseconds, or "" for Redis TIME.
-- ARGV[2]   the holder.
-- then      per key, in hexadecimal: the slots the holder holds (0: the
--           holding is removed), and their lease in milliseconds (the
--           longest their requests asked for: slots.go).
--
-- A slots key is a hash: per holder, "<slots>:<lease end, unix ms>". The key
-- lives at least twice the lease past its last write, as admit.lua sets it:
-- never less than it does, as another holder's lease may be longer.

local now = tonumber(ARGV[1], 16)
if not now then
  local time = redis.call('TIME')
  now = time[1] * 1000 + math.floor(time[2] / 1000)
end
local holder = ARGV[2]
for i = 1, #KEYS do
  local slots, lease = tonumber(ARGV[1 + 2 * i], 16), tonumber(ARGV[2 + 2 * i], 16)
  if slots > 0 then
    redis.call('HSET', KEYS[i], holder, string.format('%d:%d', slots, now + lease))
    if redis.call('PTTL', KEYS[i]) < 2 * lease then redis.call('PEXPIRE', KEYS[i], 2 * lease) end
  else
    redis.call('HDEL', KEYS[i], holder)
  end
end
return #KEYS
