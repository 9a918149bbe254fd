-- admit_quota.lua: included by admit.lua (a line "-- include: admit_quota"), after
-- gcra.lua and the constants MARGIN_S and SLACK_S; not a script of its own. A
-- candidate's quotas at admission: the declared one (core.quota.gcra_reserve, or a
-- sliding window) and the limits its provider announced (learned at settle).

-- The TAT after one admission of `cost`; the wait, if it may not, goes into `waits`.
local function charge(waits, tat, now, cost, limit)
  local new_tat, w = gcra(tat, now, cost, limit, MARGIN_S)
  if w then waits[#waits + 1] = w end
  return new_tat
end

-- What the quotas of candidate `c` ({rpm, tpm, window, qkey, lkey, skey}: its terms as
-- admit.lua's header gives them, its keys) say of an admission of `est` tokens, `st`
-- its state (admit.lua's HMGET), `slot` a slot the caller booked there (or nil),
-- `learned` whether the provider's announced limits count, `in_windows` whether its
-- requests follow the provider's window. Returns a table: `waits` (seconds until each
-- refusing quota may admit: one 'quota' reason), `dims` (the buckets an admission is
-- charged to, for a booking: {tat, cost, limit, key, field}), the declared TATs after it
-- (`req_tat`, `tok_tat`), the learned ones (`lrpm`, `ltpm`, `lreq`, `ltok`), the
-- provider's window it moves (`wend`, `wleft`), and `rpm`, `tpm`, `window` as charged
-- (0 for a booked slot: its quota is paid, it may run from its slot on).
local function quota_says(c, st, now, est, slot, learned, in_windows)
  local rpm, tpm, window = c.rpm, c.tpm, c.window
  local qkey, lkey, skey = c.qkey, c.lkey, c.skey
  local req_tat, tok_tat = nil, nil
  local waits_s = {}  -- declared and learned quotas alike: one 'quota' reason
  local dims = {}
  if slot then  -- its quota is paid: it may run from its slot on
    if now + SLACK_S < slot then waits_s[1] = slot - now end
    rpm, tpm, window = 0, 0, 0  -- nothing more to charge
  end
  if rpm > 0 or tpm > 0 then
    local q = redis.call('HMGET', qkey, 'req', 'tok')
    req_tat, tok_tat = tonumber(q[1] or '-1e300'), tonumber(q[2] or '-1e300')
    if rpm > 0 and window <= 0 and not in_windows then
      dims[#dims + 1] = {req_tat, 1, rpm, qkey, 'req'}
    end
    if tpm > 0 and est > 0 then dims[#dims + 1] = {tok_tat, est, tpm, qkey, 'tok'} end
    if rpm > 0 and window > 0 then
      local count = redis.call('ZCARD', lkey)
      if count >= rpm then  -- full: drop what left the window, count again
        count = count - redis.call('ZREMRANGEBYSCORE', lkey, '-inf', now - window)
      end
      local excess = count - rpm
      if excess >= 0 then  -- the oldest `excess + 1` must leave the window first
        local oldest = redis.call('ZRANGE', lkey, excess, excess, 'WITHSCORES')
        waits_s[#waits_s + 1] = math.max(0, tonumber(oldest[2]) + window - now)
      end
      -- Charged to the bucket too, unenforced: workers that count rpm as a bucket
      -- (during a rolling upgrade, or after a changed setting) see this admission.
      req_tat = math.min(math.max(req_tat, now) + 60.0 / rpm, now + 60.0)
    elseif rpm > 0 and in_windows then  -- the provider's window enforces it (below)
      req_tat = math.min(math.max(req_tat, now) + 60.0 / rpm, now + 60.0)
    elseif rpm > 0 then
      req_tat = charge(waits_s, req_tat, now, 1, rpm)
    end
    if tpm > 0 and est > 0 then tok_tat = charge(waits_s, tok_tat, now, est, tpm) end
  end
  -- the provider's announced limits (learned at settle), beside any declared quota
  local lrpm, ltpm, lreq, ltok = 0, 0, nil, nil
  local wend, wleft = nil, nil  -- the provider's window, when an admission moves it
  if not slot and learned then
    lrpm, ltpm = tonumber(st[6] or '0'), tonumber(st[8] or '0')
    lreq, ltok = tonumber(st[7] or '-1e300'), tonumber(st[9] or '-1e300')
    if lrpm > 0 and not in_windows then dims[#dims + 1] = {lreq, 1, lrpm, skey, 'lreq'} end
    if ltpm > 0 and est > 0 then dims[#dims + 1] = {ltok, est, ltpm, skey, 'ltok'} end
    if in_windows then  -- core.quota.window_take: a lower declared rpm holds back the rest
      local held_back = 0
      if rpm > 0 then held_back = math.max(0, lrpm - rpm) end
      wend, wleft = tonumber(st[11] or '-1e300'), tonumber(st[12] or '0')
      if now >= wend then
        wend, wleft = now + MARGIN_S + 60.0, lrpm - 1
      elseif wleft - held_back >= 1 and now < wend - MARGIN_S then
        wleft = wleft - 1
      else
        waits_s[#waits_s + 1] = wend - now
      end
    elseif lrpm > 0 then
      lreq = charge(waits_s, lreq, now, 1, lrpm)
      if st[11] and now < tonumber(st[11]) then  -- core.quota.window_charge: kept up to date
        wend, wleft = tonumber(st[11]), math.max(0, tonumber(st[12] or '0') - 1)
      end
    end
    if ltpm > 0 and est > 0 then ltok = charge(waits_s, ltok, now, est, ltpm) end
  end
  return {waits = waits_s, dims = dims, req_tat = req_tat, tok_tat = tok_tat, lrpm = lrpm,
    ltpm = ltpm, lreq = lreq, ltok = ltok, wend = wend, wleft = wleft, rpm = rpm, tpm = tpm,
    window = window}
end
