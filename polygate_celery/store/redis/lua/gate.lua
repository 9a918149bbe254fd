-- gate.lua: close a scope's gate after a stalled verdict (a later close is kept), or
-- read how long it stays closed. A close never frees another call's live probe.
--
-- KEYS[1]  {p}:v1:scope:<scope>:gate   HASH  until reset probe probe_until error
-- ARGV[1]  now in seconds, or "" to read Redis TIME (the default store clock)
-- ARGV[2]  "close" or "read"
-- ARGV[3]  close: seconds to keep it closed
-- ARGV[4]  close: "1" when it opens as rate limits reset, else "0" (kept with the later close)
-- ARGV[5]  close: the closing call's id, or "": if that call holds the probe, its probe
--          ended (the slot is free); another call's probe stays until its probe_until,
--          so one call at a time probes however many verdicts race
-- ARGV[6]  close: the closing verdict's last error ("" for none: the one kept stays), told
--          to the calls the gate refuses (admit.lua)
-- ARGV[7]  close: seconds a gate open by time stays the outage's record (the key's TTL
--          after it opens: the store's GATE_KEPT_S)
-- Returns  close: "1" if no stall was on record (this call closed an open gate: the
--          outage begins), else "0" (closed already, or closed again after opening by
--          time: the same outage). The key expires on its own GATE_KEPT_S after the gate
--          opened by time; a success deletes it (settle.lua).
--          read: seconds it stays closed, "0" when open (read-only)
-- Time: Redis TIME unless ARGV[1] is given.

-- include: clock

local now = store_now(ARGV[1])
local closed_until = tonumber(redis.call('HGET', KEYS[1], 'until') or '-1e300')
if ARGV[2] == 'read' then
  return fmt(math.max(0, closed_until - now))
end
local KEPT_S = tonumber(ARGV[7])  -- a gate open by time stays the outage's record this long
local was_open = closed_until + KEPT_S <= now
local asked = now + tonumber(ARGV[3])
if closed_until <= now then
  -- the gate was open: a probe of an earlier closing is no probe of this one
  redis.call('HDEL', KEYS[1], 'probe', 'probe_until')
else
  local closer = ARGV[5] or ''
  if closer ~= '' and redis.call('HGET', KEYS[1], 'probe') == closer then
    redis.call('HDEL', KEYS[1], 'probe', 'probe_until')
  end
end
if asked >= closed_until then
  closed_until = asked
  redis.call('HSET', KEYS[1], 'until', fmt(closed_until), 'reset', ARGV[4] or '0')
end
if (ARGV[6] or '') ~= '' then redis.call('HSET', KEYS[1], 'error', ARGV[6]) end
redis.call('EXPIRE', KEYS[1], math.ceil(closed_until - now + KEPT_S))
return was_open and '1' or '0'
