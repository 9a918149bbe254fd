-- heartbeat.lua: keep one worker process's live runs marked alive.
--
-- KEYS[i]  {p}:v1:run:<run>   STRING  a run of this process, live
-- ARGV[1]  run marker TTL, ms      ARGV[i + 1]  the token of KEYS[i]'s run
-- Returns  how many markers had been taken by another run (they are left alone).
-- A marker that expired (Redis was unreachable for longer than its TTL) is set again.
-- Time: Redis's own (TTLs).

local taken = 0
for i, key in ipairs(KEYS) do
  local owner = redis.call('GET', key)
  if owner == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1])
  elseif not owner then
    redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
  else
    taken = taken + 1
  end
end
return taken
