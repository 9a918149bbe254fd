-- confirm.lua: a releaser has published parked messages (a round's, in one call).
--
-- KEYS[1]  {p}:v1:parked:<lot>   KEYS[2]  ...:msg   KEYS[3]  ...:claim
-- ARGV[1]  the releaser's token
-- ARGV[2]  seconds to keep each entry until the run it starts begins (execution.lua
--          forgets it then); 0: forget it now (a lot of an earlier version, whose
--          entries no run names)
-- ARGV[3..]  the entry ids
-- Returns  per entry, in order: 1 if this releaser still held its claim, else 0.
-- A kept entry is due again after ARGV[2] seconds: a published message that the broker
-- lost before any worker ran it (kombu's Redis transport pops a message before it
-- records it as unacknowledged) is released again; a copy is dropped by its run's guard.
-- Each release of the same entry keeps it twice as long as the one before (at most
-- MAX_DOUBLINGS times doubled; the count is the field "<id>#released" of KEYS[2]): a
-- message that is only waiting behind a long queue is copied a few times, not once per
-- ARGV[3] for as long as the queue takes (each copy would lengthen the queue). A
-- confirmed entry loses its count of failed releases ("<id>#failed", unpublished.lua).
-- Time: Redis TIME.

local MAX_DOUBLINGS = 5

local token, keep_s = ARGV[1], tonumber(ARGV[2])
local now = nil
local function confirm(id)
  if redis.call('HGET', KEYS[3], id) ~= token then return 0 end
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[2], id .. '#failed')  -- published: earlier failures are over
  if keep_s > 0 then
    -- The run may have begun already and forgotten the entry (execution.lua): keep
    -- nothing then, or the entry would come back without its message.
    if redis.call('HEXISTS', KEYS[2], id) == 0 then
      redis.call('HDEL', KEYS[2], id .. '#released')
      return 1
    end
    local released = redis.call('HINCRBY', KEYS[2], id .. '#released', 1)
    local keep = keep_s * 2 ^ math.min(released - 1, MAX_DOUBLINGS)
    if now == nil then
      local t = redis.call('TIME')
      now = tonumber(t[1]) + tonumber(t[2]) / 1000000
    end
    redis.call('ZADD', KEYS[1], now + keep, id)
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id, id .. '#released')
  end
  return 1
end

local confirmed = {}
for i = 3, #ARGV do confirmed[#confirmed + 1] = confirm(ARGV[i]) end
return confirmed
