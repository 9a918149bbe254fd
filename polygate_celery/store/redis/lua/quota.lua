-- quota.lua: read a quota group's state for status views (read-only).
--
-- KEYS[1]  {p}:v1:quota:<group>        HASH  req tok (GCRA theoretical arrival times)
-- KEYS[2]  {p}:v1:quota:<group>:log    ZSET  permit id -> admission time (sliding window)
-- ARGV[1]  now in seconds, or "" to read Redis TIME (the default store clock)
-- ARGV[2]  the sliding window's length in seconds
-- Returns  {req_ahead_s, tok_ahead_s, in_window}: how far each theoretical arrival time
--          is ahead of now, "0" when it is not (t seconds ahead: t / 60 of the minute is
--          spent), and how many admissions the sliding window holds
-- Time: Redis TIME unless ARGV[1] is given.

-- include: clock

local now = store_now(ARGV[1])
local q = redis.call('HMGET', KEYS[1], 'req', 'tok')
local req, tok = tonumber(q[1] or '-1e300'), tonumber(q[2] or '-1e300')
local in_window = redis.call('ZCOUNT', KEYS[2], string.format('(%.17g', now - tonumber(ARGV[2])), '+inf')
return {fmt(math.max(0, req - now)),
  fmt(math.max(0, tok - now)), tostring(in_window)}
