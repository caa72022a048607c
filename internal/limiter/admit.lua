-- admit.lua: admissions against the limits of their chains, in one atomic
-- step (Redis runs a script to completion before serving any other command).
-- One call decides one request, or a batch of concurrent requests from one
-- gateway in arrival order, each all-or-nothing as if it had been sent alone.
-- A call also charges the tokens of responses that ended before it, and
-- frees the slots of requests that ended, first, so that its admissions read
-- them; a charge that settles a reservation may be negative, and gives back
-- at most what its period holds. Before the charges, a call adds back to
-- the windows of a limit reset since (reset.lua) what the settlements of
-- reservations admitted before the reset reserved: the reset took it from
-- them, and the settlement then charges what its request used.
--
-- KEYS      for each distinct limit of the call, in order, the keys of
--           each of its parts, in Part order (parts.go): for each window
--           it caps, in windowKind order (window.go: rpm, tpm, itpm, otpm,
--           rpd, tpd, itpd, otpd), the key of the current period, then of
--           the previous one; then, if it has a token bucket, the bucket's
--           key; then, if it caps requests in flight, its slots key; then
--           for each budget it has (day, then month), the keys of what its
--           current period holds spent, then reserved; then, if it learns
--           the provider's quota, its learned key; then, if it has floors,
--           for each of their classes the keys of each window it caps
--           (current period, then previous), then its floors key; then,
--           if it notifies, its notify key. Then, for each
--           charge, the key it charges: the minute windows' charges first,
--           then the day windows', the day budgets' and the month
--           budgets'; a settlement's are its reservation's periods. Then
--           the reset key of each limit whose windows a settlement may
--           restore. Then the slots key of each limit whose slots the
--           call frees.
--           Every key the script touches is declared,
--           so that Redis Cluster routes, redirects and migrates the call by
--           the real keys.
-- Numbers in ARGV are hexadecimal, which Lua reads with strtoul rather than
-- the much slower strtod, except the token charges: decimal, as INCRBY takes
-- them, which spares the script formatting a number (with "%.14g").
--
-- ARGV[1]   a pinned clock in unix milliseconds, or "" for Redis TIME, so that
--           replicas with skewed clocks agree.
-- ARGV[2]   the minute period the keys name (unix_seconds / 60 by the
--           gateway's clock; the day periods are unix_seconds / 86400 of the
--           same minute). If Redis's clock is in another minute, the script
--           touches nothing and answers {-1, now}: the caller names the keys
--           again.
-- ARGV[3]   "a" to admit, "r" or "s" to admit with reservations (see
--           below), or "p" to decide and charge nothing (the admin API's
--           live view).
-- ARGV[4]   L, the number of distinct limits.
-- ARGV[5]   the number of charges of minute windows, ARGV[6] of day
--           windows, ARGV[7] of day budgets, ARGV[8] of month budgets (0
--           with "p").
-- ARGV[9]   K, the number of distinct caps among the limits: most limits of
--           a call share a handful (every key of one "limit key *" line has
--           the same), which are then passed and read once.
-- ARGV[10]  F, the number of limits whose slots the call frees (0 with
--           "p").
-- ARGV[11]  the holder: the gateway process whose slots the call takes and
--           frees.
-- ARGV[12]  the number of reset keys, ARGV[13] of the restores' arguments
--           (0 with "p").
-- then      per charge, what to add to its key, a decimal: tokens, or
--           nano-dollars (negative for a settlement that gives some back);
--           then, if the call has reset keys, the earliest admission of
--           its settlements that may restore (unix milliseconds), and per
--           such settlement its admission, one argument of 9 bytes per
--           window it may restore (the position of its charge among the
--           charges, of its limit's reset key among the reset keys, and of
--           what it reserved among the settlement's sizes, each 1-based, in
--           3 bytes, most significant first), and those sizes, decimal,
--           each named by a window; then per limit freed, how many of the
--           holder's slots it frees.
-- then      per distinct caps: whether they are a shadow limit's ("1":
--           counted as the others, never refusing); then its parts, one
--           argument of a byte per part, its Part (a window's windowKind,
--           BUCKET, SLOTS, DAY_BUDGET, MONTH_BUDGET, LEARNED, FLOORS or
--           NOTIFY); then the caps of
--           each part: a window's cap; a token bucket's rate in
--           milli-tokens per second, its burst and its cost; the most
--           requests in flight and the lease of a slot in milliseconds; a
--           budget's cap in nano-dollars; the floors' percents, a byte each;
--           for notify, how many fractions, then per cap it watches (each
--           part before LEARNED), a budget's current period (its first
--           minute) before it, the level at which each fraction is reached.
-- then      one argument of L bytes: each limit's caps (1-based); then one
--           of L bytes, each limit's class on its floors (0: none), or ""
--           when no limit of the call has floors.
-- then      per admission, in arrival order: with "r", the tokens it
--           reserves, or with "s" (when the call caps input or output
--           tokens) the tokens in all, of input and of output; then with
--           "r" or "s", if a limit of the call has a budget, the most it
--           may cost in nano-dollars; then the positions (1-based) of the
--           limits of its chain, one byte each.
--
-- A window counts requests, tokens, input tokens or output tokens, over a
-- minute (in milliseconds) or a day (in seconds, so that every number stays
-- exact in Lua's doubles, below 2^53, for caps up to 10^11). Its estimate is
-- current + previous * (length - into) / length, compared multiplied by
-- length so that every number is an integer. A request fits a request
-- window while estimate + 1 <= cap, and a token window while estimate <
-- cap, or with a reservation of r tokens of the window's kind while
-- estimate + r <= cap (then r is added to its current period). window.go
-- does the same arithmetic in Go.
--
-- A token bucket is stored as "<deficit>:<ms>": micro-tokens below full as
-- of a moment; it refills by rate micro-tokens per millisecond, and a missing
-- bucket is full. A request fits while deficit <= (burst - cost) * 10^6.
-- Each write sets the key to expire after twice the time an empty bucket
-- takes to fill (as Spring does): it is full by then. bucket.go does the same
-- arithmetic in Go.
--
-- A budget's period holds what is spent and what is reserved, in
-- nano-dollars (exact in Lua's doubles: budgets are at most 10^15). A
-- request fits while spent + reserved + its cost <= budget, or without a
-- cost (without reservations) while spent + reserved < budget; an admitted
-- one adds its cost to what is reserved, which its settlement, a charge,
-- takes back as it adds the real cost to what is spent. A day's keys live
-- BUDGET_DAY_TTL from the write that creates them and a month's
-- BUDGET_MONTH_TTL, past any period's end. budget.go has the rest.
--
-- A learned key holds what a limit learned of the provider's quota
-- (learned.go), as text: until when a refusal pauses it and where its wait
-- came from, then, after a '|' each, per quota (requests, tokens, input,
-- output) its limit, its deficit in millionths as of a moment, that
-- moment, its refill rate in millionths a millisecond (a double,
-- "%.17g"), when it is full again (from then on it holds nothing back),
-- the moment of its report and where it came from (the module's codes of
-- the headers); every number hexadecimal but the rate. An admission reads
-- and writes back only the quotas that hold anything back. A request fits while
-- it is not paused and each quota that holds anything back has room for
-- what the request takes of it (a request, or the part of its reservation
-- that the quota counts), as a token window's room is read; an admitted
-- one adds that to the quota's deficit refilled to now. learn.lua writes
-- a report, and the key expires when its pause and its quotas have ended.
--
-- Floors (floors.go) keep a percent of each share of a limit (each
-- window, the bucket, each learned quota) for the requests of a class
-- while it asks: a class asks for ASKING milliseconds after one of its
-- requests came to an admission, admitted or not. A request of a class
-- fits a share beside what the floors of the other classes that ask hold
-- of it: each floor's percent of the share's cap, less what its class
-- uses of it, if that is less. What a class uses of a window its windows
-- count, beside the limit's; of a deficit share (the bucket, a learned
-- quota), its part of the deficit, which the floors key holds as of the
-- deficit it was written with (its basis), and which shrinks in
-- proportion as the deficit refills. The floors key holds, as hexadecimal
-- numbers after a ':' each, when each class last asked, each deficit
-- share's basis, then each class's part of each.
--
-- A notify key (notify.go) holds, per cap it watches, the period of its
-- last report and how many of its fractions it reported; the call's
-- admissions, admitted or refused, write it when their levels took a cap
-- past another fraction, or into another period (write_notices). The
-- gateway replays them to know which admission reported which.
--
-- A slots key is a hash: per holder, "<slots>:<lease end, unix ms>". A
-- limit's requests in flight are the slots of the holders whose lease has
-- not ended; a request fits while they are below the cap. An admission adds
-- one to its holder's slots and starts a lease, never ending sooner than
-- the holding's (another handler's lease may be longer); a free takes one
-- away, and renew.lua writes a holder's slots anew (slots.go). A holding
-- whose lease has ended is removed when it is read; the key lives at least
-- twice the lease past the last write that started a holding or renewed
-- one, whoever's: a holder of a shorter lease never shortens its life.
-- store_memory.go does the same with one holder.
--
-- Reply: {1, now_ms, then per limit, per part as KEYS has them: for each
-- window it caps the current and previous count, then if it has a token
-- bucket its deficit, then if it caps requests in flight their number,
-- then for each budget it has what is spent and what is reserved, then if
-- it learns the provider's quota until when it is paused and where from,
-- and for each quota its limit, deficit, rate in millionths of a
-- millionth a millisecond, end, report's moment and where from (all 0 for
-- one that holds nothing back), then if it has floors what they hold of
-- each share it has for the other classes and the class that holds the
-- most, and until when the classes that hold anything ask, then if it
-- notifies what its notify key holds of each cap it watches; then per
-- admission 1 (admitted) or 0}, with the
-- counts as read (the deficit refilled to now) after the token charges and
-- the frees and before the admissions: the caller replays the admissions in
-- order to know what each one read.

