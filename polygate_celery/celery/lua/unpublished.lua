-- unpublished.lua: a claimed parked entry failed to publish with an error that is
-- neither plainly the broker's nor plainly the entry's: count it, and bury the entry
-- once it has failed ARGV[3] releases (a release that fails every time does not cycle
-- for ever). The entry stays claimed otherwise: due again when the claim's lease ends.
--
-- KEYS[1]  {p}:v1:parked:<lot>   KEYS[2]  ...:msg   KEYS[3]  ...:claim
-- KEYS[4]  {p}:v1:parked:<lot>:dead   (see bury.lua)
-- ARGV[1]  entry id    ARGV[2]  the releaser's token    ARGV[3]  failed releases allowed
-- ARGV[4]  why (buried: the reason, then a newline and the whole entry)
-- Returns  {failed releases so far, 1 if buried now else 0}; {0, 0} if this releaser no
--          longer held the claim. The count is the field "<id>#failed" of KEYS[2]; a
--          published (confirmed) or buried entry loses it.

local id, token = ARGV[1], ARGV[2]
if redis.call('HGET', KEYS[3], id) ~= token then return {0, 0} end
local entry = redis.call('HGET', KEYS[2], id)
if not entry then return {0, 0} end
local failed = redis.call('HINCRBY', KEYS[2], id .. '#failed', 1)
if failed < tonumber(ARGV[3]) then return {failed, 0} end
redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[2], id, id .. '#released', id .. '#failed')
redis.call('HDEL', KEYS[3], id)
redis.call('HSET', KEYS[4], id, ARGV[4] .. '\n' .. entry)
return {failed, 1}
