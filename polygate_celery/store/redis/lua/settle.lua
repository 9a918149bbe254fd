-- settle.lua: end the attempt holding a permit: release it and record what the
-- attempt says (breaker, AIMD, Retry-After pause, token usage, scope progress).
-- A permit no longer held (settled already, or reclaimed after its lease expired
-- while its answer came) returns 0 and keeps only the facts that are safe to record
-- twice: the pause a 429 asked for, and what a success shows (the scope's progress,
-- the source serving: breaker closed, AIMD increase). A failure's breaker count and
-- AIMD decrease and the token accounting belong to the permit and are not touched
-- again; nothing is released or handed on. Only what changes is written: a success
-- on a healthy source at its cap writes nothing to the state.
--
-- KEYS[1]  {p}:v1:src:<name>:permits   ZSET  permit id -> lease expiry
-- KEYS[2]  {p}:v1:src:<name>:state     HASH  mode failures open_until probe limit
--                                            last_decrease paused_until; learned quota
--                                            lrpm lreq ltpm ltok ltsince lseen; the
--                                            provider's window lwend lwleft lwseen; error
--                                            (the source's last error: see ARGV[15]),
--                                            opened_at (when the breaker last opened);
--                                            fair queuing (standing.lua), swept of
--                                            stale tenants' tags (fsweep: the cursor;
--                                            fgrow: tags were added since the hash was
--                                            last found small)
-- KEYS[3]  {p}:v1:quota:<group>        HASH  req tok (placeholder key when none)
-- KEYS[4]  {p}:v1:scope:<scope>:progress  STRING  time of the last success (TTL)
-- KEYS[5]  {p}:v1:scope:<scope>:gate      HASH    deleted by a success (the scope lives)
-- KEYS[6]  {p}:v1:src:<name>:queue     ZSET  waiters -> their place (see admit.lua)
-- KEYS[7]  {p}:v1:src:<name>:alive     ZSET  waiters -> end of their claim
-- KEYS[8]  {p}:v1:scope:<scope>:class_progress  HASH  class rank -> time of its last
--                                            success (the key's TTL, the progress TTL)
-- KEYS[9]  for a call whose tenant has caps: {p}:v1:src:<name>:tenant:<tenant>:permits
--          ZSET (admit_tenant.lua), which the permit leaves
-- KEYS[10] and {p}:v1:src:<name>:tenant:<tenant>:rate HASH, whose tok takes the tokens
--          used in place of the estimate (ARGV[35])
-- ARGV[1]  now in seconds, or "" to read Redis TIME (the default store clock)
-- ARGV[2]  permit id          ARGV[3]  effect: success | failure | auth_failure | neutral
-- ARGV[4]  congested (1/0)    ARGV[5]  pause seconds ("" for none)
-- ARGV[6]  estimated tokens   ARGV[7]  used tokens (charged in place of the estimate)
-- ARGV[8]  admitted_at
-- ARGV[9..12]  the provider's announced limits: rpm, remaining, tpm, remaining (a limit
--          of 0: not announced): they move the learned quota as core.quota.learned_tat
--          does, after the held permit's token estimate is settled (when the learned
--          bucket charged it at admission); a quota not announced for LEARNED_TTL_S
--          starts over
-- ARGV[13] the announced requests reset in seconds ("" when ARGV[14] is "")
-- ARGV[14] "1" if the announcement shows a provider counting in windows, "0" if not, ""
--          if it says nothing of it (core.quota.counts_in_windows): the provider's window
--          is learned as core.quota.window_learn does
-- ARGV[15] the attempt's error, classified ("" for none): kept as the source's last
--          error when this settle records a pause, or a held permit's failure or
--          auth_failure; a success while no pause runs deletes it (admit.lua names it)
-- ARGV[16] the class whose progress a success marks beside the scope's (its rank), ""
--          when no classes are declared (SPEC §8: a class's stall reads its own)
-- ARGV[17] "" or, for a waiter's tenant whose tokens differ from its estimate,
--          "<rank>|<tenant>|<weight>": its tenant's last fair-queuing tags, in the
--          permits' queue (ff<r>:<t>) and on the quota (qf<r>:<t>, admit.lua), move by
--          (used - estimated) / weight while the tenant is ahead of its class's virtual
--          time there (standing.lua: shares are counted in the tokens used)
-- ARGV[18] the settling process's origin     ARGV[19] the source's name
-- ARGV[20] the wake-up channel of origin X is this text followed by X
-- ARGV[21..29]  the source's terms: breaker threshold, cooldown_s, auth_cooldown_s; cap,
--          AIMD increase, AIMD decrease factor, AIMD initial (0: the cap); tpm (0: none);
--          progress TTL seconds
-- ARGV[30..32]  core.quota's LEARNED_TTL_S and RESET_EVIDENCE_S, the store's GATE_KEPT_S;
--          ARGV[33..34] core.standing's RANK_SPAN and DECAY (packed once with the terms,
--          scripts.py); ARGV[35] with KEYS[9]: the tenant's tpm cap (0: none)
-- Returns  0 if the permit was not held; else it is released and, when the source can
--          run another call, handed to the live waiter served next (serving.lua)
--          (fleet-wide, by class and fair share): 1 (no waiter, or one of another process, told by a message
--          on its channel), or the waiter's call id when it belongs to the settling
--          process (which wakes it without a message). When the settle changed a state
--          an operator must hear of, the reply is {that result, breaker change ("opened",
--          "reopened", "closed" or ""), seconds it stays open, a fresh pause's seconds
--          ("" if none: the source was paused already, or no pause), "1" if it ended
--          the scope's stall on record (its gate closed, or open by time for less
--          than GATE_KEPT_S) else "0"}: the settling process logs it, once fleet-wide.
-- Time: Redis TIME unless ARGV[1] is given. Numbers handed to redis.call are written
-- as %.17g.

