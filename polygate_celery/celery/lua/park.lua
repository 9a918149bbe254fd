-- park.lua: park a deferred task's message until it is due.
--
-- KEYS[1]  {p}:v1:parked          ZSET  entry id -> due time (s); a claim moves it to the lease end
-- KEYS[2]  {p}:v1:parked:msg      HASH  entry id -> the message, as JSON
-- ARGV[1]  entry id: "<task id>:<deferral number>" (parking it again changes nothing else)
-- ARGV[2]  seconds until due      ARGV[3]  the message
-- Returns  "0". Time: Redis TIME.

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return '0'
