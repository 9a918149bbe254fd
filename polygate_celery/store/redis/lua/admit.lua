-- admit.lua: grant one permit at the first runnable candidate source (selection +
-- lease + breaker + AIMD + pause + quota, atomically), or queue the caller fleet-wide
-- for the sources that refused it for capacity alone.
--
-- Key layout (every key shares the hash tag {<prefix>}, so one Cluster slot):
--   KEYS[6i-5]  {p}:v1:src:<name>:permits  ZSET  permit id -> lease expiry (store time, s);
--                                                "~<call id>": a permit handed to that
--                                                waiting call -> the end of its claim
--   KEYS[6i-4]  {p}:v1:src:<name>:state    HASH  mode failures open_until probe limit
--                                                last_decrease paused_until; learned
--                                                quota: lrpm lreq ltpm ltok ltsince
--                                                lseen (limits the provider announced,
--                                                GCRA times, when tpm was learned, the
--                                                last announcement)
--   KEYS[6i-3]  {p}:v1:quota:<group>       HASH  req tok (GCRA theoretical arrival times);
--                                                a placeholder key when the source has none
--   KEYS[6i-2]  {p}:v1:quota:<group>:log   ZSET  permit id -> admission time (the RPM
--                                                sliding window); a placeholder likewise
--   KEYS[6i-1]  {p}:v1:src:<name>:queue    ZSET  waiter -> arrival (FIFO, fleet-wide)
--   KEYS[6i]    {p}:v1:src:<name>:alive    ZSET  waiter -> end of its claim (refreshed by
--                                                each of its admissions)
--   KEYS[6n+1]  {p}:v1:scope:<scope>:gate  HASH  until reset probe probe_until
-- ARGV[1]  now in seconds, or "" to read Redis TIME (the default store clock)
-- ARGV[2]  permit id (chosen by the caller: a repeated admit returns its first grant)
-- ARGV[3]  lease seconds
-- ARGV[4]  estimated tokens
-- ARGV[5]  "" (no gate), or "<probe lease s> <call id>": while the scope's gate is closed
--          one call at a time may probe; the others are refused at once
-- ARGV[6]  "" (the caller does not wait), or the waiter "<origin> <call id> <claim s>":
--          refused for capacity alone, it joins the source's queue; a permit a release
--          handed to it (see settle.lua) is its own; granted, it leaves every queue and
--          hands on a permit it was handed elsewhere
-- ARGV[6+i]  the i-th candidate, best first, as one space-separated string:
--            "name cap initial_aimd_limit(0: the cap) rpm(0: none) tpm(0: none)
--             window_s(0: rpm as a bucket, else a sliding window of this length)"
-- ARGV[7+n]  the wake-up channel of origin X is this text followed by X
-- Returns  {1, name, admitted_at, call, source, ...}     a grant; then any waiter of
--                                                         the caller's process a
--                                                         permit was handed on to
--          {0, reopen_in_s or "", name, reason, ...}      a denial; reasons: paused,
--          breaker_open, probe_in_flight, at_capacity, quota
--          {2, gated_for_s, reset}                        refused by the scope's gate
--                                                         (reset "1": it opens when
--                                                         rate limits reset)
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
  for word in string.gmatch(s, '%S+') do out[#out + 1] = word end
  return out
end

local function gcra(tat, now, cost, limit)
  local interval = 60.0 / limit
  if cost > limit then cost = limit end
  if cost < 0 then cost = 0 end
  local new_tat = math.max(tat, now) + cost * interval
  local allowed_at = new_tat - 60.0
  if allowed_at > now then return tat, allowed_at - now end
  return new_tat, nil
end

-- The TAT after one admission of `cost`; the wait, if it may not, goes into `waits`.
local function charge(waits, tat, now, cost, limit)
  local new_tat, w = gcra(tat, now, cost, limit)
  if w then waits[#waits + 1] = w end
  return new_tat
end

-- The first live waiter of a queue gets the permit just freed: it is held for the
-- waiter until its claim ends, and the waiter's process is told (one message), or,
-- when it is the caller's own process, named in the reply (`local_wakes`).
local function hand_on(pkey, queue, alive, now, channel, name, own_origin, local_wakes)
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then return end
    local claim_end = tonumber(redis.call('ZSCORE', alive, head) or '-1e300')
    redis.call('ZREM', queue, head)
    redis.call('ZREM', alive, head)
    if claim_end > now then
      local origin, call, claim = string.match(head, '^(%S+) (%S+) (%S+)$')
      redis.call('ZADD', pkey, now + tonumber(claim), '~' .. call)
      if origin == own_origin then
        local_wakes[#local_wakes + 1] = call
        local_wakes[#local_wakes + 1] = name
      else
        redis.call('PUBLISH', channel .. origin, call .. ' ' .. name)
      end
      return
    end
  end
end

local now = store_now(ARGV[1])
local permit = ARGV[2]
local lease = tonumber(ARGV[3])
local est = tonumber(ARGV[4])
local waiter = ARGV[6]
local n = #ARGV - 7
local channel = ARGV[7 + n]
local handed, waiter_claim, own_origin = '', 0, ''
if waiter ~= '' then
  local origin, call, claim = string.match(waiter, '^(%S+) (%S+) (%S+)$')
  handed, waiter_claim, own_origin = '~' .. call, tonumber(claim), origin
end

for i = 1, n do
  if redis.call('ZSCORE', KEYS[6 * i - 5], permit) then
    return {1, fields(ARGV[6 + i])[1], fmt(now)}
  end
end

if ARGV[5] ~= '' then
  local gkey = KEYS[6 * n + 1]
  local g = redis.call('HMGET', gkey, 'until', 'probe', 'probe_until', 'reset')
  local closed_until = tonumber(g[1])
  if closed_until and closed_until <= now then
    redis.call('DEL', gkey)
  elseif closed_until then
    local lease_text, call = string.match(ARGV[5], '^(%S+) (.*)$')
    local probe_lease = tonumber(lease_text)
    if not g[2] or g[2] == call or tonumber(g[3] or '-1e300') <= now then
      redis.call('HSET', gkey, 'probe', call, 'probe_until', fmt(now + probe_lease))
    else
      return {2, fmt(closed_until - now), g[4] or '0'}
    end
  end
end

local denial = {0, ''}
local soonest = nil
for i = 1, n do
  local c = fields(ARGV[6 + i])
  local name, cap = c[1], tonumber(c[2])
  local initial, rpm, tpm = tonumber(c[3]), tonumber(c[4]), tonumber(c[5])
  local window = tonumber(c[6])
  local pkey, skey, qkey, lkey = KEYS[6 * i - 5], KEYS[6 * i - 4], KEYS[6 * i - 3], KEYS[6 * i - 2]

  redis.call('ZREMRANGEBYSCORE', pkey, '-inf', fmt(now))  -- reclaim leases expired by now
  -- a permit handed to this caller: its own (it takes the place of the hand-over)
  local mine = handed ~= '' and redis.call('ZREM', pkey, handed) == 1
  local st = redis.call('HMGET', skey, 'mode', 'open_until', 'probe', 'limit', 'paused_until',
    'lrpm', 'lreq', 'ltpm', 'ltok', 'lseen')
  local mode = st[1] or 'closed'
  local open_until = tonumber(st[2] or '0')
  local probe = st[3]
  if probe and not redis.call('ZSCORE', pkey, probe) then
    probe = false  -- the probe's lease was reclaimed: the half-open slot is free again
    redis.call('HDEL', skey, 'probe')
  end
  if initial <= 0 then initial = cap end
  initial = math.max(1, math.min(cap, initial))  -- as core.aimd.aimd_initial
  local limit = tonumber(st[4] or initial)
  local paused_until = tonumber(st[5] or '-1e300')

  local reasons, known = {}, {}
  if paused_until > now then
    reasons[#reasons + 1] = 'paused'; known[#known + 1] = paused_until - now
  end
  local take_probe, new_mode = false, mode
  if mode == 'open' then
    if now < open_until then
      reasons[#reasons + 1] = 'breaker_open'; known[#known + 1] = open_until - now
    else
      take_probe, new_mode = true, 'half_open'
    end
  elseif mode == 'half_open' then
    if probe then reasons[#reasons + 1] = 'probe_in_flight' else take_probe = true end
  end
  local permits = math.max(1, math.min(cap, math.floor(limit)))
  if redis.call('ZCARD', pkey) >= permits then reasons[#reasons + 1] = 'at_capacity' end
  local req_tat, tok_tat = nil, nil
  local waits = {}  -- declared and learned quotas alike: one 'quota' reason
  if rpm > 0 or tpm > 0 then
    local q = redis.call('HMGET', qkey, 'req', 'tok')
    req_tat, tok_tat = tonumber(q[1] or '-1e300'), tonumber(q[2] or '-1e300')
    if rpm > 0 and window > 0 then
      redis.call('ZREMRANGEBYSCORE', lkey, '-inf', fmt(now - window))
      local excess = redis.call('ZCARD', lkey) - rpm
      if excess >= 0 then  -- the oldest `excess + 1` must leave the window first
        local oldest = redis.call('ZRANGE', lkey, excess, excess, 'WITHSCORES')
        waits[#waits + 1] = math.max(0, tonumber(oldest[2]) + window - now)
      end
      -- Charged to the bucket too, unenforced: workers that count rpm as a bucket
      -- (during a rolling upgrade, or after a changed setting) see this admission.
      req_tat = math.min(math.max(req_tat, now) + 60.0 / rpm, now + 60.0)
    elseif rpm > 0 then
      req_tat = charge(waits, req_tat, now, 1, rpm)
    end
    if tpm > 0 and est > 0 then tok_tat = charge(waits, tok_tat, now, est, tpm) end
  end
  -- the provider's announced limits (learned at settle), beside any declared quota
  local lrpm, ltpm = tonumber(st[6] or '0'), tonumber(st[8] or '0')
  local lreq, ltok = tonumber(st[7] or '-1e300'), tonumber(st[9] or '-1e300')
  if now - tonumber(st[10] or '-1e300') > LEARNED_TTL_S then lrpm, ltpm = 0, 0 end
  if lrpm > 0 then lreq = charge(waits, lreq, now, 1, lrpm) end
  if ltpm > 0 and est > 0 then ltok = charge(waits, ltok, now, est, ltpm) end
  if #waits > 0 then
    reasons[#reasons + 1] = 'quota'; known[#known + 1] = math.max(unpack(waits))
  end

  if #reasons > 0 then
    denial[#denial + 1] = name
    denial[#denial + 1] = reasons[1]
    -- A permit handed to it that it cannot use (the source paused since, say) is freed
    -- (above): the others would be refused alike, and poll.
    if not mine and waiter ~= '' and #reasons == 1 and reasons[1] == 'at_capacity' then
      redis.call('ZADD', KEYS[6 * i - 1], 'NX', now, waiter)
      redis.call('ZADD', KEYS[6 * i], now + waiter_claim, waiter)
    end
    if #known == #reasons then
      local reopen = math.max(unpack(known))
      if soonest == nil or reopen < soonest then soonest = reopen end
    end
  else
    if take_probe then redis.call('HSET', skey, 'mode', new_mode, 'probe', permit) end
    redis.call('ZADD', pkey, now + lease, permit)
    if lrpm > 0 then redis.call('HSET', skey, 'lreq', fmt(lreq)) end
    if ltpm > 0 and est > 0 then redis.call('HSET', skey, 'ltok', fmt(ltok)) end
    if rpm > 0 or tpm > 0 then redis.call('HSET', qkey, 'req', fmt(req_tat), 'tok', fmt(tok_tat)) end
    if rpm > 0 and window > 0 then
      redis.call('ZADD', lkey, now, permit)
      redis.call('PEXPIRE', lkey, math.ceil(window * 1000) + 1000)
    end
    local reply = {1, name, fmt(now)}
    if waiter ~= '' then  -- out of every queue; a permit handed to it elsewhere moves on
      for j = 1, n do
        local queue, alive = KEYS[6 * j - 1], KEYS[6 * j]
        if redis.call('ZREM', queue, waiter) == 1 then redis.call('ZREM', alive, waiter) end
        if j ~= i and redis.call('ZREM', KEYS[6 * j - 5], handed) == 1 then
          hand_on(KEYS[6 * j - 5], queue, alive, now, channel, fields(ARGV[6 + j])[1],
            own_origin, reply)
        end
      end
    end
    return reply
  end
end
if soonest ~= nil then denial[2] = fmt(soonest) end
return denial
