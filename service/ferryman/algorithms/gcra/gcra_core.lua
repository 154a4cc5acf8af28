-- Prepended to the GCRA scripts: one limit's decision as local functions, the Redis twin
-- of model.py (debt, fit, commit, decide) with the same whole numbers. Every sum stays
-- below 2^53, where doubles are exact; math.fmod is exact too, so whole divisions are
-- taken as (a - fmod(a, b)) / b. A script deciding several limits at once can ask
-- gcra_fit of each, then gcra_commit all or none.
--
-- A TAT is kept as the string "<us> <part> <den>": us + part / den microseconds.
local GCRA_DEBT_MAX = 4503599627370496 -- 2^52

local function gcra_div(a, b)
  return (a - math.fmod(a, b)) / b
end

local function gcra_ceil_div(a, b)
  local r = math.fmod(a, b)
  local q = (a - r) / b
  if r > 0 then
    q = q + 1
  end
  return q
end

-- max(TAT, now) - now in 1/den microseconds (0: the bucket is full); a TAT kept under
-- another den (the limit changed) is rounded up to its next microsecond.
local function gcra_debt(saved, den, now)
  if not saved then
    return 0
  end
  local us, part, was = string.match(saved, '^(%d+) (%d+) (%d+)$')
  us, part, was = tonumber(us), tonumber(part), tonumber(was)
  if us == nil or us < now then
    return 0
  end
  if was ~= den and part > 0 then
    us, part = us + 1, 0
  end
  return math.min((us - now) * den + part, GCRA_DEBT_MAX)
end

-- Would cost fit with the debt before it (after a wait of at most max_wait µs)? Returns
-- allowed, the wait (µs, rounded up; 0 when refused) and the debt it would leave. A cost
-- of 0 (a look) always fits.
local function gcra_fit(before, step, den, burst, cost, max_wait)
  if cost <= 0 then
    return true, 0, before
  end
  local after = before + cost * step
  local excess = after - burst * step
  local wait = 0
  if excess > 0 then
    wait = gcra_ceil_div(excess, den)
  end
  local allowed = cost <= burst and wait <= max_wait and after <= GCRA_DEBT_MAX
  if not allowed then
    wait = 0
  end
  return allowed, wait, after
end

-- Keep the TAT a fitting request leaves; the key goes when the bucket is full again.
local function gcra_commit(key, after, den, now)
  local part = math.fmod(after, den)
  local us = now + (after - part) / den
  local full_ms = gcra_ceil_div(gcra_ceil_div(after, den), 1000)
  redis.call('SET', key, string.format('%d %d %d', us, part, den), 'PX', math.max(1, full_ms))
end

-- One limit's whole decision on key (cost 0 only looks and writes nothing). Returns
-- {allowed (1/0), wait_us, burst left, µs until full, µs until it would fit (-1: never)}.
local function gcra_take(key, now, step, den, burst, cost, max_wait)
  local before = gcra_debt(redis.call('GET', key), den, now)
  local allowed, wait, after = gcra_fit(before, step, den, burst, cost, max_wait)
  local shown = before
  if allowed then
    shown = after
    if cost > 0 then
      gcra_commit(key, after, den, now)
    end
  end
  local retry = -1
  if not allowed and cost <= burst then
    retry = gcra_ceil_div(after - burst * step, den)
  end
  local remaining = gcra_div(math.max(0, burst * step - shown), step)
  return {allowed and 1 or 0, wait, remaining, gcra_ceil_div(shown, den), retry}
end
