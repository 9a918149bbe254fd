-- admit_breaker.lua: included by admit.lua (a line "-- include: admit_breaker"), not a
-- script of its own. A source's breaker at admission, as core.breaker.breaker_admit.

-- The breaker's say (`st`, read from the state HASH `skey`, starts with mode, open_until,
-- probe): a refusal goes into `reasons`, and when it ends into `known`. Returns whether
-- an admission takes the half-open probe, and the mode it leaves. A probe whose lease
-- ended (its permit in `pkey` gone or expired) frees the half-open slot.
local function breaker_says(pkey, skey, st, now, reasons, known)
  local mode, open_until, probe = st[1] or 'closed', tonumber(st[2] or '0'), st[3]
  if probe then
    local lease_end = redis.call('ZSCORE', pkey, probe)
    if not lease_end or tonumber(lease_end) <= now then
      probe = false  -- the probe's lease ended: the half-open slot is free again
      redis.call('HDEL', skey, 'probe')
      if lease_end then redis.call('ZREM', pkey, st[3]) end
    end
  end
  if mode == 'open' then
    if now >= open_until then return true, 'half_open' end
    reasons[#reasons + 1] = 'breaker_open'; known[#known + 1] = open_until - now
  elseif mode == 'half_open' then
    if not probe then return true, mode end
    reasons[#reasons + 1] = 'probe_in_flight'
  end
  return false, mode
end
