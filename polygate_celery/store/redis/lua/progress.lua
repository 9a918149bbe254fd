-- progress.lua: read a scope's progress age, or mark progress now.
--
-- KEYS[1]  {p}:v1:scope:<scope>:progress   STRING  time of the last success (TTL)
-- ARGV[1]  now in seconds, or "" to read Redis TIME (the default store clock)
-- ARGV[2]  "age" or "mark"      ARGV[3]  progress TTL seconds
-- Returns  age: seconds since the last success as a string, "" when there is none
--               (absent, expired, or older than the TTL in the given clock)
--          mark: "0"
-- Time: Redis TIME unless ARGV[1] is given.

-- include: clock

local now, ttl = store_now(ARGV[1]), tonumber(ARGV[3])
if ARGV[2] == 'mark' then
  redis.call('SET', KEYS[1], fmt(now), 'EX', math.ceil(ttl))
  return '0'
end
local marked = redis.call('GET', KEYS[1])
if not marked then return '' end
local age = now - tonumber(marked)
if age >= ttl then return '' end
return fmt(math.max(0, age))
