-- execution.lua: one live run per task message, told apart by a heartbeat.
--
-- KEYS[1]  {p}:v1:run:<run>           STRING  the live run's token (TTL: a few heartbeats)
-- KEYS[2]  {p}:v1:done:<run>          STRING  "1": this message's run is over for good;
--                                             "b:<time>": a run of it began at <time>
--                                             (the worker's clock, epoch s) and is not over
-- KEYS[3]  {p}:v1:redeliveries:<run>  STRING  copies that ran because their run had died
--          (<run> = <task id>:<submission>:<deferral>:<retries>)
-- KEYS[4]  {p}:v1:parked:<lot>        ZSET    (begin) the lot this message was released
-- KEYS[5]  {p}:v1:parked:<lot>:msg    HASH    from: its entries "<run>" and "<run>:copy",
--                                             kept since their release, are forgotten
-- ARGV[1]  "begin", "finish", "release" or "handback"    ARGV[2]  this run's token
-- ARGV[3]  run marker TTL, ms                ARGV[4]  done TTL, seconds
-- ARGV[5]  1 if this message is a copy (redelivered by the broker, or parked as a copy)
-- ARGV[6]  copies allowed to run           ARGV[7]  (begin) the worker's time, epoch s
-- ARGV[8]  (begin, from a lot) the run, "<run>"
-- Returns  begin: {"go"} or {"go", <time>} (an earlier run of this message began at
--          <time> and never finished: the caller asks the result backend whether it
--          stored an outcome after <time>), {"done"} (a copy of a finished run: drop
--          it), {"running", ms}
--          (a copy of a run whose heartbeat is alive: check again in ms) or {"poison"}
--          (its run died too often); finish, release: {"ok"}.
--          finish: the outcome is final, copies are dropped; release: the run ended but
--          its message goes on (Celery terminated it, or it was handed back): the next
--          copy runs, and is not counted as a copy of a dead run; handback: the same,
--          but the copy counts toward the cap (a retry the broker did not take, handed
--          back: a publish that fails every time ends as poison, not in a loop).
-- Time: Redis's own (TTLs).

local mode, token = ARGV[1], ARGV[2]
if mode == 'finish' or mode == 'release' or mode == 'handback' then
  if mode == 'finish' then
    redis.call('SET', KEYS[2], '1', 'EX', math.ceil(tonumber(ARGV[4])))
  elseif mode == 'release' then
    -- handed back, not lost: the copy that runs next does not count toward the cap
    redis.call('DECR', KEYS[3])
    redis.call('EXPIRE', KEYS[3], math.ceil(tonumber(ARGV[4])))
  end
  if redis.call('GET', KEYS[1]) == token then redis.call('DEL', KEYS[1]) end
  return {'ok'}
end
if KEYS[5] then
  redis.call('ZREM', KEYS[4], ARGV[8], ARGV[8] .. ':copy')
  redis.call('HDEL', KEYS[5], ARGV[8], ARGV[8] .. ':copy', ARGV[8] .. '#released',
    ARGV[8] .. ':copy#released')
end
local began = redis.call('GET', KEYS[2])
if began and string.sub(began, 1, 2) ~= 'b:' then return {'done'} end
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= token then
  return {'running', redis.call('PTTL', KEYS[1])}
end
if ARGV[5] == '1' then
  local times = redis.call('INCR', KEYS[3])
  redis.call('EXPIRE', KEYS[3], math.ceil(tonumber(ARGV[4])))
  if times > tonumber(ARGV[6]) then return {'poison'} end
end
redis.call('SET', KEYS[1], token, 'PX', ARGV[3])
if began then return {'go', string.sub(began, 3)} end
redis.call('SET', KEYS[2], 'b:' .. ARGV[7], 'EX', math.ceil(tonumber(ARGV[4])))
return {'go'}
