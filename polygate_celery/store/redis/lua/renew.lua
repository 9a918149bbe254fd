-- renew.lua: extend the leases of permits still held, in one call.
--
-- KEYS[i]  {p}:v1:src:<name>:permits   ZSET  permit id -> lease expiry (one key per lease)
-- ARGV[1]  now in seconds, or "" to read Redis TIME (the default store clock)
-- ARGV[2i], ARGV[2i+1]  permit id and lease seconds of the i-th lease
-- Returns  one 1/0 per lease: renewed, or no longer held (reclaimed, settled, or
--          expired: an expired lease is removed, never revived)
-- Time: Redis TIME unless ARGV[1] is given.

-- include: clock

local now = store_now(ARGV[1])
local held = {}
for i = 1, #KEYS do
  local permit = ARGV[2 * i]
  local expiry = tonumber(redis.call('ZSCORE', KEYS[i], permit))
  if expiry and expiry > now then
    redis.call('ZADD', KEYS[i], 'XX', now + tonumber(ARGV[2 * i + 1]), permit)
    held[i] = 1
  else
    if expiry then redis.call('ZREM', KEYS[i], permit) end
    held[i] = 0
  end
end
return held
