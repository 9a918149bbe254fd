-- wake.lua: make a scope's parked tasks due now: all of them once the scope answers
-- again, or the earliest one as the scope's probe while every task of it is parked.
--
-- KEYS[1]  {p}:v1:parked:<lot>               ZSET    entry id -> due time (s)
-- KEYS[2]  {p}:v1:parked:<lot>:msg           HASH    entry id -> message
-- KEYS[3]  {p}:v1:parked:<lot>:claim         HASH    entry id -> a releaser's token
-- KEYS[4]  {p}:v1:parked:<lot>:scope:<scope> ZSET    entry id -> due time: the entries
--                                                    parked by an outage of the scope
-- KEYS[5]  {p}:v1:parked:<lot>:scope:<scope>:probe  STRING  a probe was woken lately
-- ARGV[1]  "all" or "probe"
-- ARGV[2]  probe: the probe interval in seconds
-- Returns  how many entries were made due now. An entry already claimed, released, run
--          or due is only dropped from the index (the release loop has it).
-- Time: Redis TIME.

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local probe = ARGV[1] == 'probe'
local interval = tonumber(ARGV[2] or '0') or 0
if probe and redis.call('EXISTS', KEYS[5]) == 1 then return 0 end
local woken = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  local due = tonumber(redis.call('ZSCORE', KEYS[1], id))
  local waiting = due ~= nil and due > now
    and redis.call('HEXISTS', KEYS[2], id) == 1
    and redis.call('HEXISTS', KEYS[3], id) == 0
    and redis.call('HEXISTS', KEYS[2], id .. '#released') == 0
  if not waiting then
    redis.call('ZREM', KEYS[4], id)
  elseif probe then
    -- the earliest waiting entry: a probe is due only if it would come back too late
    if due > now + interval then
      redis.call('ZADD', KEYS[1], now, id)
      redis.call('ZREM', KEYS[4], id)
      redis.call('SET', KEYS[5], '1', 'PX', math.max(1, math.floor(interval * 1000)))
      return 1
    end
    return 0
  else
    redis.call('ZADD', KEYS[1], now, id)
    redis.call('ZREM', KEYS[4], id)
    woken = woken + 1
  end
end
return woken
