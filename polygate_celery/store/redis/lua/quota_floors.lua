-- quota_floors.lua: included by admit_booking.lua (a line "-- include: quota_floors"),
-- after the constant DECAY; not a script of its own.
--
-- The classes' floors on a quota's booked slots (core.standing): a source's state hash
-- keeps, per class r, the slots assigned to it lately, fq<r>: a booking counts one (all
-- decayed by DECAY first, as the grant counters of its permits), a slot taken moves one
-- from the class it was taken from to the taker's. A class below its floor keeps its
-- slots from a higher class, and takes theirs (admit_booking.lua's take_lower).

-- `floors` ("" or comma-separated min_share by rank) as a list, and its fields' names.
local function floors_of(floors)
  local fl, names = {}, {}
  for f in string.gmatch(floors, '[^,]+') do
    fl[#fl + 1] = tonumber(f)
    names[#names + 1] = 'fq' .. (#fl - 1)
  end
  return fl, names
end

-- A slot assigned at `skey` to class `rank`: booked (`from` nil), or taken from class
-- `from`.
local function count_slot(skey, rank, from, floors)
  local _, names = floors_of(floors)
  local counts = redis.call('HMGET', skey, unpack(names))
  local fields = {}
  for r = 0, #names - 1 do
    local c = tonumber(counts[r + 1] or '0')
    if from == nil then c = c * DECAY end
    if r == rank then c = c + 1 elseif r == from then c = math.max(c - 1, 0) end
    fields[#fields + 1] = names[r + 1]
    fields[#fields + 1] = fmt(c)
  end
  redis.call('HSET', skey, unpack(fields))
end

-- Which of classes `a` and `b` core.standing.next_class serves first at `skey`: the one
-- below its floor and furthest below it, if either is, else the higher (the lower rank).
-- The slot in question, booked by class `booker`, counts for neither
-- (core.standing.without_slot).
local function served_first(skey, a, b, floors, booker)
  local fl, names = floors_of(floors)
  local counts = redis.call('HMGET', skey, unpack(names))
  counts[booker + 1] = math.max(tonumber(counts[booker + 1] or '0') - 1, 0)
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
