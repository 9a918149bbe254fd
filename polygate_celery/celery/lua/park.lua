-- park.lua: park a deferred task's message until it is due, and mark the run that
-- deferred it as finished, in one step: if that run's own message comes back (its
-- worker died before acknowledging it), it is dropped instead of running again.
--
-- KEYS[1]  {p}:v1:parked:<app>        ZSET    entry id -> due time (s); a claim moves it
--                                             to the end of the claim's lease
-- KEYS[2]  {p}:v1:parked:<app>:msg    HASH    entry id -> the message, as JSON
-- KEYS[3]  {p}:v1:done:<task id>:<n>  STRING  the deferring run (deferral number n) is over
-- ARGV[1]  entry id: "<task id>:<n + 1>" (parking it again changes nothing else)
-- ARGV[2]  seconds until due      ARGV[3]  the message      ARGV[4]  done TTL seconds
-- Returns  "0". Time: Redis TIME.

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('SET', KEYS[3], '1', 'EX', math.ceil(tonumber(ARGV[4])))
return '0'
