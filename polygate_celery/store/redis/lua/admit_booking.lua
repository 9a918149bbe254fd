-- admit_booking.lua: included by admit.lua (a line "-- include: admit_booking"), after
-- gcra.lua and the constants MARGIN_S and DECAY; not a script of its own.

-- include: quota_floors

-- Book the soonest slot the quota buckets of one of `bookable` ({candidate i, dims}
-- each: refused by quota buckets alone) give (core.quota.gcra_book), if within
-- `book_within` seconds: its buckets are charged as at that slot, and the booking is
-- kept in the candidate's alive ZSET (KEYS[6i]) as `booked` -> the slot plus `claim_s`.
-- Returns the seconds until the slot, or nil when none is soon enough.
local function book(bookable, now, book_within, claim_s, booked)
  local best, best_slot = nil, nil
  for _, b in ipairs(bookable) do
    local at = now
    for _, d in ipairs(b[2]) do
      at = math.max(at, now + math.max(d[1] - now, 0) + charge_s(d[2], d[3]) - 60.0)
    end
    if best_slot == nil or at < best_slot then best, best_slot = b, at end
  end
  if best_slot - now > book_within then return nil end
  for _, d in ipairs(best[2]) do
    local tat = math.max(d[1], best_slot + MARGIN_S) + charge_s(d[2], d[3])
    redis.call('HSET', d[4], d[5], fmt(tat))
  end
  local alive = KEYS[6 * best[1]]
  redis.call('ZREMRANGEBYSCORE', alive, '-inf', now)  -- lapsed bookings and claims
  redis.call('ZADD', alive, best_slot + claim_s, booked)
  return best_slot - now
end

-- The soonest slot a waiter of a class below `rank` (a greater rank) booked at one of
-- `bookable`'s candidates and has not used, within `book_within` seconds: taken for
-- this caller (SPEC §8, a higher class is served first). The booking moves to
-- `booked`, its quota paid already; the waiter it was taken from finds it gone when
-- it asks at its slot, and books anew. A booking is "@<call> <rank> <claim s>" in the
-- candidate's alive set, scored by its slot plus that claim. Seconds until the slot,
-- or nil. Looks at the `TAKE_SCAN` soonest members of each candidate's set.
-- With `floors` (the classes' min_share, "" for none), a class below its floor keeps
-- its slots (quota_floors.lua).
local TAKE_SCAN = 32
local function take_lower(bookable, now, book_within, rank, floors, claim_s, booked)
  local best_alive, best_member, best_slot = nil, nil, nil
  for _, b in ipairs(bookable) do
    local alive = KEYS[6 * b[1]]
    local soonest = redis.call('ZRANGEBYSCORE', alive, '(' .. fmt(now), '+inf', 'WITHSCORES',
      'LIMIT', 0, TAKE_SCAN)
    local kept = {}  -- lower class -> whether its slots here are kept from this caller
    for k = 1, #soonest, 2 do
      local r, claim = string.match(soonest[k], '^@%S+ (%d+) (%S+)$')
      r = tonumber(r)
      if r and r > rank and floors ~= '' and kept[r] == nil then
        kept[r] = kept_from(KEYS[6 * b[1] - 4], rank, r, floors)
      end
      if r and r > rank and not kept[r] then
        local slot = tonumber(soonest[k + 1]) - tonumber(claim)
        if best_slot == nil or slot < best_slot then
          best_alive, best_member, best_slot = alive, soonest[k], slot
        end
      end
    end
  end
  if best_slot == nil or best_slot - now > book_within then return nil end
  redis.call('ZREM', best_alive, best_member)
  redis.call('ZADD', best_alive, best_slot + claim_s, booked)
  return math.max(best_slot - now, 0)
end
