-- admit_booking.lua: included by admit.lua (a line "-- include: admit_booking"), after
-- gcra.lua and the constants MARGIN_S and CREDIT_TOLERANCE; not a script of its own.

-- include: quota_floors

-- The soonest slot the quota buckets of one of `bookable` ({candidate i, dims} each:
-- refused by quota buckets alone; a dim is {tat, cost, limit, key, field}) give a new
-- booking (core.quota.gcra_book): the candidate's entry and the slot.
local function fresh_slot(bookable, now)
  local best, best_slot = nil, nil
  for _, b in ipairs(bookable) do
    local at = now
    for _, d in ipairs(b[2]) do
      at = math.max(at, now + math.max(d[1] - now, 0) + charge_s(d[2], d[3]) - 60.0)
    end
    if best_slot == nil or at < best_slot then best, best_slot = b, at end
  end
  return best, best_slot
end

-- Book the soonest slot (`fresh_slot`) if within `book_within` seconds: its buckets are
-- charged as at that slot, and the booking is kept in the candidate's alive ZSET
-- (KEYS[6i]) as `booking_at(i)` -> the slot plus `claim_s`. Returns the seconds until
-- the slot, or nil when none is soon enough.
local function book(bookable, now, book_within, claim_s, booking_at)
  local best, best_slot = fresh_slot(bookable, now)
  if best_slot - now > book_within then return nil end
  for _, d in ipairs(best[2]) do
    local tat = math.max(d[1], best_slot + MARGIN_S) + charge_s(d[2], d[3])
    redis.call('HSET', d[4], d[5], fmt(tat))
  end
  local alive = KEYS[6 * best[1]]
  redis.call('ZREMRANGEBYSCORE', alive, '-inf', now)  -- lapsed bookings and claims
  redis.call('ZADD', alive, best_slot + claim_s, booking_at(best[1]))
  return best_slot - now
end

