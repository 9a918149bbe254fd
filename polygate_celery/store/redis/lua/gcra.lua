-- gcra.lua: included by admit.lua and settle.lua (a line "-- include: gcra"), not a
-- script of its own. The quota buckets' arithmetic, as core.quota's.

-- Seconds `cost` units move a TAT by (a cost above the limit is charged as the limit).
local function charge_s(cost, limit)
  return math.min(math.max(cost, 0), limit) * 60.0 / limit
end

-- core.quota.gcra_reserve: checked as arriving now, charged as arriving `margin` later;
-- the new TAT, or the TAT and the seconds to wait when it may not.
local function gcra(tat, now, cost, limit, margin)
  local charge = charge_s(cost, limit)
  local over = math.max(tat - now, 0) + charge - 60.0  -- (exact for a full bucket)
  if over > 0 then return tat, over end
  return math.max(tat, now + margin) + charge, nil
end
