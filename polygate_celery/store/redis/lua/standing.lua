-- standing.lua: included by admit.lua (a line "-- include: standing"), after the
-- constant RANK_SPAN; not a script of its own. Who is served next: serving.lua.
--
-- A waiter's place in its source's queue (core.standing):
-- the score is its class's rank x RANK_SPAN + its fair-queuing tag, the tag its
-- tenant's next virtual finish, max(V, F) + max(est, 1) / weight. The source's state
-- hash keeps, per class r, its virtual time fv<r> (the tag of the last waiter served)
-- and grant counter fc<r>; per class and tenant t the last tag given, ff<r>:<t>; and
-- the classes' floors, ffloors ("" or comma-separated min_share by rank).

-- A caller's standing (admit.lua's ARGV[9]): rank, weight, tenant, floors, then the
-- state hash's fields of its class's virtual time and its tenant's last tag, then its
-- tenant's caps ("" for none; admit_tenant.lua).
local function standing_of(standing)
  if standing == '' then return 0, 1, '', '', 'fv0', 'ff0:', '' end  -- (most calls)
  local r, w, t, f, c = string.match(standing, '^(%d+)|([^|]+)|([^|]*)|([^|]*)|?(.*)$')
  return tonumber(r), tonumber(w), t, f, 'fv' .. r, 'ff' .. r .. ':' .. t, c
end

-- A waiter's fair-queuing tag, from its class's virtual time `fv` and its tenant's last
-- tag `ff` as the state hash holds them (false: none yet), and its cost.
local function tag_of(fv, ff, est, weight)
  local virtual = tonumber(fv or '0')
  local start = virtual
  if ff and tonumber(ff) >= virtual then start = tonumber(ff) end
  return start + math.max(est, 1) / weight
end

-- Its place in the queue: lower is served first.
local function score_of(rank, tag)
  return rank * RANK_SPAN + math.min(tag, RANK_SPAN - 1)
end
