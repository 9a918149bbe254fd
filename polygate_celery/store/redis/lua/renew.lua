-- renew.lua: extend the lease of a permit still held.
--
-- KEYS[1]  {p}:v1:src:<name>:permits   ZSET  permit id -> lease expiry
-- ARGV[1]  now in seconds, or "" to read Redis TIME (the default store clock)
-- ARGV[2]  permit id          ARGV[3]  lease seconds
-- Returns  1 if renewed, 0 if the permit is no longer held (reclaimed or settled).
-- Time: Redis TIME unless ARGV[1] is given.

local function store_now(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', store_now(ARGV[1]) + tonumber(ARGV[3]), ARGV[2])
return 1
