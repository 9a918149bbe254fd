-- bury.lua: move a claimed parked entry that is not a message Celery can take (or that
-- failed to publish, for its own fault, too often) to the dead letters.
--
-- KEYS[1]  {p}:v1:parked:<lot>   KEYS[2]  ...:msg   KEYS[3]  ...:claim
-- KEYS[4]  {p}:v1:parked:<lot>:dead   HASH  entry id -> why, a newline, then the whole
--                                           entry (it can be parked again once mended)
-- ARGV[1]  entry id        ARGV[2]  the releaser's token        ARGV[3]  why
-- Returns  1 if this releaser held the claim (the entry is buried), else 0.

if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return 0 end
local entry = redis.call('HGET', KEYS[2], ARGV[1]) or ''
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1], ARGV[1] .. '#released', ARGV[1] .. '#failed')
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[3] .. '\n' .. entry)
return 1
