-- One tenant's burst-tier state on one node, read without changing anything (for the console;
-- model.py's view() interprets it by the rules burst.lua decides with).
--
-- KEYS[1]        tenant state hash (burst.lua's KEYS[1]): e<i> = tier i entry time ("" or
--                absent when inactive)
-- KEYS[2]        tenant list of grants in the last second ("time:count", burst.lua's KEYS[4])
-- KEYS[2+i]      tier i's list of grants in its window ("time:count", burst.lua's KEYS[4+i])
--                (all keys share one hash tag: one Cluster slot per node)
-- ARGV[1]        now in seconds, or "" to use the Redis server's clock (TIME)
-- ARGV[2]        n, the number of tiers
-- returns        {now, {e1, ..., en}, log_1, ..., log_n, second}: now as a string, entry
--                times as strings (false when none), each list as its entries
local now = ferryman_now(ARGV[1], 's')
local n = tonumber(ARGV[2])
local entered = {}
if n > 0 then
  local fields = {}
  for i = 1, n do fields[i] = 'e' .. i end
  entered = redis.call('HMGET', KEYS[1], unpack(fields))
end
local reply = {string.format('%.17g', now), entered}
for i = 1, n do
  reply[#reply + 1] = redis.call('LRANGE', KEYS[2 + i], 0, -1)
end
reply[#reply + 1] = redis.call('LRANGE', KEYS[2], 0, -1)
return reply
