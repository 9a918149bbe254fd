-- serving.lua: included by settle.lua and handover.lua (a line "-- include:
-- serving"), after the constants RANK_SPAN and DECAY; not a script of its own.
--
-- Who is served next of a source's waiters (core.standing), their places as
-- standing.lua gives them: the state hash keeps, per class r, its virtual time fv<r>
-- and grant counter fc<r>, and the classes' floors, ffloors.

-- The waiter served next of `queue` (member, score, and the grant counters it read
-- for `served`), nil if none: the head, unless a class with waiters is below its floor
-- (core.standing.next_class); `floors` as the state hash holds them (its ffloors
-- field, read by the caller).
local function next_waiter(queue, skey, floors)
  local counts = nil
  if floors and floors ~= '' then
    local fl = {}
    for f in string.gmatch(floors, '[^,]+') do fl[#fl + 1] = tonumber(f) end
    local fields = {}
    for r = 0, #fl - 1 do fields[#fields + 1] = 'fc' .. r end
    counts = redis.call('HMGET', skey, unpack(fields))
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
    if best then return best[1], tonumber(best[2]), counts end
  end
  local h = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  if not h[1] then return nil end
  return h[1], tonumber(h[2]), counts
end

-- A waiter of `score` was served: its class's virtual time moves to its tag, and,
-- with `floors`, the grant counters (`counts`, as next_waiter read them) count it.
local function served(skey, score, floors, counts)
  local rank = math.floor(score / RANK_SPAN)
  local fields = {'fv' .. rank, fmt(score - rank * RANK_SPAN)}
  if counts then
    local k = 0
    for _ in string.gmatch(floors, '[^,]+') do k = k + 1 end
    for r = 0, k - 1 do
      local c = tonumber(counts[r + 1] or '0') * DECAY
      if r == rank then c = c + 1 end
      fields[#fields + 1] = 'fc' .. r
      fields[#fields + 1] = fmt(c)
    end
  end
  redis.call('HSET', skey, unpack(fields))
end
