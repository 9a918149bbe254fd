-- source.lua: an operator's or a status view's step on one source: pause it (keeping a
-- later pause), resume it, reset it, or read its state.
--
-- KEYS[1]  {p}:v1:src:<name>:permits   ZSET  permit id -> lease expiry
-- KEYS[2]  {p}:v1:src:<name>:state     HASH  mode failures open_until probe limit
--                                            last_decrease paused_until error opened_at;
--                                            learned quota
--                                            (lrpm ltpm ... lseen: read by snapshot);
--                                            fc<rank> (the classes' recent grants)
-- KEYS[3]  {p}:v1:src:<name>:queue     ZSET  waiters -> their place (snapshot only)
-- KEYS[4]  {p}:v1:src:<name>:alive     ZSET  claims, and quota slots booked
--                                            ("@<origin>:<call> <rank> ..." -> slot plus
--                                            claim; snapshot only)
-- ARGV[1]  now in seconds, or "" to read Redis TIME (the default store clock)
-- ARGV[2]  "pause", "resume", "reset" or "snapshot"
-- ARGV[3]  pause: seconds;  snapshot: cap
-- ARGV[4]  snapshot: initial AIMD limit (0: the cap)
-- ARGV[5]  snapshot: core.quota.LEARNED_TTL_S (announced limits older are forgotten)
-- ARGV[6..7]  snapshot: core.standing's RANK_SPAN and MAX_CLASSES
-- Returns  pause, resume, reset: "0"
--          snapshot: {live permits, permit limit, mode, failures, paused_for_s,
--          learned rpm, learned tpm (0: none announced), then per class rank 0 to
--          MAX_CLASSES - 1: its waiters, its recent grants (fc<rank>, "0" if none) and
--          its calls holding a quota slot booked ahead; then per tenant with calls
--          there: its name, its live permits, its waiters, its slots booked ahead}
-- resume deletes paused_until; reset deletes every field of the state hash (breaker,
-- AIMD limit, which then starts again from its initial value, pause, last error) and keeps
-- the permits, whose holders settle as usual, and the learned quota (the provider's).
-- Time: Redis TIME unless ARGV[1] is given.

-- include: clock

if ARGV[2] == 'resume' then
  redis.call('HDEL', KEYS[2], 'paused_until')
  return '0'
end
if ARGV[2] == 'reset' then
  redis.call('HDEL', KEYS[2], 'mode', 'failures', 'open_until', 'probe', 'limit',
    'last_decrease', 'paused_until', 'error', 'opened_at')
  return '0'
end
local now = store_now(ARGV[1])
local paused_until = tonumber(redis.call('HGET', KEYS[2], 'paused_until') or '-1e300')
if ARGV[2] == 'pause' then
  local until_ = math.max(paused_until, now + tonumber(ARGV[3]))
  redis.call('HSET', KEYS[2], 'paused_until', fmt(until_))
  return '0'
end
local cap, initial = tonumber(ARGV[3]), tonumber(ARGV[4])
if initial <= 0 then initial = cap end
initial = math.max(1, math.min(cap, initial))  -- as core.aimd.aimd_initial
local st = redis.call('HMGET', KEYS[2], 'mode', 'failures', 'limit', 'lrpm', 'ltpm', 'lseen')
local limit = tonumber(st[3] or initial)
if now - tonumber(st[6] or '-1e300') > tonumber(ARGV[5]) then st[4], st[5] = false, false end
local live = redis.call('ZCOUNT', KEYS[1], '(' .. fmt(now), '+inf')
local reply = {live, math.max(1, math.min(cap, math.floor(limit))), st[1] or 'closed',
  tonumber(st[2] or '0'), fmt(math.max(0, paused_until - now)), st[4] or '0', st[5] or '0'}
local span, classes = tonumber(ARGV[6]), tonumber(ARGV[7])
local fields = {}
for r = 0, classes - 1 do fields[#fields + 1] = 'fc' .. r end
local grants = redis.call('HMGET', KEYS[2], unpack(fields))
local booked = {}  -- rank -> slots booked ahead (a booking's score: its slot plus claim)
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. fmt(now), '+inf')) do
  local r = tonumber(string.match(member, '^@%S+ (%d+) '))
  if r then
    r = math.min(r, classes - 1)
    booked[r] = (booked[r] or 0) + 1
  end
end
for r = 0, classes - 1 do
  local top = r == classes - 1 and '+inf' or '(' .. fmt((r + 1) * span)
  reply[#reply + 1] = redis.call('ZCOUNT', KEYS[3], fmt(r * span), top)
  reply[#reply + 1] = grants[r + 1] or '0'
  reply[#reply + 1] = booked[r] or 0
end
-- Per tenant, its calls told by their ids ("<id>/<tenant>", core.standing.named_for): its
-- live permits (not those handed to a waiter), its waiters, its slots booked ahead.
local tenants, names = {}, {}
local function count(id, kind)
  local t = string.match(id, '/([^/]+)$')
  if t then
    if not tenants[t] then tenants[t] = {0, 0, 0}; names[#names + 1] = t end
    tenants[t][kind] = tenants[t][kind] + 1
  end
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. fmt(now), '+inf')) do
  if string.sub(id, 1, 1) ~= '~' then count(id, 1) end
end
for _, waiter in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  count(string.match(waiter, '^%S+ (%S+) ') or '', 2)
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. fmt(now), '+inf')) do
  local call = string.match(member, '^@(%S+) ')
  if call then count(call, 3) end
end
for _, t in ipairs(names) do
  reply[#reply + 1] = t
  for kind = 1, 3 do reply[#reply + 1] = tenants[t][kind] end
end
return reply
