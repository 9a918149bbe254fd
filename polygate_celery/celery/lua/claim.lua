-- claim.lua: claim parked messages that are due, for one release round.
--
-- KEYS[1]  {p}:v1:parked:<lot>       ZSET  entry id -> due time, or the end of a claim's lease
-- KEYS[2]  {p}:v1:parked:<lot>:msg   HASH  entry id -> message
-- KEYS[3]  {p}:v1:parked:<lot>:claim HASH  entry id -> the claiming releaser's token
-- ARGV[1]  at most this many      ARGV[2]  claim lease seconds      ARGV[3]  releaser token
-- Returns  {id, message, id, message, ...}. A claimed entry is due again when its lease
--          ends, so a releaser that dies mid-release loses nothing. Time: Redis TIME.

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, id in ipairs(due) do
  local message = redis.call('HGET', KEYS[2], id)
  if message then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), id)
    redis.call('HSET', KEYS[3], id, ARGV[3])
    out[#out + 1] = id
    out[#out + 1] = message
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id .. '#released', id .. '#failed')
    redis.call('HDEL', KEYS[3], id)
  end
end
return out
