-- admit.lua: grant one permit at the first runnable candidate source (selection +
-- lease + breaker + AIMD + pause + quota, atomically), or queue the caller fleet-wide
-- for the sources that refused it for capacity alone.
--
-- Key layout (every key shares the hash tag {<prefix>}, so one Cluster slot):
--   KEYS[6i-5]  {p}:v1:src:<name>:permits  ZSET  permit id -> lease expiry (store time, s);
--                                                "~<call id>": a permit handed to that
--                                                waiting call -> the end of its claim.
--                                                Expired members are reclaimed when they
--                                                would count: when the set is full
--   KEYS[6i-4]  {p}:v1:src:<name>:state    HASH  mode failures open_until probe limit
--                                                last_decrease paused_until error
--                                                opened_at (see settle.lua); learned
--                                                quota: lrpm lreq ltpm ltok ltsince
--                                                lseen (limits the provider announced,
--                                                GCRA times, when tpm was learned, the
--                                                last announcement); the provider's
--                                                requests window: lwend lwleft lwseen
--                                                (its end, what is left of it, the last
--                                                answer that showed a window)
--   KEYS[6i-3]  {p}:v1:quota:<group>       HASH  req tok (GCRA theoretical arrival times);
--                                                a placeholder key when the source has
--                                                none (never read)
--   KEYS[6i-2]  {p}:v1:quota:<group>:log   ZSET  permit id -> admission time (the RPM
--                                                sliding window; members older than the
--                                                window are dropped when it is full); a
--                                                placeholder likewise
--   KEYS[6i-1]  {p}:v1:src:<name>:queue    ZSET  waiter -> its place (fleet-wide): its class's
--                                                rank x RANK_SPAN + its fair-queuing tag
--                                                (see handover.lua); a waiter is
--                                                "<origin> <call id> <claim s>"
--   KEYS[6i]    {p}:v1:src:<name>:alive    ZSET  waiter -> end of its claim (refreshed by
--                                                each of its admissions); "@<origin>:<call
--                                                id> <rank> <claim s> <est> <arrival>
--                                                <tag>" (tag "-": no tenant): a slot that
--                                                call of that process, of that class,
--                                                booked -> the slot plus its claim (it
--                                                lapses then; a higher class, or a call of
--                                                its own it comes after, may take it, and
--                                                its booker is booked anew and told,
--                                                admit_booking.lua)
--   KEYS[6n+1]  {p}:v1:scope:<scope>:gate  HASH  until reset probe probe_until error
--   KEYS[6n+2i], KEYS[6n+2i+1]  for a call whose tenant has caps (ARGV[9]), the tenant's
--               {p}:v1:src:<name>:tenant:<tenant>:permits ZSET (permit id -> admission
--               time) and :rate HASH (req tok, GCRA times) at the i-th candidate
--               (admit_tenant.lua)
-- ARGV[1]   now in seconds, or "" to read Redis TIME (the default store clock)
-- ARGV[2]   permit id (chosen by the caller: a repeated admit returns its first grant)
-- ARGV[3]   estimated tokens
-- ARGV[4]   call id ("" for none): the gate's probe, and the waiter, are known by it
-- ARGV[5]   "0": the caller does not wait; "1": refused for capacity alone, it joins the
--           source's queue (it is in no queue yet); "2": likewise, and it may be queued
--           already: a permit a release handed to it (see settle.lua) is its own, and
--           granted, it leaves every queue and hands on a permit it was handed elsewhere;
--           "3": likewise, and it may hold a booked quota slot (see ARGV[8])
-- ARGV[6]   "" (no gate), or the probe's lease in seconds: while the scope's gate is
--           closed one call at a time may probe; the others are refused at once
-- ARGV[7]   the waiter's claim in seconds
-- ARGV[8]   how far ahead a waiting caller refused by quota buckets alone books the
--           soonest slot they give ("" or 0: it does not book): the buckets are charged
--           as at that slot, and from the slot on it is admitted there uncharged
-- ARGV[9]   the caller's standing (core.standing): "" for the plain one (one class at
--           most: rank 0, no tenant, weight 1, no floors; it takes no booked slot of
--           another class's, only a later call's, ARGV[10]), else
--           "<rank>|<weight>|<tenant>|<floors>[|<caps>]",
--           floors the classes' min_share by rank, comma-separated ("" for none); caps
--           the tenant's, "<max_concurrency>,<rpm>,<tpm>" (0: none; admit_tenant.lua)
-- ARGV[10]  the call's place among the waiters of its class (admit_booking.lua):
--           "<arrival>" or "<arrival> <tag>". The arrival, first come first served:
--           the store's time of its first grant or booking, in microseconds; "" for
--           none yet: a booking made now places it now, and the reply says so. The
--           tag, a tenant's call's fair-queuing tag on the quota (core.standing's
--           quota_tag, as the reply gave it): its tenant's next one, from the class's
--           virtual time qv<r> and the tenant's last tag qf<r>:<t> in the source's state
--           hash, is given by its first booking, and the reply says so
-- ARGV[11]  lease seconds     ARGV[12]  the caller's origin (its process)
-- ARGV[13]  the wake-up channel of origin X is this text followed by X
-- ARGV[14..17]  core.quota's LEARNED_TTL_S, WINDOW_KEPT_S, ARRIVAL_MARGIN_S and
--           BOOKING_SLACK_S; ARGV[18..20] core.standing's RANK_SPAN, DECAY and
--           CREDIT_TOLERANCE; ARGV[21] the store's TENANT_KEPT_S (packed once with the
--           terms, scripts.py)
-- ARGV[22..27] + 6(i-1)  the i-th candidate, best first: name, cap, initial AIMD limit
--           (0: the cap), rpm (0: none), tpm (0: none), window_s (0: rpm as a bucket;
--           -1: not declared: as a bucket, or the provider's window while its answers
--           show one (core.quota.window_take); else a sliding window of this length)
-- Returns  {1, name, admitted_at, call, source, ...}     a grant; then any waiter of
--                                                         the caller's process a
--                                                         permit was handed on to
--          {4, name, admitted_at, turned, open_s, error, call, source, ...}
--                                                         a grant of the source's
--                                                         half-open probe: turned "1"
--                                                         when this admission turned the
--                                                         breaker from open to half-open
--                                                         (it says so, once fleet-wide),
--                                                         after open_s seconds open (""
--                                                         if not on record); error, the
--                                                         source's last error ("" none)
--          {0, reopen_in_s or "", name, reason, error, ...}  a denial; reasons: paused,
--          breaker_open, probe_in_flight, at_capacity, quota,
--          tenant_cap; error: the source's last error where its breaker or a pause refused
--          it, else ""
--          {3, reopen_in_s, booked_in_s, arrival, tag, name, reason, error, ...}
--                                                         a denial, the caller holding a
--                                                         booked slot that far ahead,
--                                                         its arrival and tag (ARGV[10];
--                                                         tag "" for none)
--          {2, gated_for_s, reset, error}                 refused by the scope's gate (the
--                                                         closing verdict's last error)
--                                                         (reset "1": it opens when
--                                                         rate limits reset)
-- Time: Redis TIME unless ARGV[1] is given. Commands: Redis 6.2 or later (ZMSCORE).
-- Numbers handed to redis.call are written as %.17g, as fmt() does.
-- Parts: the scope's gate (admit_gate), each candidate's breaker (admit_breaker) and
-- quotas (admit_quota, gcra), the booking of a quota's slot (admit_booking), the
-- hand-over of a permit to the next waiter (handover), a waiter's place in a queue
-- (standing).

