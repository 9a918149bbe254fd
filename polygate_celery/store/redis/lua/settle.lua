-- settle.lua: end the attempt holding a permit: release it and record what the
-- attempt says (breaker, AIMD, Retry-After pause, token usage, scope progress).
-- A permit no longer held (settled already, or reclaimed after its lease expired)
-- returns 0 and keeps only the facts that are safe to record twice: the pause a
-- 429 asked for and the progress a success made. The breaker, AIMD and token
-- accounting belong to the permit and are not touched again.
--
-- KEYS[1]  {p}:v1:src:<name>:permits   ZSET  permit id -> lease expiry
-- KEYS[2]  {p}:v1:src:<name>:state     HASH  mode failures open_until probe limit
--                                            last_decrease paused_until; learned quota
--                                            lrpm lreq ltpm ltok ltsince lseen
-- KEYS[3]  {p}:v1:quota:<group>        HASH  req tok (placeholder key when none)
-- KEYS[4]  {p}:v1:scope:<scope>:progress  STRING  time of the last success (TTL)
-- KEYS[5]  {p}:v1:scope:<scope>:gate      HASH    deleted by a success (the scope lives)
-- KEYS[6]  {p}:v1:src:<name>:queue     ZSET  waiters -> arrival (see admit.lua)
-- KEYS[7]  {p}:v1:src:<name>:alive     ZSET  waiters -> end of their claim
-- ARGV[1]  now in seconds, or "" to read Redis TIME (the default store clock)
-- ARGV[2]  permit id          ARGV[3]  effect: success | failure | auth_failure | neutral
-- ARGV[4]  congested (1/0)    ARGV[5]  pause seconds ("" for none)
-- ARGV[6]  estimated tokens   ARGV[7]  used tokens (charged in place of the estimate)
-- ARGV[8]  admitted_at
-- ARGV[9]  the source's terms, space-separated: breaker threshold, cooldown_s,
--          auth_cooldown_s; cap, AIMD increase, AIMD decrease factor, AIMD initial
--          (0: the cap); tpm (0: none); progress TTL seconds
-- ARGV[10] the wake-up channel of origin X is this text followed by X
-- ARGV[11] the settling process's origin, and the source's name: "<origin> <name>"
-- ARGV[12] the provider's announced limits, "rpm remaining tpm remaining" (a limit of
--          0: not announced): they move the learned quota as core.quota.learned_tat
--          does, after the held permit's token estimate is settled (when the learned
--          bucket charged it at admission); a quota not announced for LEARNED_TTL_S
--          starts over
-- Returns  0 if the permit was not held; else it is released and, when the source can
--          run another call, handed to the first live waiter of the source's queue
--          (fleet-wide FIFO): 1 (no waiter, or one of another process, told by a message
--          on its channel), or the waiter's call id when it belongs to the settling
--          process (which wakes it without a message).
-- Time: Redis TIME unless ARGV[1] is given.

