-- execution.lua: guard one run of a redelivered or released task message.
--
-- KEYS[1]  {p}:v1:run:<task id>:<n>           STRING  a run in progress (TTL: the hard time limit)
-- KEYS[2]  {p}:v1:done:<task id>:<n>          STRING  this message's run has finished
-- KEYS[3]  {p}:v1:redeliveries:<task id>:<n>  STRING  times the message came back unacked
-- ARGV[1]  "begin" or "finish"    ARGV[2]  run TTL seconds    ARGV[3]  done TTL seconds
-- ARGV[4]  1 if the broker redelivered this message, else 0
-- ARGV[5]  redeliveries allowed
-- ARGV[1] also "release": the run ended without finishing its message (a Celery retry
--          republished it): forget the run, so the next copy runs.
-- Returns  begin: "go", "done" (a copy of a finished run: drop it), "running" (a copy of a
--          live run: drop it) or "poison" (redelivered too often); finish, release: "0".

if ARGV[1] == 'finish' then
  redis.call('SET', KEYS[2], '1', 'EX', math.ceil(tonumber(ARGV[3])))
  redis.call('DEL', KEYS[1])
  return '0'
end
if ARGV[1] == 'release' then
  redis.call('DEL', KEYS[1])
  return '0'
end
if redis.call('EXISTS', KEYS[2]) == 1 then return 'done' end
local redelivered = ARGV[4] == '1'
if redelivered then
  local times = redis.call('INCR', KEYS[3])
  redis.call('EXPIRE', KEYS[3], math.ceil(tonumber(ARGV[3])))
  if times > tonumber(ARGV[5]) then return 'poison' end
elseif redis.call('EXISTS', KEYS[1]) == 1 then
  return 'running'
end
redis.call('SET', KEYS[1], '1', 'EX', math.ceil(tonumber(ARGV[2])))
return 'go'
