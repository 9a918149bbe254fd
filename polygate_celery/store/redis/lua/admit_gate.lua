-- admit_gate.lua: included by admit.lua (a line "-- include: admit_gate"), not a script
-- of its own. The scope's gate at admission.

-- While the scope's gate (HASH `gkey`: until reset probe probe_until error) is closed,
-- one call at a time probes: `call` takes the probe (for `lease_s`) if it is free, its
-- own, or its lease ended; any other is refused: {2, gated_for_s, reset, error}. A
-- caller holding its permit already is answered by `held()` (a grant, or nil). A gate
-- open by time stays on record (its key expires a minute on): a success ends the stall
-- it records, and says so (settle.lua); a later close is the same outage.
local function gate_refusal(gkey, now, call, lease_s, held)
  local g = redis.call('HMGET', gkey, 'until', 'probe', 'probe_until', 'reset', 'error')
  local closed_until = tonumber(g[1])
  if not closed_until or closed_until <= now then return nil end
  local grant = held()
  if grant then return grant end
  if not g[2] or g[2] == call or tonumber(g[3] or '-1e300') <= now then
    redis.call('HSET', gkey, 'probe', call, 'probe_until', now + lease_s)
    return nil
  end
  return {2, fmt(closed_until - now), g[4] or '0', g[5] or ''}
end
