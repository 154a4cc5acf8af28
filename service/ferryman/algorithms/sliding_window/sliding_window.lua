-- One sliding-window counter decision, applied atomically: the Redis twin of model.decide
-- and MemorySlidingWindows.hit_at (the same double arithmetic in the same order).
--
-- KEYS[1]   the key's hash: start (µs, the current window's), previous, current
-- ARGV[1]   now in microseconds, or "" to use the Redis server's clock (TIME)
-- ARGV[2]   limit
-- ARGV[3]   window, microseconds
-- ARGV[4]   hits (0 only looks)
-- ARGV[5]   "peek": write nothing (the estimate for an operator), else absent
-- returns   {allowed (1/0), estimate (text, %.17g), microseconds left in the window}
local now = ferryman_now(ARGV[1], 'us')
local limit, window, hits = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local start = now - now % window
local previous, current = 0, 0
local saved = redis.call('HMGET', KEYS[1], 'start', 'previous', 'current')
if saved[1] then
  local was = tonumber(saved[1])
  if was == start then
    previous, current = tonumber(saved[2]), tonumber(saved[3])
  elseif was == start - window then
    previous = tonumber(saved[3])
  end
end
local elapsed = now - start
local weight = (window - elapsed) / window
local estimate = previous * weight + current
local allowed = 0
if estimate + hits <= limit then
  allowed = 1
  if hits > 0 then
    current = current + hits
    estimate = estimate + hits
  end
end
if ARGV[5] == 'peek' then
  -- read only
elseif previous > 0 or current > 0 then
  redis.call('HSET', KEYS[1], 'start', string.format('%d', start),
    'previous', string.format('%d', previous), 'current', string.format('%d', current))
  -- Counts matter until the end of the next window.
  redis.call('PEXPIRE', KEYS[1], math.ceil((2 * window - elapsed) / 1000) + 1000)
else
  redis.call('DEL', KEYS[1])
end
return {allowed, string.format('%.17g', estimate), window - elapsed}
