-- Prepended to every script that LuaScript ships (one convention for every algorithm):
-- the call's first argument is the time by which it must run, in microseconds of the
-- Redis server's clock (TIME); 0 means none. A call that starts later changes nothing and
-- answers the error LATE: its caller has already been answered with the failure policy.
-- The script's own text then sees its own arguments from ARGV[1] on, as if the deadline
-- had never been there.
local ferryman_by = tonumber(ARGV[1])
if ferryman_by > 0 then
  local ferryman_t = redis.call('TIME')
  local ferryman_late = tonumber(ferryman_t[1]) * 1000000 + tonumber(ferryman_t[2]) - ferryman_by
  if ferryman_late > 0 then
    return redis.error_reply('LATE by ' .. ferryman_late .. 'us: nothing changed')
  end
end
local ARGV = (function(all)
  local own = {}
  for i = 2, #all do own[i - 1] = all[i] end
  return own
end)(ARGV)
-- The script's "now": the caller's when given (not ''), else the Redis server's clock (TIME)
-- in the unit the script counts in: 's' (seconds, fractional), 'ms' (whole) or 'us' (whole).
local function ferryman_now(given, unit)
  if given ~= '' then
    return tonumber(given)
  end
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  if unit == 'us' then
    return s * 1000000 + us
  elseif unit == 'ms' then
    return s * 1000 + math.floor(us / 1000)
  end
  return s + us / 1000000
end