local tonumber, byte, floor, match, format = tonumber, string.byte, math.floor, string.match, string.format

-- A minute's arithmetic counts milliseconds and a day's seconds, so that a
-- day's numbers stay exact; a period's key lives two periods (in seconds)
-- because the next period reads it as its previous one.
local MINUTE, DAY = 60000, 86400
local MINUTE_TTL, DAY_TTL = 120, 172800
-- A day lasts at most 25 hours and a month 31 days: their keys outlive
-- them by two days at least, for the settlements of long responses.
local BUDGET_DAY_TTL, BUDGET_MONTH_TTL = 259200, 5443200
-- By charge class, in the order of the charges: minute windows, day
-- windows, day budgets, month budgets.
local CHARGE_TTL = {MINUTE_TTL, DAY_TTL, BUDGET_DAY_TTL, BUDGET_MONTH_TTL}
-- window.go's numbering: a windowKind counts kind % KINDS, and from KINDS
-- on over a day. A reservation's sizes are indexed by what they count:
-- TOKENS, INPUT, OUTPUT, and COST (a budget's).
local KINDS, REQUESTS, TOKENS, INPUT, OUTPUT, COST = 4, 0, 1, 2, 3, 4
-- parts.go's numbering of a limit's parts after its windows (0 to 7).
local BUCKET, SLOTS, DAY_BUDGET, LEARNED, FLOORS, NOTIFY = 8, 9, 10, 12, 13, 14
-- learned.go's quotas a limit learns of the provider: requests, then the
-- token quotas, whose number k is the part of a reservation each counts
-- (TOKENS, INPUT, OUTPUT).
local NUM_LEARNED = 4
-- A token bucket counts micro-tokens: its rate, in milli-tokens per
-- second, then refills a whole number of them each millisecond.
local MICRO = 1000000
-- ARGV[1] to ARGV[13], before the charges.
local FIXED_ARGS = 13

-- The functions take the call's state as arguments: Redis runs the
-- script's body on each call, which makes its closures anew, and each local
-- that a closure captures costs about 400 instructions (callgrind). Reading
-- the limits and deciding the admissions stay inline: they use most of the
-- state, and the decision as a function cost 3 to 5% more instructions per
-- call (bench/README.md).

-- Charges come before the reads, so that the call's admissions read them;
-- class_charges[c] is how many there are of charge class c, in order.
-- Only the increment that creates a key sets its expiry. A charge of 0
-- (a key declared for a settlement's restore, whose response used what it
-- reserved) changes nothing, and costs no command.
local function charge_counters(first_key, first_arg, class_charges)
  local charge = 0
  for class = 1, #class_charges do
    local ttl = CHARGE_TTL[class]
    for _ = 1, class_charges[class] do
      charge = charge + 1
      local key, amount = KEYS[first_key + charge], ARGV[first_arg + charge]
      if amount ~= '0' then
        local total = redis.call('INCRBY', key, amount)
        if total == amount + 0 then redis.call('EXPIRE', key, ttl) end
        if total < 0 then redis.call('SET', key, 0, 'KEEPTTL') end
      end
    end
  end
end

-- Restores come before the charges: a limit reset after the admission of
-- a reservation (its reset key, which holds when, is later) has lost it
-- from its windows, and its settlement's charge would take from what
-- others hold. The reset keys are read at once, and the settlements' only
-- when a limit was reset after the earliest of their admissions, which is
-- rare. A settlement restores what it reserved to the window's key, its
-- charge's, which lives as long as its charge class's (a minute window's
-- before a day window's).
local function restore_reservations(first_key, charges, reset_keys, first_arg, last_arg, minute_charges)
  local resets = redis.call('MGET', unpack(KEYS, first_key + charges + 1, first_key + charges + reset_keys))
  local latest = 0
  for r = 1, reset_keys do
    resets[r] = tonumber(resets[r] or 0)
    if resets[r] > latest then latest = resets[r] end
  end
  if latest <= tonumber(ARGV[first_arg], 16) then return end
  local at = first_arg + 1
  while at <= last_arg do
    local admitted, windows, sizes = tonumber(ARGV[at], 16), ARGV[at + 1], 0
    for w = 1, #windows, 9 do
      local c1, c2, c3, r1, r2, r3, s1, s2, s3 = byte(windows, w, w + 8)
      local size = (s1 * 256 + s2) * 256 + s3
      if size > sizes then sizes = size end
      if resets[(r1 * 256 + r2) * 256 + r3] > admitted then
        local charge = (c1 * 256 + c2) * 256 + c3
        local key, amount = KEYS[first_key + charge], ARGV[at + 1 + size]
        if redis.call('INCRBY', key, amount) == amount + 0 then
          redis.call('EXPIRE', key, CHARGE_TTL[charge <= minute_charges and 1 or 2])
        end
      end
    end
    at = at + 2 + sizes
  end
end

-- Frees holder's slots, before the reads, so that the call's admissions
-- can take them. A holding whose lease has ended holds nothing to free.
local function free_slots(first_key, first_arg, frees, holder, now)
  for free = 1, frees do
    local key = KEYS[first_key + free]
    local holding = redis.call('HGET', key, holder)
    if holding then
      local slots, lease_end = match(holding, '^(%d+):(%d+)$')
      local left = slots and slots - tonumber(ARGV[first_arg + free], 16)
      if left and left > 0 and lease_end + 0 > now then
        redis.call('HSET', key, holder, format('%d:%s', left, lease_end))
      else
        redis.call('HDEL', key, holder)
      end
    end
  end
end

-- Returns the slots of every holder of key whose lease has not ended, and
-- holder's own with the end of their lease (0 for none); the holdings whose
-- lease has ended are removed, unless the call only reads (clean is false).
local function read_slots(key, holder, now, clean)
  local holdings = redis.call('HGETALL', key)
  local in_flight, own, own_end = 0, 0, 0
  for h = 1, #holdings, 2 do
    local slots, lease_end = match(holdings[h + 1], '^(%d+):(%d+)$')
    if slots and lease_end + 0 > now then
      in_flight = in_flight + slots
      if holdings[h] == holder then own, own_end = slots + 0, lease_end + 0 end
    elseif clean then
      redis.call('HDEL', key, holdings[h])
    end
  end
  return in_flight, own, own_end
end

-- Makes key live at least ttl milliseconds more, never less than it does:
-- another holder's lease may be longer. (A key without an expiry has a
-- PTTL of -1.)
local function expire_at_least(key, ttl)
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end

-- Returns the distinct caps read from ARGV[at] on, each a table of named
-- fields: windows, flat, each window's windowKind and cap; rate, burst and
-- cost, a token bucket's (rate 0: none); slots and lease, the cap on
-- requests in flight and a slot's lease (slots 0: none); budgets, flat,
-- each budget's period (0 a day, 1 a month) and cap, nil for none; learn,
-- whether it learns the provider's quota; and shadow. Then the caps of each limit, whether any caps have a budget, and
-- the argument after them.
local function read_caps(at, count)
  local budgeted = false
  local caps = {}
  for position = 1, count do
    local shadow, parts = ARGV[at] == '1', {byte(ARGV[at + 1], 1, -1)}
    at = at + 2
    local windows, window_count, budgets = {}, 0, nil
    local rate, burst, cost, slots, lease, learn, floors, notify = 0, 0, 0, 0, 0, nil, nil, nil
    for p = 1, #parts do
      local part = parts[p]
      if part < BUCKET then
        windows[window_count + 1], windows[window_count + 2] = part, tonumber(ARGV[at], 16)
        window_count, at = window_count + 2, at + 1
      elseif part == BUCKET then
        rate, burst, cost = tonumber(ARGV[at], 16), tonumber(ARGV[at + 1], 16), tonumber(ARGV[at + 2], 16)
        at = at + 3
      elseif part == SLOTS then
        slots, lease = tonumber(ARGV[at], 16), tonumber(ARGV[at + 1], 16)
        at = at + 2
      elseif part == LEARNED then
        learn = true
      elseif part == NOTIFY then
        -- Per cap it watches (each part before LEARNED), in order: a
        -- budget's current period, then the level of each fraction.
        local n, mask = tonumber(ARGV[at], 16), 0
        at = at + 1
        notify = {}
        for q = 1, #parts do
          local watched = parts[q]
          if watched < LEARNED then
            mask = mask + 2 ^ watched
            local spec = {watched, 0}
            if watched >= DAY_BUDGET then
              spec[2], at = tonumber(ARGV[at], 16), at + 1
            end
            for i = 1, n do spec[2 + i] = tonumber(ARGV[at + i - 1], 16) end
            notify[#notify + 1], at = spec, at + n
          end
        end
        notify.mask = format('%x', mask)
      elseif part == FLOORS then
        floors = {byte(ARGV[at], 1, -1)}
        at = at + 1
      else
        budgets = budgets or {}
        budgets[#budgets + 1] = part - DAY_BUDGET
        budgets[#budgets + 1] = tonumber(ARGV[at], 16)
        at, budgeted = at + 1, true
      end
    end
    caps[position] = {windows = windows, rate = rate, burst = burst, cost = cost, slots = slots, lease = lease, budgets = budgets, shadow = shadow}
    -- Set apart: a ninth field doubles a table's hash part, which every
    -- set of caps would pay for the few that learn.
    if learn then caps[position].learn = true end
    if floors then caps[position].floors = floors end
    if notify then caps[position].notify = notify end
  end
  return caps, {byte(ARGV[at], 1, -1)}, {byte(ARGV[at + 1], 1, -1)}, budgeted, at + 2
end

-- The floors' functions (floors.go), made by floors_functions only in a
-- call that has a limit with floors: a closure made on every call costs
-- Redis about 2k instructions, and one that captures the script's locals
-- more, so these capture none of them and take the constants they share
-- with the script as arguments.
local function floors_functions(MICRO, KINDS, REQUESTS, MINUTE_TTL, DAY_TTL)
  local floor, format = math.floor, string.format
  -- floors.go's: how long a class asks after its last request, and how long
  -- a floors key lives after its last write (a day: it matters much less
  -- long, and a later write scales what it holds to the deficits then).
  local ASKING, FLOORS_TTL = 10000, 86400

  -- Returns what a floors key's text holds (floors.go's floorState): when
  -- each of the classes last asked, then each of the deficit shares' basis,
  -- then each class's part of each, flat; all zero for a text of another
  -- shape (its floors changed).
  local function read_floors(text, classes, shares)
    local fields, n = {}, 0
    for field in string.gmatch(text or '', '%x+') do
      n = n + 1
      fields[n] = tonumber(field, 16)
    end
    local want = classes + shares + classes * shares
    if n ~= want then
      for i = 1, want do fields[i] = 0 end
    end
    return fields
  end

  -- Returns what the floors of the classes other than class that ask at now
  -- hold of a share whose capacity is cap (counted in units of scale each):
  -- each floor's percent of it, whole, less what its class uses of it
  -- (usage), if that is less; and the class that holds the most
  -- (floors.go's floorHeld).
  local function floor_held(floors, state, class, cap, scale, usage, now)
    local held, by, most = 0, 0, 0
    for i = 1, #floors do
      local asked = state[i]
      if i ~= class and asked > 0 and now < asked + ASKING then
        local h = floor(floors[i] * cap / 100) * scale - usage[i]
        if h > 0 then
          held = held + h
          if h > most then most, by = h, i end
        end
      end
    end
    return held, by
  end

  -- Returns a class's part d of a deficit share whose total was basis, now
  -- that its total is total: in proportion when the total fell
  -- (floors.go's scaledDeficit).
  local function scaled_deficit(d, total, basis)
    if total >= basis then return d end
    return floor(d * (total / basis))
  end

  -- Returns what the floors of fl hold of its deficit share d (the bucket,
  -- then each learned quota), whose total is total now and whose capacity
  -- cap, and adds it to fl's reply; keeps, for the write, the total and each
  -- class's part now, and what an admission takes of it: per_request
  -- millionths (the bucket's cost, a request), or what it reserves on token
  -- window window.
  local function floor_deficit(fl, floors, d, total, cap, per_request, window, now)
    local state, classes, shares = fl.state, #floors, fl.shares
    local usage = {}
    for i = 1, classes do
      usage[i] = scaled_deficit(state[classes + shares + (i - 1) * shares + d], total, state[classes + d])
    end
    local held, by = floor_held(floors, state, fl.class, cap, MICRO, usage, now)
    fl.reply[#fl.reply + 1], fl.reply[#fl.reply + 2] = held, by
    fl.deficits[d] = {total, usage, per_request, window}
    return held
  end

  -- Writes the state of each limit of floored back, whether its class was
  -- admitted or not (a class that is refused asks too): the class's windows
  -- count what it was admitted, as the limit's do; the floors key, when
  -- each class last asked, and each deficit share's total after the call
  -- (its basis) with each class's part of it refilled to now, and what the
  -- class took added to its own.
  local function write_floors(floored, caps, caps_of, requests_added, token_reserved, now)
    for limit, fl in pairs(floored) do
      local floors = caps[caps_of[limit]].floors
      local class, state, classes, shares, admitted = fl.class, fl.state, #floors, fl.shares, requests_added[limit]
      if class > 0 then
        state[class] = now
        for j = 1, #fl.windows do
          local kind, window = fl.windows[j][1], fl.windows[j][2]
          local n = admitted
          if kind % KINDS ~= REQUESTS then n = window and token_reserved[window] or 0 end
          if n > 0 then
            local key = KEYS[fl.base + (class - 1) * 2 * #fl.windows + 2 * (j - 1)]
            if redis.call('INCRBY', key, format('%d', n)) == n then redis.call('EXPIRE', key, kind >= KINDS and DAY_TTL or MINUTE_TTL) end
          end
        end
      end
      for d = 1, shares do
        local share, basis = fl.deficits[d], 0
        local taken = 0
        if share then
          if share[4] then taken = token_reserved[share[4]] * MICRO else taken = admitted * share[3] end
          basis = share[1] + taken
        end
        state[classes + d] = basis
        for i = 1, classes do
          local part = 0
          if share then
            part = share[2][i]
            if i == class then part = part + taken end
          end
          state[classes + shares + (i - 1) * shares + d] = part
        end
      end
      local text = {}
      for f = 1, #state do text[f] = format('%x', state[f]) end
      redis.call('SET', KEYS[fl.text_key], table.concat(text, ':'), 'EX', FLOORS_TTL)
    end
  end

  -- Adds to reply, which holds reply_len numbers, what the floors of fl
  -- hold of each share and by which class, then until when the classes
  -- that hold anything ask (at least now); returns its length then.
  local function reply_floors(fl, reply, reply_len, now)
    local until_ms = now
    for r = 1, #fl.reply, 2 do
      local by = fl.reply[r + 1]
      if fl.reply[r] > 0 and fl.state[by] + ASKING > until_ms then until_ms = fl.state[by] + ASKING end
      reply[reply_len + 1], reply[reply_len + 2] = fl.reply[r], by
      reply_len = reply_len + 2
    end
    reply[reply_len + 1] = until_ms
    return reply_len + 1
  end

  return read_floors, floor_held, floor_deficit, reply_floors, write_floors
end

-- Adds each limit's admissions to its request windows, its bucket and its
-- holder's slots (own_slots, whose lease ends at own_ends), walking the
-- keys in the order KEYS declares them. Only the increment that creates a
-- key sets its expiry. (INCR spares the conversion of a number argument to
-- a string.)
local function write_requests(limit_count, requests_added, caps, caps_of, buckets, own_slots, own_ends, holder, now)
  local key_index = 1
  for limit = 1, limit_count do
    local limit_caps = caps[caps_of[limit]]
    local windows = limit_caps.windows
    local admitted, bucket = requests_added[limit], buckets[limit]
    if admitted > 0 then
      for w = 1, #windows, 2 do
        local kind = windows[w]
        if kind % KINDS == REQUESTS then
          local key = KEYS[key_index + w - 1]
          if admitted == 1 and redis.call('INCR', key) == 1 or admitted > 1 and redis.call('INCRBY', key, admitted) == admitted then
            redis.call('EXPIRE', key, kind >= KINDS and DAY_TTL or MINUTE_TTL)
          end
        end
      end
      if bucket then
        local ttl, since, deficit, cost = bucket[1], bucket[2], bucket[3], bucket[4]
        redis.call('SET', KEYS[key_index + #windows], format('%d:%d', deficit + admitted * cost, since), 'PX', ttl)
      end
    end
    key_index = key_index + #windows
    if bucket then key_index = key_index + 1 end
    local own = own_slots[limit]
    if own then
      if admitted > 0 then
        local lease = limit_caps.lease
        local lease_end = now + lease
        if own_ends[limit] > lease_end then lease_end = own_ends[limit] end
        redis.call('HSET', KEYS[key_index], holder, format('%d:%d', own + admitted, lease_end))
        -- A holder's renewals keep the key alive while it holds slots:
        -- only the write that starts a holding makes it live longer.
        if own == 0 then expire_at_least(KEYS[key_index], 2 * lease) end
      end
      key_index = key_index + 1
    end
    -- Each budget's two keys: write_reservations writes what it reserves;
    -- the learned quota's: the end of the script.
    if limit_caps.budgets then key_index = key_index + #limit_caps.budgets end
    if limit_caps.learn then key_index = key_index + 1 end
    -- The floors' and the notify key: write_floors and write_notices
    -- write them.
    if limit_caps.floors then key_index = key_index + #limit_caps.floors * #windows + 1 end
    if limit_caps.notify then key_index = key_index + 1 end
  end
end

-- Adds what was reserved to each token window's current period and each
-- budget's reserved key. Only the increment that creates a key sets its
-- expiry.
local function write_reservations(token_windows, token_reserved, token_key, token_ttl)
  for window = 1, token_windows do
    local reserved = token_reserved[window]
    if reserved > 0 and token_key[window] then
      local key = KEYS[token_key[window]]
      if redis.call('INCRBY', key, format('%d', reserved)) == reserved then
        redis.call('EXPIRE', key, token_ttl[window])
      end
    end
  end
end

-- Writes what each limit of noticed reports of its caps (notify.go), the
-- admissions of the call, admitted or not, having seen their levels: how
-- many of its fractions each cap's level reached after them, or, for a
-- window or a budget in the period of its last report, as many as it held
-- if more. The key holds the mask of the parts it watches, then per part
-- its period * 16 + how many it reported, in hexadecimal after a ':'
-- each; it is written only when that changed (most calls change nothing,
-- and make no text), and lives as long as the longest-lived of its caps'
-- keys. What it held is in reply, where the reading put it.
local function write_notices(noticed, caps, caps_of, requests_added, token_reserved, reply)
  for limit, nc in pairs(noticed) do
    local specs, levels, at, added = caps[caps_of[limit]].notify, nc[2], nc[3], requests_added[limit]
    local text, ttl = nil, 0
    for pass = 1, 2 do
      local changed = false
      for j = 1, #specs do
        local spec, b = specs[j], 6 * (j - 1)
        local used = levels[b + 1] + levels[b + 2] * added
        if levels[b + 3] then used = used + token_reserved[levels[b + 3]] * levels[b + 4] end
        local reached, fractions = 0, #spec - 2
        while reached < fractions and used >= spec[3 + reached] do reached = reached + 1 end
        local period, was = levels[b + 5], reply[at + j]
        if period ~= 0 and floor(was / 16) == period and was % 16 > reached then reached = was % 16 end
        local state = period * 16 + reached
        if text then
          text[j + 1] = format('%x', state)
          if levels[b + 6] > ttl then ttl = levels[b + 6] end
        elseif state ~= was then
          changed = true
          break
        end
      end
      if text then
        redis.call('SET', KEYS[nc[1]], table.concat(text, ':'), 'EX', ttl)
      elseif not changed then
        break
      end
      text = {specs.mask}
    end
  end
end

local now = tonumber(ARGV[1], 16)
if not now then
  local time = redis.call('TIME')
  now = time[1] * 1000 + floor(time[2] / 1000)
end
local minute_period = floor(now / MINUTE)
if minute_period ~= tonumber(ARGV[2], 16) then
  return {-1, now}
end
-- What the previous period weighs now: the part of a period still to come.
local seconds = floor(now / 1000)
local minute_weight = MINUTE - (now - minute_period * MINUTE)
local day_weight = DAY - (seconds - floor(seconds / DAY) * DAY)
local day_period = floor(seconds / DAY)
local split = ARGV[3] == 's'
local reserving = split or ARGV[3] == 'r'
local charging = reserving or ARGV[3] == 'a'
local limit_count, caps_count, frees, holder = tonumber(ARGV[4], 16), tonumber(ARGV[9], 16), tonumber(ARGV[10], 16), ARGV[11]
local class_charges = {tonumber(ARGV[5], 16), tonumber(ARGV[6], 16), tonumber(ARGV[7], 16), tonumber(ARGV[8], 16)}
local charges = class_charges[1] + class_charges[2] + class_charges[3] + class_charges[4]
local reset_keys, restore_args = tonumber(ARGV[12], 16), tonumber(ARGV[13], 16)
local limit_keys = #KEYS - charges - reset_keys - frees

if reset_keys > 0 then
  restore_reservations(limit_keys, charges, reset_keys, FIXED_ARGS + charges + 1, FIXED_ARGS + charges + restore_args, class_charges[1])
end
if charges > 0 then charge_counters(limit_keys, FIXED_ARGS, class_charges) end
if frees > 0 then free_slots(limit_keys + charges + reset_keys, FIXED_ARGS + charges + restore_args, frees, holder, now) end
local counters = limit_keys > 0 and redis.call('MGET', unpack(KEYS, 1, limit_keys)) or {}
local caps, caps_of, classes_of, budgeted, admissions_at = read_caps(FIXED_ARGS + charges + restore_args + frees + 1, caps_count)

-- Per limit: requests_left, the whole requests that still fit (a request
-- takes 1), so that deciding an admission is one comparison per limit: the
-- least of its request windows' room, 0 if one of its token windows is full
-- (without reservations, tokens are charged after the fact, never by an
-- admission, so that holds for the whole call), and the requests its token
-- bucket holds and the slots free of its cap on requests in flight;
-- requests_added, the requests the call admitted; buckets, its token
-- bucket's {ttl, since, deficit, cost}, nil where it has none; own_slots,
-- the slots its holder holds, nil where it has no such cap, and own_ends,
-- when their lease ends.
-- The tables of a slot per limit are made whole, from the bytes of the
-- argument of each limit's caps, which they overwrite: Lua 5.1 has no
-- table.new, and a table grown an element at a time is rehashed at each
-- power of two (bench/README.md).
local per_limit = ARGV[admissions_at - 2]
local requests_left, requests_added, buckets, own_slots, own_ends = {byte(per_limit, 1, -1)}, {byte(per_limit, 1, -1)}, {}, {}, {}
-- learned, per limit that learns the provider's quota (nil until one
-- does): its key's index, its state as read, and for each quota that holds
-- anything back its base in the state, its deficit refilled to now and its
-- token window.
local learned
-- floored, per limit that has floors (nil until one does): what their
-- state holds (read_floors), the limit's class in the call, what they hold
-- of each share for the other classes, for the reply, and what writing
-- the state back needs: per window its kind and token window, per deficit
-- share its total and each class's part, refilled to now, and its token
-- window. The floors' functions are made by the first limit with floors.
local floored
-- noticed, per limit that notifies (nil until one does): its notify key's
-- index, each cap's level as read and what raises it, and where in the
-- reply what the key held is. A level is six numbers in a flat array: as
-- read, what an admitted request adds, the token window whose
-- reservations add to it (false: none) and their scale, the cap's period
-- (0: none), its key's time to live.
local noticed
local read_floors, floor_held, floor_deficit, reply_floors, write_floors
-- With reservations, each token window, and each budget, has a room of
-- its own too, in flat arrays rather than a table per window: token_room,
-- in its span's units times its length, token_scale (the length; a
-- budget's is 1), so that a reservation of r fits while token_room >= r *
-- token_scale, and at least 1; token_part, what of a reservation it counts
-- (TOKENS, INPUT, OUTPUT or COST); token_key, the key it reserves on;
-- token_ttl, that key's; token_reserved. Limit i's token windows are
-- first_token_window[i] to last_token_window[i]. Without reservations a
-- call makes none of these tables.
local token_room, token_scale, token_part, token_key, token_ttl, token_reserved, first_token_window, last_token_window
if reserving then
  -- Most limits have one token window: their tables are made whole too.
  token_room, token_scale, token_part, token_key = {byte(per_limit, 1, -1)}, {byte(per_limit, 1, -1)}, {byte(per_limit, 1, -1)}, {byte(per_limit, 1, -1)}
  token_ttl, token_reserved, first_token_window, last_token_window = {byte(per_limit, 1, -1)}, {byte(per_limit, 1, -1)}, {byte(per_limit, 1, -1)}, {byte(per_limit, 1, -1)}
end
local token_windows = 0
-- The reply gets the counts as read.
local reply, reply_len = {1, now}, 2
local infinity = 1 / 0
local key_index = 1
for limit = 1, limit_count do
  local limit_caps = caps[caps_of[limit]]
  local windows, rate = limit_caps.windows, limit_caps.rate
  local room = infinity
  if reserving then first_token_window[limit] = token_windows + 1 end
  -- The floors' keys follow every other part's: each class's windows, a
  -- current and a previous period each, then the floors key.
  local floors, fl = limit_caps.floors, nil
  local levels = limit_caps.notify and {}
  if floors then
    if not read_floors then
      read_floors, floor_held, floor_deficit, reply_floors, write_floors = floors_functions(MICRO, KINDS, REQUESTS, MINUTE_TTL, DAY_TTL)
    end
    local shares = (rate > 0 and 1 or 0) + (limit_caps.learn and NUM_LEARNED or 0)
    local base = key_index + #windows + (rate > 0 and 1 or 0) + (limit_caps.slots > 0 and 1 or 0) + (limit_caps.budgets and #limit_caps.budgets or 0) + (limit_caps.learn and 1 or 0)
    local text_key = base + #floors * #windows
    fl = {class = classes_of[limit] or 0, base = base, text_key = text_key, shares = shares, state = read_floors(counters[text_key], #floors, shares), reply = {}, windows = {}, deficits = {}}
    floored = floored or {}
    floored[limit] = fl
  end
  for w = 1, #windows, 2 do
    local kind, cap = windows[w], windows[w + 1]
    local length, weight = MINUTE, minute_weight
    if kind >= KINDS then length, weight = DAY, day_weight end
    -- Arithmetic makes MGET's strings numbers, more cheaply than tonumber.
    local current, previous = (counters[key_index] or 0) + 0, (counters[key_index + 1] or 0) + 0
    -- Multiplied by length, so that every number is an integer.
    local slack = (cap - current) * length - previous * weight
    if fl then
      local usage = {}
      for i = 1, #floors do
        local at = fl.base + (i - 1) * #windows + w - 1
        usage[i] = (counters[at] or 0) * length + (counters[at + 1] or 0) * weight
      end
      local held, by = floor_held(floors, fl.state, fl.class, cap, length, usage, now)
      slack = slack - held
      fl.reply[#fl.reply + 1], fl.reply[#fl.reply + 2] = held, by
      fl.windows[#fl.windows + 1] = {kind, reserving and kind % KINDS ~= REQUESTS and token_windows + 1}
    end
    if kind % KINDS == REQUESTS then
      local requests_fit = floor(slack / length)
      if requests_fit * length > slack then requests_fit = requests_fit - 1 end -- a quotient rounded up
      if requests_fit < room then room = requests_fit end
    elseif reserving then
      token_windows = token_windows + 1
      token_room[token_windows], token_scale[token_windows], token_part[token_windows] = slack, length, kind % KINDS
      token_key[token_windows], token_ttl[token_windows], token_reserved[token_windows] = key_index, kind >= KINDS and DAY_TTL or MINUTE_TTL, 0
    elseif slack <= 0 then
      room = 0
    end
    if levels then
      local requests = kind % KINDS == REQUESTS
      local n = #levels
      levels[n + 1], levels[n + 2], levels[n + 3] = current * length + previous * weight, requests and length or 0, not requests and reserving and token_windows
      levels[n + 4], levels[n + 5], levels[n + 6] = length, kind >= KINDS and day_period or minute_period, kind >= KINDS and DAY_TTL or MINUTE_TTL
    end
    reply[reply_len + 1], reply[reply_len + 2] = current, previous
    reply_len = reply_len + 2
    key_index = key_index + 2
  end
  if rate > 0 then
    local burst, cost = limit_caps.burst, limit_caps.cost
    local since, max_deficit, cost_micro = now, (burst - cost) * MICRO, cost * MICRO
    local deficit = 0
    local stored_deficit, stored_at = string.match(counters[key_index] or '', '^(%d+):(%d+)$')
    if stored_deficit then
      deficit, stored_at = stored_deficit + 0, stored_at + 0
      if now > stored_at then
        deficit = deficit - (now - stored_at) * rate
        if deficit < 0 then deficit = 0 end
      else
        since = stored_at -- a clock gone back refills nothing
      end
    end
    local left = max_deficit - deficit
    if fl then left = left - floor_deficit(fl, floors, 1, deficit, burst, cost_micro, false, now) end
    local requests_fit = floor(left / cost_micro)
    if requests_fit * cost_micro > left then requests_fit = requests_fit - 1 end -- a quotient rounded up
    if requests_fit + 1 < room then room = requests_fit + 1 end
    -- Twice the time an empty bucket takes to fill, as Spring does: it is full by then.
    buckets[limit] = {2 * math.ceil(burst * MICRO / rate), since, deficit, cost_micro}
    if levels then
      local n = #levels
      levels[n + 1], levels[n + 2], levels[n + 3], levels[n + 4], levels[n + 5], levels[n + 6] = deficit, cost_micro, false, 0, 0, math.ceil(buckets[limit][1] / 1000)
    end
    reply_len = reply_len + 1
    reply[reply_len] = deficit
    key_index = key_index + 1
  end
  local slots = limit_caps.slots
  if slots > 0 then
    local in_flight, own, own_end = read_slots(KEYS[key_index], holder, now, charging)
    if slots - in_flight < room then room = slots - in_flight end
    own_slots[limit], own_ends[limit] = own, own_end
    if levels then
      local n = #levels
      levels[n + 1], levels[n + 2], levels[n + 3], levels[n + 4], levels[n + 5], levels[n + 6] = in_flight, 1, false, 0, 0, DAY_TTL
    end
    reply_len = reply_len + 1
    reply[reply_len] = in_flight
    key_index = key_index + 1
  end
  local budgets = limit_caps.budgets
  for b = 1, budgets and #budgets or 0, 2 do
    local period, budget = budgets[b], budgets[b + 1]
    local spent, reserved = (counters[key_index] or 0) + 0, (counters[key_index + 1] or 0) + 0
    local slack = budget - spent - reserved
    if reserving then
      token_windows = token_windows + 1
      token_room[token_windows], token_scale[token_windows], token_part[token_windows] = slack, 1, COST
      token_key[token_windows], token_ttl[token_windows], token_reserved[token_windows] = key_index + 1, CHARGE_TTL[3 + period], 0
    elseif slack <= 0 then
      room = 0
    end
    if levels then
      local n = #levels
      levels[n + 1], levels[n + 2], levels[n + 3] = spent + reserved, 0, reserving and token_windows
      levels[n + 4], levels[n + 5], levels[n + 6] = 1, limit_caps.notify[n / 6 + 1][2], CHARGE_TTL[3 + period]
    end
    reply[reply_len + 1], reply[reply_len + 2] = spent, reserved
    reply_len = reply_len + 2
    key_index = key_index + 2
  end
  if limit_caps.learn then
    -- The provider's quota as learned: paused, none of it fits; each quota
    -- that holds anything back until its end fits as a bucket refilled to
    -- now, the requests quota in whole requests, the token quotas as the
    -- token windows do (learned.go). Only the quotas that hold are read.
    local head, segments, paused, paused_from, quotas = nil, nil, 0, 0, {}
    if counters[key_index] then
      local s1, s2, s3, s4
      head, s1, s2, s3, s4 = match(counters[key_index], '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
      local p, f = match(head or '', '^(%x+):(%x+)$')
      if p then -- a key of another shape holds nothing
        segments, paused, paused_from = {s1, s2, s3, s4}, tonumber(p, 16), tonumber(f, 16)
      end
    end
    if paused > now then room = 0 end
    reply[reply_len + 1], reply[reply_len + 2] = paused, paused_from
    reply_len = reply_len + 2
    for k = 0, NUM_LEARNED - 1 do
      local quota_limit, deficit, rate_pico, quota_until, reported, from = 0, 0, 0, 0, 0, 0
      local limit_text, deficit_text, at_text, rate_text, until_text, reported_text, from_text
      if segments then
        limit_text, deficit_text, at_text, rate_text, until_text, reported_text, from_text = match(segments[k + 1], '^(%x+):(%x+):(%x+):([^:]+):(%x+):(%x+):(%x+)$')
      end
      if limit_text and limit_text ~= '0' and now < tonumber(until_text, 16) then
        local rate = tonumber(rate_text)
        quota_limit, deficit, quota_until = tonumber(limit_text, 16), tonumber(deficit_text, 16), tonumber(until_text, 16)
        reported, from = tonumber(reported_text, 16), tonumber(from_text, 16)
        local elapsed = now - tonumber(at_text, 16)
        if elapsed > 0 then
          deficit = deficit - floor(rate * elapsed)
          if deficit < 0 then deficit = 0 end
        end
        rate_pico = floor(rate * 1000000)
        local slack, window = quota_limit * MICRO - deficit, false
        if fl then slack = slack - floor_deficit(fl, floors, fl.shares - NUM_LEARNED + k + 1, deficit, quota_limit, k == 0 and MICRO or 0, k > 0 and reserving and token_windows + 1, now) end
        if k == 0 then
          local requests_fit = floor(slack / MICRO)
          if requests_fit * MICRO > slack then requests_fit = requests_fit - 1 end -- a quotient rounded up
          if requests_fit < room then room = requests_fit end
        elseif reserving then
          token_windows = token_windows + 1
          token_room[token_windows], token_scale[token_windows], token_part[token_windows] = slack, MICRO, k
          token_key[token_windows], token_ttl[token_windows], token_reserved[token_windows] = false, false, 0
          window = token_windows
        elseif slack <= 0 then
          room = 0
        end
        -- What writing the quota back needs: its deficit refilled to now,
        -- its token window, and its fields as they are.
        quotas[#quotas + 1] = {k + 1, deficit, window, quota_limit, tonumber(at_text, 16), rate_text, quota_until, reported, from}
      elseif fl then
        fl.reply[#fl.reply + 1], fl.reply[#fl.reply + 2] = 0, 0
      end
      reply[reply_len + 1], reply[reply_len + 2], reply[reply_len + 3], reply[reply_len + 4], reply[reply_len + 5], reply[reply_len + 6] = quota_limit, deficit, rate_pico, quota_until, reported, from
      reply_len = reply_len + 6
    end
    learned = learned or {}
    learned[limit] = {key_index, head, segments, quotas}
    key_index = key_index + 1
  end
  if fl then
    reply_len = reply_floors(fl, reply, reply_len, now)
    key_index = fl.text_key + 1
  end
  if levels then
    -- What the key holds, if it watches the parts the limit has now.
    local specs, at = limit_caps.notify, reply_len
    for j = 1, #specs do reply[at + j] = 0 end
    local mask, states = match(counters[key_index] or '', '^(%x+):(.*)$')
    if mask == specs.mask then
      local j = at
      for state in string.gmatch(states, '%x+') do
        j = j + 1
        reply[j] = tonumber(state, 16)
      end
      if j ~= at + #specs then
        for i = 1, #specs do reply[at + i] = 0 end
      end
    end
    reply_len = reply_len + #specs
    noticed = noticed or {}
    noticed[limit] = {key_index, levels, at}
    key_index = key_index + 1
  end
  if reserving then last_token_window[limit] = token_windows end
  if limit_caps.shadow then
    -- A shadow limit is read and charged as the others, and refuses nothing.
    room = infinity
    if reserving then
      for window = first_token_window[limit], token_windows do token_room[window] = infinity end
    end
  end
  requests_left[limit], requests_added[limit] = room, 0
end

-- An admission's arguments: its tokens, its cost, its chain.
local token_args = split and 3 or reserving and 1 or 0
local cost_args = reserving and budgeted and 1 or 0
local admission_args = token_args + cost_args + 1
-- reservation[part]: what the admission being decided adds to a token
-- window or a budget that counts that part.
local reservation = reserving and {0, 0, 0, 0}
for at = admissions_at, #ARGV, admission_args do
  local chain = {byte(ARGV[at + admission_args - 1], 1, -1)}
  if reserving then
    reservation[TOKENS] = tonumber(ARGV[at], 16)
  end
  if split then
    reservation[INPUT], reservation[OUTPUT] = tonumber(ARGV[at + 1], 16), tonumber(ARGV[at + 2], 16)
  end
  if cost_args > 0 then
    reservation[COST] = tonumber(ARGV[at + token_args], 16)
  end
  local fits = 1
  for position = 1, #chain do
    local limit = chain[position]
    if requests_left[limit] < 1 then
      fits = 0
      break
    end
    if reserving then
      for window = first_token_window[limit], last_token_window[limit] do
        local size = reservation[token_part[window]]
        -- Without anything of its part to reserve, a window or a budget
        -- takes a request while it is below its cap.
        if token_room[window] < (size > 0 and size * token_scale[window] or 1) then
          fits = 0
          break
        end
      end
      if fits == 0 then break end
    end
  end
  if fits == 1 and charging then
    for position = 1, #chain do
      local limit = chain[position]
      requests_left[limit], requests_added[limit] = requests_left[limit] - 1, requests_added[limit] + 1
      if reserving then
        for window = first_token_window[limit], last_token_window[limit] do
          local size = reservation[token_part[window]]
          token_room[window] = token_room[window] - size * token_scale[window]
          token_reserved[window] = token_reserved[window] + size
        end
      end
    end
  end
  reply_len = reply_len + 1
  reply[reply_len] = fits
end

if charging then
  write_requests(limit_count, requests_added, caps, caps_of, buckets, own_slots, own_ends, holder, now)
  if reserving then write_reservations(token_windows, token_reserved, token_key, token_ttl) end
  -- What each limit's admissions took of the learned quotas that hold
  -- anything back: a request each from its requests quota, and what they
  -- reserved from its token quotas, on the deficits refilled to now
  -- (learned.go's admitted); the key keeps its expiry.
  if learned then
    for limit, l in pairs(learned) do
      local segments, quotas, changed = l[3], l[4], false
      for q = 1, #quotas do
        local quota = quotas[q]
        local taken = 0
        if quota[1] == 1 then taken = requests_added[limit] elseif quota[3] then taken = token_reserved[quota[3]] end
        if taken > 0 then
          local at = quota[5]
          if now > at then at = now end
          segments[quota[1]] = format('%x:%x:%x:%s:%x:%x:%x', quota[4], quota[2] + taken * MICRO, at, quota[6], quota[7], quota[8], quota[9])
          changed = true
        end
      end
      if changed then
        redis.call('SET', KEYS[l[1]], l[2] .. '|' .. table.concat(segments, '|'), 'KEEPTTL')
      end
    end
  end
  if floored then write_floors(floored, caps, caps_of, requests_added, token_reserved, now) end
  if noticed then write_notices(noticed, caps, caps_of, requests_added, token_reserved, reply) end
end
return reply
