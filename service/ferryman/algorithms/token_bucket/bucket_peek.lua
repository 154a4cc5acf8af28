-- One quota bucket's saved state, read without changing anything (for the console).
--
-- KEYS[1]   buckets' state hash (as token_bucket.lua)
-- ARGV[1]   now in microseconds, or "" to use the Redis server's clock (TIME)
-- ARGV[2]   bucket name
-- returns   {now_us, state}: state "<stored> <next_free_us>", or "" when the bucket has none
local now = ferryman_now(ARGV[1], 'us')
local saved = redis.call('HGET', KEYS[1], ARGV[2])
return {string.format('%.17g', now), saved or ''}
