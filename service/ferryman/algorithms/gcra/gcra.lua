-- One GCRA decision, applied atomically (gcra_core.lua is prepended).
--
-- KEYS[1]   the tenant's TAT: "<us> <part> <den>", expiring when the bucket is full again
-- ARGV[1]   now in microseconds, or "" to use the Redis server's clock (TIME)
-- ARGV[2]   step: the emission interval is step / den microseconds
-- ARGV[3]   den
-- ARGV[4]   burst
-- ARGV[5]   cost (0 only looks, writing nothing)
-- ARGV[6]   the longest wait the caller accepts, µs (0: none)
-- returns   {allowed (1/0), wait_us, burst left, µs until full, µs until it would fit
--           (-1: never)}
local now = ferryman_now(ARGV[1], 'us')
local step, den, burst = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cost, max_wait = tonumber(ARGV[5]), tonumber(ARGV[6])
return gcra_take(KEYS[1], now, step, den, burst, cost, max_wait)
