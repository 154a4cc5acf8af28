-- One descriptor node's token bucket decision, applied atomically: the Redis twin of
-- model.decide_node and MemoryNodeBuckets.take_at (the same double arithmetic in the same
-- order; state is written with %.17g so it reads back exactly).
--
-- KEYS[1]   the bucket: a string "<stored> <next_free_us>", expiring once it is full again
-- ARGV[1]   now in microseconds, or "" to use the Redis server's clock (TIME)
-- ARGV[2]   tokens requested (0 only looks)
-- ARGV[3]   longest wait allowed, ms
-- ARGV[4]   size
-- ARGV[5]   fill_rate, tokens per second
-- ARGV[6]   max_debt_millis
-- returns   {status, wait_millis, stored, debt_us}: status 0 OK, 1 refused; stored and
--           debt_us (next free time - now; as text, %.17g) are the bucket after the decision
local now = ferryman_now(ARGV[1], 'us')
local tokens, max_wait = tonumber(ARGV[2]), tonumber(ARGV[3]) * 1000.0
local size, fill_rate, max_debt = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

local stored, next_free = bucket_refilled(redis.call('GET', KEYS[1]), size, fill_rate, now)
local function answer(status, wait)
  return {status, wait, string.format('%.17g', stored), string.format('%.17g', next_free - now)}
end
if tokens <= 0 then
  return answer(0, 0)
end
local wait = next_free - now
if wait > max_wait then
  return answer(1, 0)
end
local spend = math.min(tokens, stored)
local missing = tokens - spend
local after = next_free
if missing > 0 then
  if fill_rate <= 0 then
    return answer(1, 0)
  end
  after = next_free + missing * 1e6 / fill_rate
end
if after - now > max_debt * 1000.0 then
  return answer(1, 0)
end
stored = stored - spend
next_free = after
local state = string.format('%.17g %.17g', stored, next_free)
if fill_rate > 0 then
  local full_in = (next_free - now) / 1000 + (size - stored) / fill_rate * 1000
  redis.call('SET', KEYS[1], state, 'PX', math.ceil(full_in) + 1000)
else
  redis.call('SET', KEYS[1], state)
end
return answer(0, math.floor(wait / 1000.0))
