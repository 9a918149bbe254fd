-- quota.lua: read a quota group's GCRA state for status views (read-only).
--
-- KEYS[1]  {p}:v1:quota:<group>        HASH  req tok (GCRA theoretical arrival times)
-- ARGV[1]  now in seconds, or "" to read Redis TIME (the default store clock)
-- Returns  {req_ahead_s, tok_ahead_s}: how far each theoretical arrival time is ahead
--          of now, "0" when it is not (t seconds ahead: t / 60 of the minute is spent)
-- Time: Redis TIME unless ARGV[1] is given.

local function store_now(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local now = store_now(ARGV[1])
local q = redis.call('HMGET', KEYS[1], 'req', 'tok')
local req, tok = tonumber(q[1] or '-1e300'), tonumber(q[2] or '-1e300')
return {string.format('%.17g', math.max(0, req - now)),
  string.format('%.17g', math.max(0, tok - now))}
