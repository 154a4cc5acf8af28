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