-- include: clock
-- (The parts a settle may not need, the quota's arithmetic and who is served next,
-- are included in the blocks that run them: a `local function` is made on every run.)

local LEARNED_TTL_S, EVIDENCE_S, GATE_KEPT_S = tonumber(ARGV[30]), tonumber(ARGV[31]),
  tonumber(ARGV[32])
local RANK_SPAN, DECAY = tonumber(ARGV[33]), tonumber(ARGV[34])
local SWEEP_ABOVE = 64  -- fields of the state hash before tenants' stale tags are swept


local permit = ARGV[2]
local held = redis.call('ZREM', KEYS[1], permit) == 1
local now = store_now(ARGV[1])
local effect, congested = ARGV[3], ARGV[4] == '1'
local est, used = tonumber(ARGV[6]), tonumber(ARGV[7])
local admitted_at = tonumber(ARGV[8])
local cap, tpm = tonumber(ARGV[24]), tonumber(ARGV[28])

local skey = KEYS[2]
local a = redis.call('HMGET', skey, 'paused_until', 'lrpm', 'lreq', 'ltpm', 'ltok', 'ltsince',
  'lseen', 'mode', 'failures', 'open_until', 'probe', 'limit', 'last_decrease', 'error',
  'lwend', 'lwleft', 'ffloors', 'fgrow')
