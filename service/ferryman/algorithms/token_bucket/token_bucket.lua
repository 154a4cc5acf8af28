-- One token bucket decision, applied atomically: the Redis twin of model.decide and of
-- MemoryTokenBucketStore.take_at, which must reach the same answers (the same double
-- arithmetic in the same order; state is written with %.17g so it reads back exactly).
--
-- KEYS[1]   buckets' state hash: field = bucket name, value = "<stored> <next_free_us>"
-- KEYS[2]   dynamic buckets only: the namespace's registry, a sorted set of its dynamic
--           bucket names scored by last use (ms); both keys share one hash tag
-- ARGV[1]   now in microseconds, or "" to use the Redis server's clock (TIME)
-- ARGV[2]   bucket name
-- ARGV[3]   tokens requested (>= 1)
-- ARGV[4]   longest wait allowed, ms
-- ARGV[5]   size
-- ARGV[6]   fill_rate, tokens per second
-- ARGV[7]   max_debt_millis
-- ARGV[8]   max_tokens_per_request
-- ARGV[9]   max_idle_millis (-1: never removed)
-- ARGV[10]  max_dynamic_buckets (0: no limit)
-- ARGV[11]  idle buckets removed by one call at most
-- returns   {status, wait_millis, created (1/0), removed bucket name...}; status numbers are
--           those of quotaservice.AllowResponse.Status
local OK, TIMEOUT, TOO_MANY_BUCKETS, TOO_MANY_TOKENS = 0, 1, 3, 4
local now = ferryman_now(ARGV[1], 'us')
local name, tokens, max_wait = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]) * 1000.0
local size, fill_rate, max_debt = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local max_tokens, max_idle = tonumber(ARGV[8]), tonumber(ARGV[9])
local max_buckets, sweep = tonumber(ARGV[10]), tonumber(ARGV[11])
local dynamic = KEYS[2] ~= nil

local removed = {}
local created = 0
if dynamic then
  local now_ms = math.floor(now / 1000)
  if max_idle >= 0 then
    removed = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now_ms - max_idle),
      'LIMIT', 0, sweep)
    if #removed > 0 then
      redis.call('ZREM', KEYS[2], unpack(removed))
      redis.call('HDEL', KEYS[1], unpack(removed))
    end
  end
  if not redis.call('ZSCORE', KEYS[2], name) then
    if max_buckets > 0 and redis.call('ZCARD', KEYS[2]) >= max_buckets then
      return {TOO_MANY_BUCKETS, 0, 0, unpack(removed)}
    end
    created = 1
  end
  redis.call('ZADD', KEYS[2], now_ms, name)
end
if tokens > max_tokens then
  return {TOO_MANY_TOKENS, 0, created, unpack(removed)}
end

local stored, next_free = bucket_refilled(redis.call('HGET', KEYS[1], name), size, fill_rate, now)
local wait = next_free - now
if wait > max_wait then
  return {TIMEOUT, 0, created, unpack(removed)}
end
local spend = math.min(tokens, stored)
local missing = tokens - spend
if missing > 0 then
  if fill_rate <= 0 then
    return {TIMEOUT, 0, created, unpack(removed)}
  end
  next_free = next_free + missing * 1e6 / fill_rate
end
if next_free - now > max_debt * 1000.0 then
  return {TIMEOUT, 0, created, unpack(removed)}
end
stored = stored - spend
redis.call('HSET', KEYS[1], name, string.format('%.17g %.17g', stored, next_free))
if not dynamic and fill_rate > 0 then
  -- Once full again the bucket is as good as new: let its key go then.
  local full_in = (next_free - now) / 1000 + (size - stored) / fill_rate * 1000
  redis.call('PEXPIRE', KEYS[1], math.ceil(full_in) + 1000)
end
return {OK, math.floor(wait / 1000.0), created, unpack(removed)}
