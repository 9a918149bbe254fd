-- admit_tenant.lua: included by admit.lua (a line "-- include: admit_tenant"), after
-- gcra.lua and the constants MARGIN_S and TENANT_KEPT_S; not a script of its own.
-- A tenant's caps at each candidate (SPEC §8, core.standing.caps_say), fleet-wide:
-- its calls in flight there (the permits in its set that the source's permits still
-- hold, unexpired: a holder that died lapses with its lease) and its buckets.

-- The caps of a call's tenant, from its standing's caps text "<concurrency>,<rpm>,<tpm>"
-- (0: no such cap): a table with
--   says(pkey, tkey, rkey, now, est): what they say of one more call of `est` tokens at
--     the candidate whose permits are `pkey`, the tenant's there `tkey` (its permits) and
--     `rkey` (its buckets): {refused, wait (seconds until they admit it; nil: not known,
--     one of its calls must end first), req, tok (its buckets' times once charged)}
--   charge(tkey, rkey, permit, now, said): count a grant of `permit` there
local function tenant_caps(text)
  local c, r, t = string.match(text, '^(%d+),(%d+),(%d+)$')
  local conc, rpm, tpm = tonumber(c), tonumber(r), tonumber(t)
  local caps = {}

  function caps.says(pkey, tkey, rkey, now, est)
    local full = false
    if conc > 0 then
      local n = redis.call('ZCARD', tkey)
      if n >= conc then  -- at the cap: forget the permits no longer held, count again
        local held = redis.call('ZRANGE', tkey, 0, -1)
        for from = 1, #held, 500 do
          local part = {unpack(held, from, math.min(from + 499, #held))}
          local leases = redis.call('ZMSCORE', pkey, unpack(part))
          for k, permit in ipairs(part) do
            if not leases[k] or tonumber(leases[k]) <= now then
              redis.call('ZREM', tkey, permit)
              n = n - 1
            end
          end
        end
      end
      full = n >= conc
    end
    local req, tok, wait = nil, nil, nil
    if rpm > 0 or tpm > 0 then
      local b = redis.call('HMGET', rkey, 'req', 'tok')
      req, tok = tonumber(b[1] or '-1e300'), tonumber(b[2] or '-1e300')
      local w
      if rpm > 0 then
        req, w = gcra(req, now, 1, rpm, MARGIN_S)
        wait = w
      end
      if tpm > 0 and est > 0 then
        tok, w = gcra(tok, now, est, tpm, MARGIN_S)
        if w and (not wait or w > wait) then wait = w end
      end
    end
    return {refused = full or wait ~= nil, wait = (not full) and wait or nil, req = req,
      tok = tok}
  end

  function caps.charge(tkey, rkey, permit, now, said)
    if conc > 0 then
      redis.call('ZADD', tkey, now, permit)
      redis.call('PEXPIRE', tkey, math.ceil(TENANT_KEPT_S * 1000))
    end
    if said.req then
      local last = math.max(said.req, said.tok)
      redis.call('HSET', rkey, 'req', fmt(said.req), 'tok', fmt(said.tok))
      -- kept until a settle's correction (a period at most) no longer changes anything
      redis.call('PEXPIRE', rkey, math.max(1, math.ceil((last - now + 61.0) * 1000)))
    end
  end

  return caps
end
