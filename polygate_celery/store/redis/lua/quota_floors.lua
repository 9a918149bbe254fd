-- quota_floors.lua: included by admit.lua and admit_booking.lua (a line "-- include:
-- quota_floors"), after the constant DECAY; not a script of its own.
--
-- The classes' floors on a quota's booked slots (core.standing): a source's state hash
-- keeps, per class r, the booked slots it used lately, fq<r> (decayed by DECAY per slot
-- used, as the grant counters of its permits). A class below its floor keeps its slots
-- from a higher class, and takes theirs (admit_booking.lua's take_lower).

-- `floors` ("" or comma-separated min_share by rank) as a list, and its fields' names.
local function floors_of(floors)
  local fl, names = {}, {}
  for f in string.gmatch(floors, '[^,]+') do
    fl[#fl + 1] = tonumber(f)
    names[#names + 1] = 'fq' .. (#fl - 1)
  end
  return fl, names
end

-- A booked slot of class `rank` used at `skey`: the fields that count it, added to
-- `fields` (the admission's HSET).
local function count_slot(fields, skey, rank, floors)
  local _, names = floors_of(floors)
  local counts = redis.call('HMGET', skey, unpack(names))
  for r = 0, #names - 1 do
    local c = tonumber(counts[r + 1] or '0') * DECAY
    if r == rank then c = c + 1 end
    fields[#fields + 1] = names[r + 1]
    fields[#fields + 1] = fmt(c)
  end
end

-- Which of classes `a` and `b` core.standing.next_class serves first at `skey`: the one
-- below its floor and furthest below it, if either is, else the higher (the lower rank).
local function served_first(skey, a, b, floors)
  local fl, names = floors_of(floors)
  local counts = redis.call('HMGET', skey, unpack(names))
  local total = 0
  for r = 1, #names do total = total + tonumber(counts[r] or '0') end
  local best, best_ratio = nil, nil
  for _, r in ipairs({a, b}) do
    local floor = fl[r + 1] or 0
    if floor > 0 then
      local share = total > 0 and tonumber(counts[r + 1] or '0') / total or 0
      local ratio = share / floor
      if share < floor and (best == nil or ratio < best_ratio
          or (ratio == best_ratio and r < best)) then
        best, best_ratio = r, ratio
      end
    end
  end
  return best or math.min(a, b)
end
