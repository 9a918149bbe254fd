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

-- A booking ahead that this caller comes before, at one of `bookable`'s candidates
-- ({candidate i, dims, its credits} each): a waiter's of a class this caller's is served
-- before, or of a call of this caller's class it comes before (core.standing.takes_later:
-- a later one, `arrival` the caller's, given: first come, first served within a class,
-- so a call asking again after a failed attempt keeps its place; between calls of
-- tenants, one of a higher tag, `tag_at(i)` the caller's at candidate i), whose slot is
-- no later than a new booking's and within `book_within` seconds (SPEC §8). Of two
-- classes, a slot goes to one owed a slot at that candidate (`floors`: the classes'
-- min_share, "" for none; quota_floors.lua's slot_goes_to), else the higher (the lower
-- rank). Another class's booking comes before a later call's of the caller's own (a
-- call owed a slot for its class's floor takes it from the class above, not its own).
--
-- On the source's own buckets (declared for it alone, or learned), every booking charged
-- to them is in its alive set: the caller goes in at that slot (later by the difference
-- if its tokens are more than the booker's: the bucket has room there for the booker's),
-- charged as for a new booking, and that booking and every one after it move later by
-- the caller's charge; their bookers are told when they ask (one ask more each). On a
-- quota shared with other sources, whose bookings cannot be moved from here, it takes
-- the slot instead, when it has room for its tokens, the buckets charged already for
-- the booker's; the booker finds its booking gone when it asks at its slot, and books
-- anew (taking, in turn, the slot of the next call it comes before).
--
-- The caller's booking is `booking_at(i)`. A booking is "@<call> <rank> <claim s> <est>
-- <arrival> <tag>" in the candidate's alive set, scored by its slot plus that claim;
-- waiters' claims score at most now plus theirs, so the bookings ahead are those scored
-- above now plus this caller's claim, and the `TAKE_SCAN` soonest of them are looked at
-- (as the memory store does). A `plain` caller (one class at most, ARGV[9] "") comes
-- before a later call only. Seconds until the caller's slot, or nil.
local TAKE_SCAN = 32
local function take_booked(bookable, now, book_within, rank, floors, claim_s, booking_at,
                           est, arrival, plain, tag_at)
  local fl = floors_of(floors)
  local bests = {{}, {}}  -- another class's soonest slot, and a later call's of its own
  for _, b in ipairs(bookable) do
    local credits = credits_of(b[3], fl)
    local mine = tonumber((tag_at(b[1])))  -- (nil: no tenant)
    -- its token buckets, and whether its buckets are the source's own (declared for it
    -- alone, or learned): then every booking charged to them is in this alive set
    local tokens, own = {}, true
    local own_key = ':quota:source:' .. ARGV[T + 6 * b[1] - 5]
    for _, d in ipairs(b[2]) do
      if d[5] == 'tok' or d[5] == 'ltok' then tokens[#tokens + 1] = d end
      if (d[5] == 'tok' or d[5] == 'req') and string.sub(d[4], -#own_key) ~= own_key then
        own = false
      end
    end
    b.own = own
    local first = {}  -- another class -> whether this caller's is served before it here
    -- whether this caller comes before a booking of class `r`: another class's when its
    -- own is served first there; one of its class when that arrived later, or, between
    -- calls of tenants, is tagged after it (core.standing.takes_later)
    local function comes_before(r, booker_arrival, booker_tag)
      if r ~= rank then
        if first[r] == nil then  -- (a plain caller comes before no other class)
          first[r] = not plain and slot_goes_to(rank, r, credits, fl) == rank
        end
        return first[r]
      end
      local theirs = tonumber(booker_tag)
      if mine ~= nil or theirs ~= nil then
        return mine ~= nil and theirs ~= nil and theirs > mine
      end
      return arrival ~= nil and tonumber(booker_arrival) > arrival
    end
    -- how much later than a slot booked for `booked` tokens the bucket has room for its
    local function later_than(booked)
      local later = 0
      for _, d in ipairs(tokens) do
        later = math.max(later, charge_s(est, d[3]) - charge_s(tonumber(booked), d[3]))
      end
      return later
    end
    if own then
      -- Walking back from the last booking ahead: it goes in before the earliest of the
      -- bookings at the end that it comes before, never before one that comes before it.
      local back = redis.call('ZREVRANGEBYSCORE', KEYS[6 * b[1]], '+inf',
        '(' .. fmt(now + claim_s), 'WITHSCORES', 'LIMIT', 0, TAKE_SCAN)
      local at = nil
      for k = 1, #back, 2 do
        local r, claim, booker_est, booker_arrival, booker_tag =
          string.match(back[k], '^@%S+ (%d+) (%S+) (%d+) (-?%d+) (%S+)$')
        if r then  -- (a waiter's claim is no booking)
          if not comes_before(tonumber(r), booker_arrival, booker_tag) then break end
          local slot = tonumber(back[k + 1]) - tonumber(claim)
          if slot > now then at = {back[k], slot, booker_est} end
        end
      end
      if at then
        local slot = at[2] + later_than(at[3])
        if bests[1].slot == nil or slot < bests[1].slot then
          bests[1] = {b = b, member = at[1], slot = slot, booked = at[2]}
        end
      end
    else  -- the soonest booking it comes before, to take its slot
      local ahead = redis.call('ZRANGEBYSCORE', KEYS[6 * b[1]], '(' .. fmt(now + claim_s),
        '+inf', 'WITHSCORES', 'LIMIT', 0, TAKE_SCAN)
      for k = 1, #ahead, 2 do
        local r, claim, booker_est, booker_arrival, booker_tag =
          string.match(ahead[k], '^@%S+ (%d+) (%S+) (%d+) (-?%d+) (%S+)$')
        r = tonumber(r)
        local later = r and later_than(booker_est) or 0
        local which = nil
        if r and later > 0 then
          which = nil  -- the bucket has room at that slot for the booker's tokens alone
        elseif r and comes_before(r, booker_arrival, booker_tag) then
          which = r ~= rank and bests[1] or bests[2]
        end
        if which then
          local slot = tonumber(ahead[k + 1]) - tonumber(claim)
          if slot > now and (which.slot == nil or slot < which.slot) then
            which.b, which.member, which.slot, which.booked = b, ahead[k], slot, slot
          end
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
  local best = pick.b
  local alive = KEYS[6 * best[1]]
  if best.own then
    -- It goes in before that booking: the booking and every one after it move later by
    -- this caller's charge (the most any of its buckets moves by), and the buckets are
    -- charged for it as for a new booking. Their bookers are told when they ask.
    local by = 0
    for _, d in ipairs(best[2]) do by = math.max(by, charge_s(d[2], d[3])) end
    local after = redis.call('ZRANGEBYSCORE', alive, fmt(pick.booked), '+inf', 'WITHSCORES')
    for k = 1, #after, 2 do
      local claim = string.match(after[k], '^@%S+ %d+ (%S+) ')
      if claim and tonumber(after[k + 1]) - tonumber(claim) >= pick.booked then
        redis.call('ZADD', alive, tonumber(after[k + 1]) + by, after[k])
      end
    end
    for _, d in ipairs(best[2]) do
      redis.call('HSET', d[4], d[5], fmt(d[1] + charge_s(d[2], d[3])))
    end
  else
    -- A quota shared with other sources, whose bookings cannot be moved from here: it
    -- takes the slot, charged already for its booker's tokens (as many as its, or more);
    -- the booker finds its booking gone when it asks, and books anew.
    redis.call('ZREM', alive, pick.member)
  end
  redis.call('ZADD', alive, pick.slot + claim_s, booking_at(best[1]))
  return pick.slot - now
end
