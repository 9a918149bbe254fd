-- bury.lua: move a claimed parked entry that is not a task message to the dead letters.
--
-- KEYS[1]  {p}:v1:parked:<lot>   KEYS[2]  ...:msg   KEYS[3]  ...:claim
-- KEYS[4]  {p}:v1:parked:<lot>:dead   HASH  entry id -> why, then the entry (first 4 KB)
-- ARGV[1]  entry id        ARGV[2]  the releaser's token        ARGV[3]  why
-- Returns  1 if this releaser held the claim (the entry is buried), else 0.

if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return 0 end
local entry = redis.call('HGET', KEYS[2], ARGV[1]) or ''
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1], ARGV[1] .. '#released')
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[3] .. '\n' .. string.sub(entry, 1, 4096))
return 1