local function store_now(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function fmt(x) return string.format('%.17g', x) end
local LEARNED_TTL_S = 3600  -- as core.quota.LEARNED_TTL_S

local function fields(s)
  local out = {}
  for word in string.gmatch(s, '%S+') do out[#out + 1] = tonumber(word) end
  return out
end

local permit = ARGV[2]
local held = redis.call('ZREM', KEYS[1], permit) == 1
local now = store_now(ARGV[1])
local effect, congested = ARGV[3], ARGV[4] == '1'
local est, used = tonumber(ARGV[6]), tonumber(ARGV[7])
local admitted_at = tonumber(ARGV[8])
local t = fields(ARGV[9])
local threshold, cooldown, auth_cooldown = t[1], t[2], t[3]
local cap, inc, factor, initial, tpm, ttl = t[4], t[5], t[6], t[7], t[8], t[9]
if initial <= 0 then initial = cap end
initial = math.max(1, math.min(cap, initial))  -- as core.aimd.aimd_initial

local skey = KEYS[2]
local a = redis.call('HMGET', skey, 'paused_until', 'ltpm', 'ltok', 'ltsince', 'lseen',
  'mode', 'failures', 'open_until', 'probe', 'limit', 'last_decrease')
local paused_until = tonumber(a[1] or '-1e300')
local pause = tonumber(ARGV[5])
if pause and pause > 0 then
  paused_until = math.max(paused_until, now + pause)
  redis.call('HSET', skey, 'paused_until', fmt(paused_until))
end
-- learned quota (mirrors polygate_celery.store.memory._Learned)
local l = {a[2], a[3], a[4], a[5]}
if l[4] and now - tonumber(l[4]) > LEARNED_TTL_S then  -- none learned: nothing to forget
  redis.call('HDEL', skey, 'lrpm', 'lreq', 'ltpm', 'ltok', 'ltsince', 'lseen')
  l = {false, false, false, false}
end
local ltpm = tonumber(l[1] or '0')
if held and ltpm > 0 and est > 0 and admitted_at > tonumber(l[3] or '1e300') then
  local delta = math.min(math.max(used, 0), ltpm) - math.min(math.max(est, 0), ltpm)
  local ltok = tonumber(l[2] or '-1e300') + delta * 60.0 / ltpm
  redis.call('HSET', skey, 'ltok', fmt(ltok))
end
local announced = fields(ARGV[12])
for i, dim in ipairs({{'lrpm', 'lreq'}, {'ltpm', 'ltok'}}) do
  local limit, remaining = announced[2 * i - 1], announced[2 * i]
  if limit > 0 then
    local tat = tonumber(redis.call('HGET', skey, dim[2]) or '-1e300')
    local spent = limit - math.min(math.max(remaining, 0), limit)
    redis.call('HSET', skey, dim[1], fmt(limit),
      dim[2], fmt(math.max(tat, now + spent * 60.0 / limit)), 'lseen', fmt(now))
    if i == 2 and ltpm <= 0 then redis.call('HSET', skey, 'ltsince', fmt(now)) end
  end
end
if effect == 'success' then
  redis.call('SET', KEYS[4], fmt(now), 'EX', math.ceil(ttl))
  redis.call('DEL', KEYS[5])
end
if not held then return 0 end

local st = {a[6], a[7], a[8], a[9], a[10], a[11]}
local mode, failures = st[1] or 'closed', tonumber(st[2] or '0')
local open_until, probe = tonumber(st[3] or '0'), st[4]
local limit, last_decrease = tonumber(st[5] or initial), tonumber(st[6] or '-1e300')
local is_probe = probe == permit

-- breaker (mirrors polygate_celery.core.breaker.breaker_settle)
if effect == 'success' then
  mode, failures, open_until, probe = 'closed', 0, 0, false
elseif effect == 'auth_failure' then
  mode, open_until, probe = 'open', math.max(open_until, now + auth_cooldown), false
elseif effect == 'failure' then
  if is_probe then
    mode, open_until, probe = 'open', now + cooldown, false
  elseif mode == 'closed' then
    failures = failures + 1
    if failures >= threshold then mode, open_until = 'open', now + cooldown end
  end
elseif is_probe then
  probe = false
end

-- AIMD (mirrors polygate_celery.core.aimd): one decrease per congestion episode
if effect == 'success' then
  limit = math.min(cap, limit + inc)
elseif congested and admitted_at > last_decrease then
  limit, last_decrease = math.max(1, limit * factor), now
end

redis.call('HSET', skey, 'mode', mode, 'failures', failures, 'open_until', fmt(open_until),
  'limit', fmt(limit), 'last_decrease', fmt(last_decrease))
if probe then
  redis.call('HSET', skey, 'probe', probe)
elseif st[4] then
  redis.call('HDEL', skey, 'probe')
end

if tpm > 0 and est > 0 then
  local tok = tonumber(redis.call('HGET', KEYS[3], 'tok') or '-1e300')
  local delta = math.min(math.max(used, 0), tpm) - math.min(math.max(est, 0), tpm)
  redis.call('HSET', KEYS[3], 'tok', fmt(tok + delta * 60.0 / tpm))
end

-- hand the freed permit to the first live waiter, if the source can run a call now
local head = redis.call('ZRANGE', KEYS[6], 0, 0)[1]
if not head then return 1 end  -- nobody waits: nothing more to do
if mode == 'open' or probe or paused_until > now then return 1 end  -- waiters poll
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now))
if redis.call('ZCARD', KEYS[1]) >= math.max(1, math.min(cap, math.floor(limit))) then return 1 end
local origin, name = string.match(ARGV[11], '^(%S+) (%S+)$')
while head do
  local claim_end = tonumber(redis.call('ZSCORE', KEYS[7], head) or '-1e300')
  redis.call('ZREM', KEYS[6], head)
  redis.call('ZREM', KEYS[7], head)
  if claim_end > now then
    local waiter_origin, call, claim = string.match(head, '^(%S+) (%S+) (%S+)$')
    redis.call('ZADD', KEYS[1], now + tonumber(claim), '~' .. call)
    if waiter_origin == origin then return call end
    redis.call('PUBLISH', ARGV[10] .. waiter_origin, call .. ' ' .. name)
    return 1
  end
  head = redis.call('ZRANGE', KEYS[6], 0, 0)[1]
end
return 1
