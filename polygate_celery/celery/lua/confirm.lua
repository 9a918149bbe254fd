-- confirm.lua: forget a parked message its releaser has published.
--
-- KEYS[1]  {p}:v1:parked:<lot>   KEYS[2]  ...:msg   KEYS[3]  ...:claim
-- ARGV[1]  entry id        ARGV[2]  the releaser's token
-- Returns  1 if this releaser still held the claim (the entry is gone), else 0.

if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
