-- Fixed-window counters for one ShouldRateLimit call, applied atomically.
--
-- KEYS[i]        counter key i (the reference's <prefix><domain>_<k>_<v>_..._<windowstart>)
-- ARGV[1]        "1": if any counter with positive hits would end above its limit, apply
--                only those counters (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT); else "0"
-- ARGV[3i-1]     hits for counter i (negative: give hits back, never below zero)
-- ARGV[3i]       limit for counter i
-- ARGV[3i+1]     TTL in seconds for counter i (window length plus jitter), set on a new
--                counter and on any changed counter that has no expiry
-- returns        {after_1, applied_1, after_2, applied_2, ...}: each counter's value after
--                the call and how many hits were stored for it
local n = #KEYS
local hits, limits, ttls = {}, {}, {}
for i = 1, n do
  hits[i] = tonumber(ARGV[3 * i - 1])
  limits[i] = tonumber(ARGV[3 * i])
  ttls[i] = tonumber(ARGV[3 * i + 1])
end

local values = {}
local function current(key)
  local v = values[key]
  if v == nil then
    v = tonumber(redis.call('GET', key) or '0')
    values[key] = v
  end
  return v
end

local skip = {}
if ARGV[1] == '1' then
  local trial, over, any = {}, {}, false
  for i = 1, n do
    local seen = trial[KEYS[i]]
    if seen == nil then seen = current(KEYS[i]) end
    if hits[i] > 0 and seen + hits[i] > limits[i] then
      over[i] = true
      any = true
    end
    trial[KEYS[i]] = math.max(0, seen + hits[i])
  end
  if any then
    for i = 1, n do
      if not over[i] then skip[i] = true end
    end
  end
end

local out = {}
for i = 1, n do
  local key, h = KEYS[i], hits[i]
  local before, after
  if not skip[i] and h > 0 then
    -- The common case needs no read: INCRBY's answer tells the value before it.
    after = redis.pcall('INCRBY', key, h)
    if type(after) == 'table' then
      if not string.find(tostring(after.err), 'overflow', 1, true) then
        return after  -- any other error (READONLY, ...) fails the call, as redis.call would
      end
      -- The counter would pass 2^63: over the limit, nothing stored.
      after = limits[i] + h
      before = after
    else
      before = after - h
      -- A new counter gets its expiry; so does one found without any (written by hand, or
      -- left by a writer that died between its INCRBY and its EXPIRE): none lives forever.
      if after == h or redis.call('TTL', key) == -1 then
        redis.call('EXPIRE', key, ttls[i])
      end
      values[key] = after
    end
  else
    before = current(key)
    after = before
    if not skip[i] and h < 0 and before > 0 then
      after = math.max(0, before + h)
      redis.call('SET', key, after, 'KEEPTTL')
      if redis.call('TTL', key) == -1 then
        redis.call('EXPIRE', key, ttls[i])
      end
      values[key] = after
    end
  end
  out[2 * i - 1] = after
  out[2 * i] = after - before
end
return out
