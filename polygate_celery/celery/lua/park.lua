-- park.lua: park a task message until it is due. A deferral also ends the run that
-- deferred it, in the same step: if that run's own message comes back (its worker died
-- before acknowledging it), it is dropped instead of running again.
--
-- KEYS[1]  {p}:v1:parked:<lot>        ZSET    entry id -> due time (s); a claim moves it
--                                             to the end of the claim's lease
-- KEYS[2]  {p}:v1:parked:<lot>:msg    HASH    entry id -> the message, as JSON
-- KEYS[3]  {p}:v1:parked:<lot>:claim  HASH    entry id -> a releaser's token: parking an
--                                             entry again voids a claim on its old message
-- KEYS[4]  {p}:v1:done:<run>          STRING  the deferring run is over (deferrals only)
-- KEYS[5]  {p}:v1:run:<run>           STRING  the deferring run's marker (deferrals only)
-- ARGV[1]  entry id: the run the message starts (parking it again changes nothing else)
-- ARGV[2]  seconds until due      ARGV[3]  the message      ARGV[4]  done TTL seconds
-- ARGV[5]  the deferring run's token
-- ARGV[6]  "1" when the last key is the index of the scope whose outage parked the task
--          ({p}:v1:parked:<lot>:scope:<scope>, ZSET entry id -> due time; wake.lua makes
--          them due at once when the scope answers again), else "0"
-- Returns  "0". Time: Redis TIME.

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HDEL', KEYS[3], ARGV[1])
local ending = #KEYS >= 5
if ARGV[6] == '1' then
  local index = KEYS[#KEYS]
  redis.call('ZREMRANGEBYSCORE', index, '-inf', now - 86400)  -- long released on their own
  redis.call('ZADD', index, now + tonumber(ARGV[2]), ARGV[1])
  redis.call('EXPIRE', index, math.ceil(tonumber(ARGV[2])) + 86400)
end
if ending then
  redis.call('SET', KEYS[4], '1', 'EX', math.ceil(tonumber(ARGV[4])))
  if redis.call('GET', KEYS[5]) == ARGV[5] then redis.call('DEL', KEYS[5]) end
end
return '0'
