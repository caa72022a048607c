-- reset.lua: a reset of a limit's windows and token bucket (reset.go), and
-- when it was, for the settlements of the requests it found in flight.
--
-- KEYS      the keys of the limit's windows and bucket to delete; then, if
--           ARGV[2] is "1" (the limit caps a token window), its reset key.
-- ARGV[1]   a pinned clock in unix milliseconds, or "" for Redis TIME.
-- ARGV[2]   "1" to write the reset key, "0" not to.
--
-- The reset key holds the moment of the limit's last reset, in unix
-- milliseconds by the clock the admissions read. A settlement of a
-- reservation admitted before it adds the reservation back to the windows
-- it settles in (admit.lua): the reset took it from them. The key lives two
-- days, as a day window's key: a settlement lands at most in the day after
-- its reservation's, which began before the reset. It never goes back: a
-- clock that did would leave reservations the last reset took for live.

local now = tonumber(ARGV[1], 16)
if not now then
  local time = redis.call('TIME')
  now = time[1] * 1000 + math.floor(time[2] / 1000)
end
local marks = ARGV[2] == '1'
local deleted = #KEYS
if marks then deleted = deleted - 1 end
if deleted > 0 then redis.call('DEL', unpack(KEYS, 1, deleted)) end
if marks then
  local last = tonumber(redis.call('GET', KEYS[#KEYS]) or 0)
  redis.call('SET', KEYS[#KEYS], math.max(now, last), 'EX', 172800)
end
return deleted