-- A slot ahead that a waiter of a class this caller's is served before booked at one of
-- `bookable`'s candidates ({candidate i, dims, its credits} each), or a call of this
-- caller's class it comes before (core.standing.takes_later: a later one, `arrival` the
-- caller's, given: first come, first served within a class, so a call asking again
-- after a failed attempt keeps its place; between calls of tenants, one of a higher
-- tag, `tag_at(i)` the caller's at candidate i), sooner than a new booking would be
-- and within `book_within` seconds: taken for this caller (SPEC §8). Of two classes, a
-- slot goes to one owed a slot at that candidate (`floors`: the classes' min_share, ""
-- for none; quota_floors.lua's slot_goes_to), else the higher (the lower rank). The
-- booking moves to this caller (`booking_at(i)`), its quota paid already (the token
-- buckets charged for this caller's estimate `est` instead of the booker's: settle
-- corrects from it); the waiter it was taken from goes into `robbed`, to be booked
-- anew at once and told (rebook, below: taking, in turn, the slot of the next call of
-- its class it comes before).
-- A slot of another class is taken before a later call's of the caller's own (a call
-- owed a slot for its class's floor takes it from the class above, not from its own).
-- On a quota of tokens, the bucket has room at a slot for its booker's tokens: a caller
-- of a larger estimate taking it is admitted later by the difference, and every booking
-- after the slot moves as much later (they were placed after the booker's tokens; their
-- bookers are told, tell_moved). On a quota shared with other sources, whose bookings
-- cannot be moved from here, such a slot is not taken. A smaller caller's tokens hand
-- the difference back only as far as the bookings ahead allow (below), and on a shared
-- quota not at all.
-- A booking is "@<origin>:<call> <rank> <claim s> <est> <arrival> <tag>" in the
-- candidate's alive set, scored by its slot plus that claim; waiters' claims score at most now plus theirs, so
-- the bookings ahead are those scored above now plus this caller's claim, and the
-- `TAKE_SCAN` soonest of them are looked at (as the memory store does). A `plain`
-- caller (one class at most, ARGV[9] "") takes a later call's slot only. Seconds until
-- the slot, or nil.
local TAKE_SCAN = 32

-- Tell the booker of `member` (one this version booked: "@<origin>:<call> ...") that its
-- slot at candidate `name` is now `in_s` seconds ahead: a message on its process's
-- wake-up channel (ARGV[13]), "<call> <name> <in_s>"; it waits on for it instead of
-- asking at its old slot to learn it.
local function tell_moved(member, name, in_s)
  local origin, call = string.match(member, '^@(%x+):(%S+) ')
  if origin then redis.call('PUBLISH', ARGV[13] .. origin,
    call .. ' ' .. name .. ' ' .. fmt(in_s)) end
end

local function take_booked(bookable, now, book_within, rank, floors, claim_s, booking_at,
                           est, arrival, plain, tag_at, robbed, fits)
  local fl = floors_of(floors)
  local bests = {{}, {}}  -- another class's soonest slot, and a later call's of its own
  for _, b in ipairs(bookable) do
    local ahead = redis.call('ZRANGEBYSCORE', KEYS[6 * b[1]], '(' .. fmt(now + claim_s),
      '+inf', 'WITHSCORES', 'LIMIT', 0, TAKE_SCAN)
    local credits = credits_of(b[3], fl)
    local mine = tonumber((tag_at(b[1])))  -- (nil: no tenant)
    -- its token buckets, and whether the bookings after a slot may move later: not on a
    -- quota shared with other sources (their bookings are not in this alive set)
    local tokens, movable = {}, true
    local own = ':quota:source:' .. ARGV[T + 6 * b[1] - 5]
    for _, d in ipairs(b[2]) do
      if d[5] == 'tok' or d[5] == 'ltok' then tokens[#tokens + 1] = d end
      if d[5] == 'tok' and string.sub(d[4], -#own) ~= own then movable = false end
    end
    b.own = movable
    local first = {}  -- another class -> whether this caller's is served before it here
    for k = 1, #ahead, 2 do
      local r, claim, booker_est, booker_arrival, booker_tag =
        string.match(ahead[k], '^@%S+ (%d+) (%S+) (%d+) (-?%d+) (%S+)$')
      r = tonumber(r)
      if r and r ~= rank and first[r] == nil then  -- (a plain caller takes no other's)
        first[r] = not plain and slot_goes_to(rank, r, credits, fl) == rank
      end
      -- how much later than the slot the bucket has room for this caller's tokens (a
      -- waiter's claim in the alive set, not a booking, is passed over)
      local shift = 0
      for _, d in ipairs(r and tokens or NONE) do
        shift = math.max(shift, charge_s(est, d[3]) - charge_s(tonumber(booker_est), d[3]))
      end
      local which = nil
      if r and shift > 0 and (fits or not movable) then
        which = nil  -- the bucket has room at that slot for the booker's tokens alone
      elseif r and r ~= rank and first[r] then
        which = bests[1]
      elseif r == rank then  -- core.standing.takes_later
        local theirs = tonumber(booker_tag)
        if mine ~= nil or theirs ~= nil then
          if mine ~= nil and theirs ~= nil and theirs > mine then which = bests[2] end
        elseif arrival ~= nil and tonumber(booker_arrival) > arrival then
          which = bests[2]
        end
      end
      if which then
        local slot = tonumber(ahead[k + 1]) - tonumber(claim)
        if slot > now and (which.slot == nil or slot + shift < which.slot) then
          which.b, which.member, which.slot = b, ahead[k], slot + shift
          which.est, which.shift, which.rank = tonumber(booker_est), shift, r
        end
      end
    end
  end
  -- Another class's first (the classes' order and floors come before the order within
  -- one), if soon enough: no later than a new booking, and within `book_within`.
  local _, fresh = fresh_slot(bookable, now)
  local pick = nil
  for _, which in ipairs(bests) do
    if pick == nil and which.slot and which.slot - now <= book_within and which.slot <= fresh then
      pick = which
    end
  end
  if pick == nil then return nil end
  local best, best_member, best_slot, best_est = pick.b, pick.member, pick.slot, pick.est
  local alive = KEYS[6 * best[1]]
  if pick.shift > 0 then  -- the bookings after it move later, so this caller's tokens fit
    local taken = best_slot - pick.shift
    local after = redis.call('ZRANGEBYSCORE', alive, '(' .. fmt(taken), '+inf', 'WITHSCORES')
    for k = 1, #after, 2 do
      local claim = string.match(after[k], '^@%S+ %d+ (%S+) ')
      if claim and tonumber(after[k + 1]) - tonumber(claim) > taken then
        redis.call('ZADD', alive, tonumber(after[k + 1]) + pick.shift, after[k])
        tell_moved(after[k], ARGV[T + 6 * best[1] - 5],
          tonumber(after[k + 1]) - tonumber(claim) + pick.shift - now)
      end
    end
  end
  -- The token buckets: charged for this caller's estimate instead of the booker's. Fewer
  -- tokens hand the difference back only as far as the bookings ahead allow (their
  -- tokens from each one's slot on, the taken slot's now this caller's): handed back
  -- further, a later booking would land on top of them. Not at all on a bucket shared
  -- with other sources, whose bookings are not in this alive set.
  local bookings = nil
  for _, d in ipairs(best[2]) do
    if d[5] == 'tok' or d[5] == 'ltok' then
      local tat = d[1] + charge_s(est, d[3]) - charge_s(best_est, d[3])
      if tat < d[1] and d[5] == 'tok' and not best.own then
        tat = d[1]
      elseif tat < d[1] then
        if bookings == nil then
          bookings = {}
          local all = redis.call('ZRANGEBYSCORE', alive, '(' .. fmt(now), '+inf', 'WITHSCORES')
          for k = 1, #all, 2 do
            local claim, e = string.match(all[k], '^@%S+ %d+ (%S+) (%d+) ')
            if claim then
              if all[k] == best_member then e = est end
              bookings[#bookings + 1] = {math.max(tonumber(all[k + 1]) - tonumber(claim), now),
                tonumber(e)}
            end
          end
          table.sort(bookings, function(x, y) return x[1] > y[1] end)
        end
        local after, least = 0, tat
        for _, booking in ipairs(bookings) do
          after = after + charge_s(booking[2], d[3])
          least = math.max(least, booking[1] + MARGIN_S + after)
        end
        tat = math.min(d[1], least)
      end
      redis.call('HSET', d[4], d[5], fmt(tat))
    end
  end
  redis.call('ZREM', alive, best_member)
  redis.call('ZADD', alive, best_slot + claim_s, booking_at(best[1]))
  -- its booker is booked anew at once (rebook), unless robbed by another class while its
  -- own has a floor: it may be owed a slot by the time it asks, and take one back then
  if pick.rank == rank or (fl[pick.rank + 1] or 0) <= 0 then
    robbed[#robbed + 1] = {best_member, best}
  end
  return best_slot - now
end

-- Book each booker `robbed` of its slot ({its booking, its candidate's entry in
-- bookable} each; see take_booked for the one left to ask) the slot it would take were
-- it to ask now (take_booked: the soonest
-- a call of its class it comes before booked, whose booker is booked anew in turn;
-- else a new one), and tell it (tell_moved): one message per moved booker where each
-- would ask once more (memory store: quota.rebook). At most `MOVES` per admission; a
-- booker left over, or one of another version, finds its slot gone when it asks
-- there, and books anew then. `est` the caller's estimate: a booker whose estimate is
-- 0 where the caller's is not (or the other way round) is charged to other buckets,
-- and left to ask. Its terms are the caller's (`floors`, `plain`: the scope's classes;
-- `book_within`: its horizon, the scope's stall window as the caller has it left) but
-- for its own place, estimate and claim, kept in its booking. It takes no slot that
-- would move the bookings after it (a larger booker's: those may be of calls served
-- before it, the caller's among them); with no slot within the horizon it is told to
-- ask now (0 s), and books with its own horizon then.
local MOVES = 32
local function rebook(robbed, now, book_within, floors, plain, est)
  for _ = 1, MOVES do
    local r = table.remove(robbed, 1)
    if not r then return end
    local member, b = r[1], r[2]
    local rank, claim, e, arr, tag = string.match(member,
      '^@%x+:%S+ (%d+) (%S+) (%d+) (-?%d+) (%S+)$')
    if rank and (tonumber(e) > 0) == (est > 0) then
      local dims = {}  -- its buckets as they stand now, charged for its estimate
      for _, d in ipairs(b[2]) do
        local cost = (d[5] == 'tok' or d[5] == 'ltok') and tonumber(e) or 1
        dims[#dims + 1] = {tonumber(redis.call('HGET', d[4], d[5]) or '-1e300'), cost, d[3],
          d[4], d[5]}
      end
      local mine = {{b[1], dims, b[3]}}
      local function at() return member end
      local function tag_at() return tag, false end
      local in_s = take_booked(mine, now, book_within, tonumber(rank), floors, tonumber(claim),
        at, tonumber(e), tonumber(arr), plain, tag_at, robbed, true)
        or book(mine, now, book_within, tonumber(claim), at)
      if in_s then
        tell_moved(member, ARGV[T + 6 * b[1] - 5], in_s)
      else  -- none within the caller's horizon: it asks at its old slot, and books then
        tell_moved(member, ARGV[T + 6 * b[1] - 5], 0)
      end
    end
  end
end
