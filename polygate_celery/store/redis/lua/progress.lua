-- progress.lua: read a scope's progress age, or mark progress now.
--
-- KEYS[1]  {p}:v1:scope:<scope>:progress   STRING  time of the last success (TTL)
-- KEYS[2]  {p}:v1:scope:<scope>:class_progress  HASH  class rank -> time of its last
--                                           success (TTL; see settle.lua)
-- ARGV[1]  now in seconds, or "" to read Redis TIME (the default store clock)
-- ARGV[2]  "age" or "mark"      ARGV[3]  progress TTL seconds
-- ARGV[4]  a class's rank: its own progress (age), or its progress beside the scope's
--          (mark); "" for the scope's alone
-- Returns  age: seconds since the last success as a string, "" when there is none
--               (absent, expired, or older than the TTL in the given clock)
--          mark: "0"
-- Time: Redis TIME unless ARGV[1] is given.

-- include: clock

local now, ttl, rank = store_now(ARGV[1]), tonumber(ARGV[3]), ARGV[4]
if ARGV[2] == 'mark' then
  redis.call('SET', KEYS[1], fmt(now), 'EX', math.ceil(ttl))
  if rank ~= '' then
    redis.call('HSET', KEYS[2], rank, fmt(now))
    redis.call('EXPIRE', KEYS[2], math.ceil(ttl))
  end
  return '0'
end
local marked
if rank ~= '' then
  marked = redis.call('HGET', KEYS[2], rank)
else
  marked = redis.call('GET', KEYS[1])
end
if not marked then return '' end
local age = now - tonumber(marked)
if age >= ttl then return '' end
return fmt(math.max(0, age))
