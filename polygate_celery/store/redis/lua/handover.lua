-- handover.lua: included by admit.lua and keep.lua (a line "-- include: handover"),
-- after the constants RANK_SPAN and DECAY; not a script of its own.

-- include: serving

-- The live waiter served next (its class, its fair share: serving.lua) gets the
-- permit just freed: it is held for the waiter until its claim ends, and the waiter's
-- process is told (one message), or, when it is the caller's own process, named in
-- the reply (`local_wakes`). Waiters whose claim has ended are dropped on the way.
-- `floors`: the state hash's ffloors, as the caller read it. Returns whether a live
-- waiter was found.
local function hand_on(pkey, queue, alive, skey, floors, now, channel, name, own_origin,
    local_wakes)
  while true do
    local head, score, counts = next_waiter(queue, skey, floors)
    if not head then return false end
    local claim_end = tonumber(redis.call('ZSCORE', alive, head) or '-1e300')
    redis.call('ZREM', queue, head)
    redis.call('ZREM', alive, head)
    if claim_end > now then
      served(skey, score, floors, counts)
      local origin, call, claim = string.match(head, '^(%S+) (%S+) (%S+)$')
      redis.call('ZADD', pkey, now + tonumber(claim), '~' .. call)
      if origin == own_origin then
        local_wakes[#local_wakes + 1] = call
        local_wakes[#local_wakes + 1] = name
      else
        redis.call('PUBLISH', channel .. origin, call .. ' ' .. name)
      end
      return true
    end
  end
end
