-- quota_floors.lua: included by admit.lua (a line "-- include: quota_floors"), after
-- clock.lua and the constant CREDIT_TOLERANCE; not a script of its own.
--
-- The classes' floors on a quota's slots (core.standing): a source's state hash keeps
-- each class's credit on its quota slots, `fqc` ("" or comma-separated, by rank). A
-- slot used by a class with a floor f costs it 1 - f, one used by another earns it f,
-- within [f - 1, 1] (used_credits); a class whose credit has come round to 0 is owed a
-- slot (owed): it keeps its booked slots from a higher class, and takes theirs
-- (admit_booking.lua's take_booked).

-- `floors` ("" or comma-separated min_share by rank) as a list.
local function floors_of(floors)
  local fl = {}
  for f in string.gmatch(floors, '[^,]+') do fl[#fl + 1] = tonumber(f) end
  return fl
end

-- The credits `text` holds (false or "": none yet), by rank + 1; a class without one
-- starts at its lowest, f - 1 (core.standing.credit_of).
local function credits_of(text, fl)
  local c = {}
  for x in string.gmatch(text or '', '[^,]+') do c[#c + 1] = tonumber(x) end
  for r = 1, #fl do
    if c[r] == nil then c[r] = fl[r] - 1 end
  end
  return c
end

-- core.standing.used_credits: the credits `text` holds after a slot used by class
-- `rank`, as text.
local function used_credits(text, rank, floors)
  local fl = floors_of(floors)
  local c = credits_of(text, fl)
  local out = {}
  for r = 1, #fl do
    local f = fl[r]
    if f > 0 then
      c[r] = math.min(math.max(c[r] + (r - 1 == rank and f - 1 or f), f - 1), 1)
    end
    out[r] = fmt(c[r])
  end
  return table.concat(out, ',')
end

-- core.standing.owed: class `r` has a floor and its credit has come round to 0.
local function owed(c, fl, r)
  return (fl[r + 1] or 0) > 0 and c[r + 1] >= -CREDIT_TOLERANCE
end

-- core.standing.slot_goes_to: which of classes `a` and `b` a slot booked ahead goes to,
-- on the credits `c` and floors `fl`: one owed a slot (of two, the one owed more), else
-- the higher (the lower rank).
local function slot_goes_to(a, b, c, fl)
  local owed_a, owed_b = owed(c, fl, a), owed(c, fl, b)
  if owed_a ~= owed_b then return owed_a and a or b end
  if owed_a and c[a + 1] ~= c[b + 1] then return c[a + 1] > c[b + 1] and a or b end
  return math.min(a, b)
end