-- Each `local function` of a script is made afresh on every run: the parts an
-- uncontended admission at a source without a quota does not run (the gate, the
-- quotas, a booking, a hand-over) are included in the blocks that run them.

-- include: clock

local LEARNED_TTL_S, WINDOW_KEPT_S = tonumber(ARGV[14]), tonumber(ARGV[15])
local MARGIN_S, SLACK_S = tonumber(ARGV[16]), tonumber(ARGV[17])
local RANK_SPAN, DECAY = tonumber(ARGV[18]), tonumber(ARGV[19])
local CREDIT_TOLERANCE, TENANT_KEPT_S = tonumber(ARGV[20]), tonumber(ARGV[21])
local T = 21  -- the arguments before the candidates'
local NONE = {}  -- no quota's waits, no dimension to book (read only)

-- include: standing
-- include: admit_breaker

local now = store_now(ARGV[1])
local permit, est, call, waits = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local n = (#ARGV - T) / 6
local queued = waits == '2' or waits == '3'
local may_hold_booking = waits == '3'
local handed = '~' .. call
local claim_s = tonumber(ARGV[7])
local book_within = tonumber(ARGV[8]) or 0
local function waiter() return ARGV[12] .. ' ' .. call .. ' ' .. ARGV[7] end
-- where a waiter of this caller's standing takes its place (standing.lua)
local s_rank, s_weight, s_tenant, s_floors, s_virtual, s_finish, s_caps = standing_of(ARGV[9])
local caps = nil  -- its tenant's caps at each candidate, if it has any
if s_caps ~= '' then
  -- include: gcra
  -- include: admit_tenant
  caps = tenant_caps(s_caps)
end
-- its place (ARGV[10]): its arrival (given, or now), and its tag on the quota ("" none)
local given_arrival, given_tag = string.match(ARGV[10], '^(-?%d*) ?(%S*)$')
local arrival = given_arrival ~= '' and given_arrival or string.format('%.0f', now * 1e6)
-- a slot this caller books (admit_booking.lua), for a caller that waits
local function booking_of(tag)
  return '@' .. ARGV[12] .. ':' .. call .. ' ' .. s_rank .. ' ' .. ARGV[7] .. ' ' .. ARGV[3]
    .. ' ' .. arrival
    .. ' ' .. tag
end
local booked = waits ~= '0' and booking_of(given_tag ~= '' and given_tag or '-') or nil

-- A repeated admit returns its first grant. With one candidate and no queue to look
-- in, the permit's presence is checked where it matters instead: when adding it, and
-- before any refusal (`unchecked`).
local handed_until = {}  -- candidate -> the claim of a permit handed to this caller there
local slot_of = {}  -- candidate -> the slot this caller booked there
local unchecked = not queued and n == 1
if not unchecked then
  for i = 1, n do
    local pkey = KEYS[6 * i - 5]
    if queued then
      local s = redis.call('ZMSCORE', pkey, permit, handed)
      if s[1] then return {1, ARGV[T + 6 * i - 5], fmt(now)} end
      if s[2] then handed_until[i] = tonumber(s[2]) end
      local b = may_hold_booking and redis.call('ZSCORE', KEYS[6 * i], booked)
      if b and tonumber(b) > now then
        slot_of[i] = tonumber(b) - claim_s
      elseif b then
        redis.call('ZREM', KEYS[6 * i], booked)  -- lapsed unused
      end
    elseif redis.call('ZSCORE', pkey, permit) then
      return {1, ARGV[T + 6 * i - 5], fmt(now)}
    end
  end
end
local function held_already()  -- asked at most once
  if not unchecked then return false end
  unchecked = false
  return redis.call('ZSCORE', KEYS[1], permit)
end

if ARGV[6] ~= '' then
  -- include: admit_gate
  local function held()
    if held_already() then return {1, ARGV[T + 1], fmt(now)} end
  end
  local refusal = gate_refusal(KEYS[6 * n + 1], now, call, tonumber(ARGV[6]), held)
  if refusal then return refusal end
end

local denial = {0, ''}
local soonest = nil
local bookable = {}  -- {candidate, dims}: refused by quota buckets alone
for i = 1, n do
  local a = T + 6 * i - 6
  local name, cap, initial = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local rpm, tpm, window = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])
  local pkey, skey, qkey, lkey = KEYS[6 * i - 5], KEYS[6 * i - 4], KEYS[6 * i - 3], KEYS[6 * i - 2]

  -- a permit handed to this caller: its own (it takes the place of the hand-over);
  -- one whose claim has ended is reclaimed
  local mine = false
  if handed_until[i] then
    redis.call('ZREM', pkey, handed)
    mine = handed_until[i] > now
  end
  local st = redis.call('HMGET', skey, 'mode', 'open_until', 'probe', 'limit', 'paused_until',
    'lrpm', 'lreq', 'ltpm', 'ltok', 'lseen', 'lwend', 'lwleft', 'lwseen', s_virtual, s_finish,
    'fqc')
  -- the provider's limits as announced (learned at settle), unless forgotten
  local learned = st[10] and now - tonumber(st[10]) <= LEARNED_TTL_S
  -- requests follow the provider's window (not declared, and an answer showed one lately)
  local in_windows = learned and window < 0 and tonumber(st[6] or '0') > 0 and st[13] ~= false
    and now - tonumber(st[13]) <= WINDOW_KEPT_S
  local mode = st[1] or 'closed'
  if initial <= 0 then initial = cap end
  initial = math.max(1, math.min(cap, initial))  -- as core.aimd.aimd_initial
  local limit = tonumber(st[4] or initial)
  local paused_until = tonumber(st[5] or '-1e300')

  local reasons, known = {}, {}
  if paused_until > now then
    reasons[#reasons + 1] = 'paused'; known[#known + 1] = paused_until - now
  end
  local take_probe, new_mode = breaker_says(pkey, skey, st, now, reasons, known)
  local permits = math.max(1, math.min(cap, math.floor(limit)))
  local in_use = redis.call('ZCARD', pkey)
  if in_use >= permits then  -- full: reclaim the leases expired by now, count again
    in_use = in_use - redis.call('ZREMRANGEBYSCORE', pkey, '-inf', now)
  end
  if in_use >= permits then reasons[#reasons + 1] = 'at_capacity' end
  local slot = slot_of[i]
  local waits_s, dims, req_tat, tok_tat = NONE, NONE, nil, nil
  local lrpm, ltpm, lreq, ltok, wend, wleft = 0, 0, nil, nil, nil, nil
  local quota_step = rpm > 0 or tpm > 0 or learned or slot
  if quota_step then  -- (most sources: no quota, no slot)
    -- include: gcra
    -- include: admit_quota
    local c = {rpm = rpm, tpm = tpm, window = window, qkey = qkey, lkey = lkey, skey = skey}
    local q = quota_says(c, st, now, est, slot, learned, in_windows)
    waits_s, dims, req_tat, tok_tat = q.waits, q.dims, q.req_tat, q.tok_tat
    rpm, tpm, window = q.rpm, q.tpm, q.window
    lrpm, ltpm, lreq, ltok, wend, wleft = q.lrpm, q.ltpm, q.lreq, q.ltok, q.wend, q.wleft
  end
  if #waits_s > 0 then
    reasons[#reasons + 1] = 'quota'; known[#known + 1] = math.max(unpack(waits_s))
  end
  local capped = caps and caps.says(pkey, KEYS[6 * n + 2 * i], KEYS[6 * n + 2 * i + 1], now, est)
  if capped and capped.refused then
    reasons[#reasons + 1] = 'tenant_cap'; known[#known + 1] = capped.wait
  end

  if #reasons > 0 then
    if held_already() then return {1, name, fmt(now)} end
    denial[#denial + 1] = name
    denial[#denial + 1] = reasons[1]
    -- the fleet's evidence, for a caller refused before it sent anything
    local by_health = false
    for _, r in ipairs(reasons) do
      by_health = by_health or r == 'paused' or r == 'breaker_open' or r == 'probe_in_flight'
    end
    denial[#denial + 1] = by_health and (redis.call('HGET', skey, 'error') or '') or ''
    -- A permit handed to it that it cannot use (the source paused since, say) is freed
    -- (above): the others would be refused alike, and poll; held back by its tenant's
    -- caps alone, it goes on to the next waiter (told by a message, even here).
    if mine and capped and capped.refused and not by_health and reasons[1] ~= 'at_capacity' then
      -- include: handover
      hand_on(pkey, KEYS[6 * i - 1], KEYS[6 * i], skey, redis.call('HGET', skey, 'ffloors'),
        now, ARGV[13], name, '', {})
    end
    if not mine and waits ~= '0' and #reasons == 1 and reasons[1] == 'at_capacity' then
      local w = waiter()
      local tag = tag_of(st[14], st[15], est, s_weight)
      -- (NX: queued already, it keeps its place)
      if redis.call('ZADD', KEYS[6 * i - 1], 'NX', score_of(s_rank, tag), w) == 1
        and redis.call('HSET', skey, s_finish, fmt(tag), 'ffloors', s_floors) > 0 then
        redis.call('HSET', skey, 'fgrow', '1')  -- a field added: settle.lua may sweep
      end
      redis.call('ZADD', KEYS[6 * i], now + claim_s, w)
    end
    local only_quota = true
    for _, r in ipairs(reasons) do only_quota = only_quota and r == 'quota' end
    if slot then  -- kept while the call waits on
      if slot <= now then redis.call('ZADD', KEYS[6 * i], 'GT', now + claim_s, booked) end
    elseif only_quota and window <= 0 and not in_windows and #dims > 0 then
      bookable[#bookable + 1] = {i, dims, st[16]}
    end
    if #known == #reasons then
      local reopen = math.max(unpack(known))
      if soonest == nil or reopen < soonest then soonest = reopen end
    end
  else
    if unchecked then  -- (still unchecked: ZADD NX tells)
      if redis.call('ZADD', pkey, 'NX', now + tonumber(ARGV[11]), permit) == 0 then
        return {1, name, fmt(now)}  -- held already: its first grant
      end
    else
      redis.call('ZADD', pkey, now + tonumber(ARGV[11]), permit)
    end
    if capped then caps.charge(KEYS[6 * n + 2 * i], KEYS[6 * n + 2 * i + 1], permit, now, capped) end
    local fields = {}
    if take_probe then
      fields[#fields + 1] = 'mode'; fields[#fields + 1] = new_mode
      fields[#fields + 1] = 'probe'; fields[#fields + 1] = permit
    end
    if lrpm > 0 and not in_windows then fields[#fields + 1] = 'lreq'; fields[#fields + 1] = lreq end
    if wend then
      fields[#fields + 1] = 'lwend'; fields[#fields + 1] = fmt(wend)
      fields[#fields + 1] = 'lwleft'; fields[#fields + 1] = fmt(wleft)
    end
    if ltpm > 0 and est > 0 then fields[#fields + 1] = 'ltok'; fields[#fields + 1] = ltok end
    if quota_step and s_floors ~= '' then  -- a quota's slot used: the classes' credits
      -- include: quota_floors
      fields[#fields + 1] = 'fqc'; fields[#fields + 1] = used_credits(st[16], s_rank, s_floors)
    end
    if slot and given_tag ~= '' then  -- a tenant's slot used: its class's virtual time
      local qv = 'qv' .. s_rank
      if tonumber(given_tag) > tonumber(redis.call('HGET', skey, qv) or '0') then
        fields[#fields + 1] = qv; fields[#fields + 1] = given_tag
      end
    end
    if #fields > 0 then redis.call('HSET', skey, unpack(fields)) end
    if slot then redis.call('ZREM', KEYS[6 * i], booked) end  -- paid when booked
    if rpm > 0 or tpm > 0 then redis.call('HSET', qkey, 'req', req_tat, 'tok', tok_tat) end
    if rpm > 0 and window > 0 then
      redis.call('ZADD', lkey, now, permit)
      redis.call('PEXPIRE', lkey, math.ceil(window * 1000) + 1000)
    end
    local reply = {1, name, fmt(now)}
    if take_probe then  -- the one request the breaker lets through: the caller is told
      local h = redis.call('HMGET', skey, 'opened_at', 'error')
      local turned = mode == 'open'
      local open_s = (turned and h[1]) and fmt(now - tonumber(h[1])) or ''
      reply = {4, name, fmt(now), turned and '1' or '0', open_s, h[2] or ''}
    end
    if queued then  -- out of every queue; a permit handed to it elsewhere moves on
      local w = waiter()
      for j = 1, n do
        local queue, alive = KEYS[6 * j - 1], KEYS[6 * j]
        -- (the hand-over of the permit it holds took it out of that source's queue)
        if not (j == i and mine) and redis.call('ZREM', queue, w) == 1 then
          redis.call('ZREM', alive, w)
        end
        if j ~= i and slot_of[j] then redis.call('ZREM', alive, booked) end  -- lapses unused
        if j > i and handed_until[j] then
          -- include: handover
          redis.call('ZREM', KEYS[6 * j - 5], handed)
          local floors = redis.call('HGET', KEYS[6 * j - 4], 'ffloors')
          hand_on(KEYS[6 * j - 5], queue, alive, KEYS[6 * j - 4], floors, now, ARGV[13],
            ARGV[T + 6 * j - 5], ARGV[12], reply)
        end
      end
    end
    return reply
  end
end
if soonest ~= nil then denial[2] = fmt(soonest) end

-- A slot booked already and still ahead: the caller asks again then.
local ahead = nil
for _, at in pairs(slot_of) do
  if at > now + SLACK_S and (ahead == nil or at - now < ahead) then ahead = at - now end
end
if ahead ~= nil then
  denial[1] = 3
  table.insert(denial, 3, fmt(ahead))
  table.insert(denial, 4, arrival)
  table.insert(denial, 5, given_tag)
-- Else book the soonest slot the quota buckets of one candidate give (core.quota.gcra_book).
elseif book_within > 0 and waits ~= '0' and #bookable > 0 and next(slot_of) == nil then
  -- include: gcra
  -- include: admit_booking
  -- The caller's tag on candidate i's quota, as text, and whether it is new: given, or
  -- for a call of a tenant, its tenant's next there (standing.lua's tag_of); "-" for
  -- a call of no tenant.
  local tags = {}
  local function tag_at(i)
    if given_tag ~= '' then return given_tag, false end
    if s_tenant == '' then return '-', false end
    if not tags[i] then
      local f = redis.call('HMGET', KEYS[6 * i - 4], 'qv' .. s_rank,
        'qf' .. s_rank .. ':' .. s_tenant)
      tags[i] = fmt(tag_of(f[1], f[2], est, s_weight))
    end
    return tags[i], true
  end
  -- The caller's booking at candidate i, as the alive set keeps it: a tenant's first
  -- booking there gives its tenant's next tag.
  local tag_booked = nil
  local function booking_at(i)
    local t, new = tag_at(i)
    local qf = 'qf' .. s_rank .. ':' .. s_tenant
    if new and redis.call('HSET', KEYS[6 * i - 4], qf, t) > 0 then
      redis.call('HSET', KEYS[6 * i - 4], 'fgrow', '1')  -- a field added: settle.lua may sweep
    end
    tag_booked = t
    return booking_of(t)
  end
  -- a slot booked by a lower class, or by a call of this caller's class it comes before,
  -- is taken first, if any (standing: a class's rank; its place: ARGV[10])
  local robbed = {}
  local in_s = (ARGV[9] ~= '' or given_arrival ~= '')
    and take_booked(bookable, now, book_within, s_rank, s_floors, claim_s, booking_at, est,
      given_arrival ~= '' and tonumber(arrival) or nil, ARGV[9] == '', tag_at, robbed)
  if not in_s then in_s = book(bookable, now, book_within, claim_s, booking_at) end
  rebook(robbed, now, book_within, s_floors, ARGV[9] == '', est)
  if in_s then
    if soonest == nil or in_s < soonest then denial[2] = fmt(in_s) end
    denial[1] = 3
    table.insert(denial, 3, fmt(in_s))
    table.insert(denial, 4, arrival)
    table.insert(denial, 5, tag_booked == '-' and '' or tag_booked)
  end
end
return denial
