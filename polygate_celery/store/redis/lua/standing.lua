-- standing.lua: included by admit.lua, settle.lua and keep.lua (a line "-- include:
-- standing"), after the constants RANK_SPAN and DECAY; not a script of its own.
--
-- A waiter's place in its source's queue, and who is served next (core.standing):
-- the score is its class's rank x RANK_SPAN + its fair-queuing tag, the tag its
-- tenant's next virtual finish, max(V, F) + max(est, 1) / weight. The source's state
-- hash keeps, per class r, its virtual time fv<r> (the tag of the last waiter served)
-- and grant counter fc<r>; per class and tenant t the last tag given, ff<r>:<t>; and
-- the classes' floors, ffloors ("" or comma-separated min_share by rank).

-- A caller's standing (admit.lua's ARGV[9]): rank, weight, tenant, floors, then the
-- state hash's fields of its class's virtual time and its tenant's last tag.
local function standing_of(standing)
  if standing == '' then return 0, 1, '', '', 'fv0', 'ff0:' end  -- (most calls: no text made)
  local r, w, t, f = string.match(standing, '^(%d+)|([^|]+)|([^|]*)|(.*)$')
  return tonumber(r), tonumber(w), t, f, 'fv' .. r, 'ff' .. r .. ':' .. t
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

-- The waiter served next of `queue` (member, score), nil if none: the head, unless a
-- class with waiters is below its floor (core.standing.next_class); `floors` as the
-- state hash holds them (its ffloors field, read by the caller).
local function next_waiter(queue, skey, floors)
  if floors and floors ~= '' then
    local fl = {}
    for f in string.gmatch(floors, '[^,]+') do fl[#fl + 1] = tonumber(f) end
    local fields = {}
    for r = 0, #fl - 1 do fields[#fields + 1] = 'fc' .. r end
    local counts = redis.call('HMGET', skey, unpack(fields))
    local total = 0
    for r = 1, #fl do total = total + tonumber(counts[r] or '0') end
    local best, best_ratio = nil, nil
    for r = 0, #fl - 1 do
      local floor = fl[r + 1]
      if floor > 0 then
        local share = total > 0 and tonumber(counts[r + 1] or '0') / total or 0
        if share < floor and (best_ratio == nil or share / floor < best_ratio) then
          local lo, hi = r * RANK_SPAN, '(' .. fmt((r + 1) * RANK_SPAN)
          local h = redis.call('ZRANGEBYSCORE', queue, lo, hi, 'WITHSCORES', 'LIMIT', 0, 1)
          if h[1] then best, best_ratio = h, share / floor end
        end
      end
    end
    if best then return best[1], tonumber(best[2]) end
  end
  local h = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  if not h[1] then return nil end
  return h[1], tonumber(h[2])
end

-- A waiter of `score` was served: its class's virtual time moves to its tag, and,
-- with `floors`, the grant counters count it.
local function served(skey, score, floors)
  local rank = math.floor(score / RANK_SPAN)
  local fields = {'fv' .. rank, fmt(score - rank * RANK_SPAN)}
  if floors and floors ~= '' then
    local k = 0
    for _ in string.gmatch(floors, '[^,]+') do k = k + 1 end
    local names = {}
    for r = 0, k - 1 do names[#names + 1] = 'fc' .. r end
    local counts = redis.call('HMGET', skey, unpack(names))
    for r = 0, k - 1 do
      local c = tonumber(counts[r + 1] or '0') * DECAY
      if r == rank then c = c + 1 end
      fields[#fields + 1] = 'fc' .. r
      fields[#fields + 1] = fmt(c)
    end
  end
  redis.call('HSET', skey, unpack(fields))
end
