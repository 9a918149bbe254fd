-- clock.lua: included by every script that reads the store's clock (a line
-- "-- include: clock"), not a script of its own.

-- The store's clock: `arg` (ARGV[1]), the caller's time in seconds, or Redis TIME
-- when it is "" (the default).
local function store_now(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- A number as handed to redis.call and replied: %.17g, read back exactly.
local function fmt(x) return string.format('%.17g', x) end
