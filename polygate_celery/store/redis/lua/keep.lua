-- keep.lua: waiting calls keep their places in the sources' queues (their claims are
-- renewed), and a source that can run a call while its queue is not empty (a holder's
-- lease expired, an AIMD limit rose, a hand-over lapsed) hands a permit to its first
-- live waiter, as a release does. Places are kept only while their source is merely
-- full: at a source paused, or whose breaker is not closed, the call asks again (its
-- admission then says why, and it polls).
--
-- KEYS[4i-3]  {p}:v1:src:<name>:permits  ZSET  permit id -> lease expiry (admit.lua)
-- KEYS[4i-2]  {p}:v1:src:<name>:state    HASH  mode probe limit paused_until; the fair
--                                                queuing fields (serving.lua)
-- KEYS[4i-1]  {p}:v1:src:<name>:queue    ZSET  waiter -> its place (admit.lua)
-- KEYS[4i]    {p}:v1:src:<name>:alive    ZSET  waiter -> end of its claim (admit.lua)
-- ARGV[1]  now in seconds, or "" to read Redis TIME (the default store clock)
-- ARGV[2]  the caller's origin (its process)
-- ARGV[3]  the wake-up channel of origin X is this text followed by X
-- ARGV[4..5]  core.standing's RANK_SPAN and DECAY (serving.lua)
-- ARGV[6..] per source i, in KEYS' order: name, cap, initial AIMD limit (0: the cap),
--          k (its places), then k pairs: call id, claim seconds as the call's admit
--          sent them (the waiter is "<origin> <call id> <claim s>")
-- Returns  {kept_1, ..., kept_m, call, name, ...}: per place in order, 1 if its claim
--          was renewed, 0 if the call no longer waits there (handed a permit, or passed
--          over by a release after its claim ran out) or the source is not merely full;
--          then each call of the caller's process handed a permit here, with its source
-- Commands: Redis 6.2 or later (ZADD GT).
-- Time: Redis TIME unless ARGV[1] is given.

-- include: clock

local RANK_SPAN, DECAY = tonumber(ARGV[4]), tonumber(ARGV[5])

-- include: handover

local now = store_now(ARGV[1])
local origin, channel = ARGV[2], ARGV[3]
local kept, wakes = {}, {}
local a = 6
for i = 1, #KEYS / 4 do
  local pkey, skey, queue, alive = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local name, cap, initial, k = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 3])
  a = a + 4
  local st = redis.call('HMGET', skey, 'mode', 'probe', 'limit', 'paused_until', 'ffloors')
  local full_only = (st[1] or 'closed') == 'closed' and not st[2]
    and tonumber(st[4] or '-1e300') <= now
  for _ = 1, k do
    local waiter = origin .. ' ' .. ARGV[a] .. ' ' .. ARGV[a + 1]
    -- (XX: a waiter no longer there is not added back; a claim that ran out while its
    -- caller lives is renewed, unless a release passed it over meanwhile)
    kept[#kept + 1] = full_only
      and redis.call('ZADD', alive, 'XX', 'GT', 'CH', now + tonumber(ARGV[a + 1]), waiter)
      or 0
    a = a + 2
  end
  if full_only then
    if initial <= 0 then initial = cap end
    initial = math.max(1, math.min(cap, initial))  -- as core.aimd.aimd_initial
    local permits = math.max(1, math.min(cap, math.floor(tonumber(st[3] or initial))))
    local in_use = redis.call('ZCARD', pkey)
    if in_use >= permits then  -- full: reclaim the leases expired by now, count again
      in_use = in_use - redis.call('ZREMRANGEBYSCORE', pkey, '-inf', now)
    end
    while in_use < permits and hand_on(pkey, queue, alive, skey, st[5], now, channel, name, origin,
      wakes) do
      in_use = in_use + 1
    end
  end
end
for _, x in ipairs(wakes) do kept[#kept + 1] = x end
return kept