local set, forget = {}, nil  -- the state's fields to write, and to delete
local function put(field, value) set[#set + 1] = field; set[#set + 1] = value end

local paused_until = tonumber(a[1] or '-1e300')
local pause = tonumber(ARGV[5])
local fresh_pause = ''  -- a pause of a source that was not paused: news
if pause and pause > 0 and paused_until <= now then fresh_pause = fmt(pause) end
local err, paused = ARGV[15], pause and pause > 0
if paused then
  paused_until = math.max(paused_until, now + pause)
  put('paused_until', paused_until)
  if err ~= '' then put('error', err) end  -- what the source said as it paused
end
-- learned quota (mirrors polygate_celery.store.memory._Learned)
local lreq, ltpm, ltok, ltsince = a[3], tonumber(a[4] or '0'), a[5], a[6]
local lwend, lwleft = a[15], a[16]
if a[7] and now - tonumber(a[7]) > LEARNED_TTL_S then  -- none learned: nothing to forget
  forget = {'lrpm', 'lreq', 'ltpm', 'ltok', 'ltsince', 'lseen', 'lwend', 'lwleft', 'lwseen'}
  lreq, ltpm, ltok, ltsince, lwend, lwleft = false, 0, false, false, false, false
end
ltok = tonumber(ltok or '-1e300')
if held and ltpm > 0 and est > 0 and admitted_at > tonumber(ltsince or '1e300') then
  -- include: gcra
  local delta = charge_s(used, ltpm) - charge_s(est, ltpm)
  if delta ~= 0 then
    ltok = ltok + delta
    put('ltok', ltok)
  end
end
if KEYS[9] then  -- a call whose tenant has caps: one fewer in flight, its tokens as used
  redis.call('ZREM', KEYS[9], permit)
  local ttpm = tonumber(ARGV[35])
  local b = held and ttpm > 0 and est > 0 and redis.call('HMGET', KEYS[10], 'req', 'tok')
  if b and b[2] then  -- (gone: refilled a period ago, nothing to correct)
    -- include: gcra
    local moved = tonumber(b[2]) + charge_s(used, ttpm) - charge_s(est, ttpm)
    redis.call('HSET', KEYS[10], 'tok', fmt(moved))
    local last = math.max(moved, tonumber(b[1]))  -- kept as admit_tenant.lua keeps it
    redis.call('PEXPIRE', KEYS[10], math.max(1, math.ceil((last - now + 61.0) * 1000)))
  end
end
local arpm, atpm = tonumber(ARGV[9]), tonumber(ARGV[11])
if arpm > 0 then
  local spent = arpm - math.min(math.max(tonumber(ARGV[10]), 0), arpm)
  put('lrpm', arpm)
  put('lreq', math.max(tonumber(lreq or '-1e300'), now + spent * 60.0 / arpm))
  put('lseen', now)
end
if arpm > 0 and ARGV[14] ~= '' then  -- core.quota.window_learn
  local remaining, announced = tonumber(ARGV[10]), now + tonumber(ARGV[13])
  local wend, wleft = tonumber(lwend or '-1e300'), tonumber(lwleft or '0')
  if wend <= now then
    wend, wleft = announced, remaining
  elseif announced >= wend - EVIDENCE_S then
    wend, wleft = math.max(wend, announced), math.min(wleft, remaining)
  end
  put('lwend', wend)
  put('lwleft', wleft)
  if ARGV[14] == '1' then put('lwseen', now) end
end
if atpm > 0 then
  local spent = atpm - math.min(math.max(tonumber(ARGV[12]), 0), atpm)
  put('ltpm', atpm)
  put('ltok', math.max(ltok, now + spent * 60.0 / atpm))
  if arpm <= 0 then put('lseen', now) end
  if ltpm <= 0 then put('ltsince', now) end
end
if forget ~= nil then redis.call('HDEL', skey, unpack(forget)) end  -- before any HSET
local gate_opened = '0'
if effect == 'success' then
  redis.call('SET', KEYS[4], now, 'EX', math.ceil(tonumber(ARGV[29])))
  if ARGV[16] ~= '' then
    redis.call('HSET', KEYS[8], ARGV[16], fmt(now))
    redis.call('EXPIRE', KEYS[8], math.ceil(tonumber(ARGV[29])))
  end
  local closed_until = redis.call('HGET', KEYS[5], 'until')
  if closed_until then  -- a stall on record while within GATE_KEPT_S: it ends
    if tonumber(closed_until) + GATE_KEPT_S > now then gate_opened = '1' end
    redis.call('DEL', KEYS[5])
  end
end
local change, open_for = '', 0
-- the reply: `result` alone, or with the changes an operator must hear of
local function reply(result)
  if change == '' and fresh_pause == '' and gate_opened == '0' then return result end
  return {result, change, fmt(open_for), fresh_pause, gate_opened}
end
if not held and effect ~= 'success' then
  if #set > 0 then redis.call('HSET', skey, unpack(set)) end
  return reply(0)
end

local threshold, cooldown = tonumber(ARGV[21]), tonumber(ARGV[22])
local initial = tonumber(ARGV[27])
if initial <= 0 then initial = cap end
initial = math.max(1, math.min(cap, initial))  -- as core.aimd.aimd_initial
local mode, failures = a[8] or 'closed', tonumber(a[9] or '0')
local open_until, probe = tonumber(a[10] or '0'), a[11]
local limit, last_decrease = tonumber(a[12] or initial), tonumber(a[13] or '-1e300')
local is_probe = probe == permit

-- breaker (mirrors polygate_celery.core.breaker.breaker_settle)
if effect == 'success' then
  mode, failures, open_until, probe = 'closed', 0, 0, false
elseif effect == 'auth_failure' then
  mode, open_until, probe = 'open', math.max(open_until, now + tonumber(ARGV[23])), false
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
local was = a[8] or 'closed'
if mode == 'open' and was ~= 'open' then
  change, open_for = (was == 'closed') and 'opened' or 'reopened', open_until - now
  put('opened_at', now)  -- (the half-open line says how long it was open)
elseif mode == 'closed' and was ~= 'closed' then
  change = 'closed'
end
-- the source's last error: a failure's, kept (a pause's is above); a success while no
-- pause runs ends it
if err ~= '' and not paused and (effect == 'failure' or effect == 'auth_failure') then
  put('error', err)
elseif effect == 'success' and a[14] and paused_until <= now then
  redis.call('HDEL', skey, 'error')
end

-- AIMD (mirrors polygate_celery.core.aimd): one decrease per congestion episode
if effect == 'success' then
  limit = math.min(cap, limit + tonumber(ARGV[25]))
elseif congested and admitted_at > last_decrease then
  limit, last_decrease = math.max(1, limit * tonumber(ARGV[26])), now
end

-- written where the stored value differs (a field not stored yet is written)
if a[8] ~= mode then put('mode', mode) end
if not a[9] or tonumber(a[9]) ~= failures then put('failures', failures) end
if not a[10] or tonumber(a[10]) ~= open_until then put('open_until', open_until) end
if not a[12] or tonumber(a[12]) ~= limit then put('limit', limit) end
if not a[13] or tonumber(a[13]) ~= last_decrease then put('last_decrease', last_decrease) end
if probe then
  if probe ~= a[11] then put('probe', probe) end
elseif a[11] then
  redis.call('HDEL', skey, 'probe')
end
if #set > 0 then redis.call('HSET', skey, unpack(set)) end
if not held then return reply(0) end  -- a success's facts are kept; no permit is freed

if ARGV[17] ~= '' then  -- the tenant's share counts the tokens used (standing.lua)
  local r, t, w = string.match(ARGV[17], '^(%d+)|([^|]*)|(.+)$')
  local delta = (math.max(used, 1) - math.max(est, 1)) / tonumber(w)
  -- in the permits' queue (ff, fv) and on the quota (qf, qv) alike
  local f = redis.call('HMGET', skey, 'fv' .. r, 'ff' .. r .. ':' .. t, 'qv' .. r,
    'qf' .. r .. ':' .. t)
  for k, prefix in ipairs({'ff', 'qf'}) do
    local virtual, finish = f[2 * k - 1], f[2 * k]
    if finish and tonumber(finish) > tonumber(virtual or '0') then
      redis.call('HSET', skey, prefix .. r .. ':' .. t, fmt(tonumber(finish) + delta))
    end
  end
end

if tpm > 0 and est > 0 then
  -- include: gcra
  local delta = charge_s(used, tpm) - charge_s(est, tpm)
  if delta ~= 0 then
    local tok = tonumber(redis.call('HGET', KEYS[3], 'tok') or '-1e300')
    redis.call('HSET', KEYS[3], 'tok', tok + delta)
  end
end

-- Tenants that come and go (customer ids) leave no fields behind: a tenant's last tag
-- its class's virtual time has reached counts as none (standing.lua's tag_of), so once
-- tenants' tags were added (fgrow, set by admit.lua as it adds one) and the state hash
-- holds more than SWEEP_ABOVE fields, each settle drops those among the next few (an
-- HSCAN cursor kept in the hash, fsweep); the flag goes once the hash is that small.
if a[18] then
  if redis.call('HLEN', skey) > SWEEP_ABOVE then
    local found = redis.call('HSCAN', skey, redis.call('HGET', skey, 'fsweep') or '0',
      'MATCH', '?f*:*', 'COUNT', 32)
    for k = 1, #found[2], 2 do
      local kind, r = string.match(found[2][k], '^([fq])f(%d+):')
      local virtual = kind and redis.call('HGET', skey, kind .. 'v' .. r)
      if kind and tonumber(found[2][k + 1]) <= tonumber(virtual or '0') then
        redis.call('HDEL', skey, found[2][k])
      end
    end
    redis.call('HSET', skey, 'fsweep', found[1])
  else
    redis.call('HDEL', skey, 'fgrow')
  end
end

-- hand the freed permit to the live waiter served next (serving.lua), if the source
-- can run a call now
local floors = a[17] ~= nil and a[17] ~= '' and a[17] or nil
local first = nil
if not floors then  -- (most sources: no floors; nobody waits, nothing more to do)
  first = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
  if not first[1] then return reply(1) end
end
-- include: serving
local head, score, counts  -- the head, unless a floor says else (its counters read)
if first then
  head, score = first[1], tonumber(first[2])
else
  head, score, counts = next_waiter(KEYS[6], skey, floors)
  if not head then return reply(1) end  -- nobody waits
end
if mode == 'open' or probe or paused_until > now then return reply(1) end  -- waiters poll
local in_use = redis.call('ZCARD', KEYS[1])
local permits = math.max(1, math.min(cap, math.floor(limit)))
if in_use >= permits then  -- full: reclaim the leases expired by now, count again
  in_use = in_use - redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
end
if in_use >= permits then return reply(1) end
local origin, name = ARGV[18], ARGV[19]
while head do
  local claim_end = tonumber(redis.call('ZSCORE', KEYS[7], head) or '-1e300')
  redis.call('ZREM', KEYS[6], head)
  redis.call('ZREM', KEYS[7], head)
  if claim_end > now then
    served(skey, score, floors, counts)
    local waiter_origin, call, claim = string.match(head, '^(%S+) (%S+) (%S+)$')
    redis.call('ZADD', KEYS[1], now + tonumber(claim), '~' .. call)
    if waiter_origin == origin then return reply(call) end
    redis.call('PUBLISH', ARGV[20] .. waiter_origin, call .. ' ' .. name)
    return reply(1)
  end
  head, score, counts = next_waiter(KEYS[6], skey, floors)
end
return reply(1)
