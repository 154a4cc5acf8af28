-- One burst-tier decision for one tenant of one node, applied atomically (see model.py beside
-- this file for the semantics; this script is its Redis twin and must decide identically).
--
-- KEYS[1]        tenant state hash: e<i> = tier i entry time ("" when inactive),
--                c<i> = hits in tier i's window, sc = tenant hits in the last second
-- KEYS[2]        node-wide list of grants in the last second ("time:count", oldest first)
-- KEYS[3]        node-wide count of the grants in KEYS[2]
-- KEYS[4]        tenant list of grants in the last second ("time:count")
-- KEYS[4+i]      tier i's list of grants in its window ("time:count")
--                (all keys share one hash tag: one Cluster slot per node)
-- ARGV[1]        now in seconds, or "" to use the Redis server's clock (TIME)
-- ARGV[2..3]     copies, min_copies
-- ARGV[4]        n, the number of tiers
-- ARGV[5..6]     hard limit, global limit (per second; -1 = unbounded)
-- ARGV[7]        key TTL in milliseconds (how long idle state may matter)
-- ARGV[8+5(i-1)..] tier i: limit, window, active, cooldown, skippable (1/0)
-- returns        {granted, tier_index, tier_limit, tier_hits, tier_window, burst,
--                 hard_limited, global_limited, tenant_last_second, global_last_second,
--                 retry_after, now}; numbers that may be fractional are returned as strings
local now = ferryman_now(ARGV[1], 's')
local copies, min_copies, n = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local hard, glimit, ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local K_STATE, K_GLOBAL, K_GTOTAL, K_SECOND = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local limit, window, active, cooldown, skip = {}, {}, {}, {}, {}
for i = 1, n do
  local b = 8 + (i - 1) * 5
  limit[i] = tonumber(ARGV[b])
  window[i] = tonumber(ARGV[b + 1])
  active[i] = tonumber(ARGV[b + 2])
  cooldown[i] = tonumber(ARGV[b + 3])
  skip[i] = ARGV[b + 4] == '1'
end

local INACTIVE, ACTIVE, COOLDOWN = 0, 1, 2
local function phase(i, entered, t)
  if entered == nil then return INACTIVE end
  local elapsed = t - entered
  if elapsed < active[i] then return ACTIVE end
  if elapsed < active[i] + cooldown[i] then return COOLDOWN end
  return INACTIVE
end

local function parse(entry)
  local sep = string.find(entry, ':', 1, true)
  return tonumber(string.sub(entry, 1, sep - 1)), tonumber(string.sub(entry, sep + 1))
end

-- Drop entries at or before cutoff from the head of a list; returns the new total.
local function prune(key, total, cutoff)
  while true do
    local head = redis.call('LINDEX', key, 0)
    if not head then return 0 end
    local t, c = parse(head)
    if t > cutoff then return total end
    redis.call('LPOP', key)
    total = total - c
  end
end

-- The total that would remain at time cutoff, without changing the list.
local function remaining_at(key, total, cutoff)
  local idx = 0
  while true do
    local entry = redis.call('LINDEX', key, idx)
    if not entry then return 0 end
    local t, c = parse(entry)
    if t > cutoff then return total end
    total = total - c
    idx = idx + 1
  end
end

local function oldest(key)
  local head = redis.call('LINDEX', key, 0)
  if not head then return nil end
  local t = parse(head)
  return t
end

-- Read and refresh the state to now.
local fields = {'sc'}
for i = 1, n do
  fields[#fields + 1] = 'e' .. i
  fields[#fields + 1] = 'c' .. i
end
local raw = redis.call('HMGET', K_STATE, unpack(fields))
local sc = tonumber(raw[1]) or 0
local entered, count = {}, {}
for i = 1, n do
  local e = raw[2 * i]
  if e and e ~= '' then entered[i] = tonumber(e) end
  count[i] = tonumber(raw[2 * i + 1]) or 0
  local key = KEYS[4 + i]
  if phase(i, entered[i], now) == INACTIVE then
    if entered[i] ~= nil or count[i] ~= 0 then redis.call('DEL', key) end
    entered[i] = nil
    count[i] = 0
  else
    count[i] = prune(key, count[i], now - window[i])
  end
end
sc = prune(K_SECOND, sc, now - 1)
local gt = prune(K_GLOBAL, tonumber(redis.call('GET', K_GTOTAL) or '0'), now - 1)

local function current(ent, t)
  for i = n, 1, -1 do
    if phase(i, ent[i], t) == ACTIVE then return i end
  end
  return 0
end

-- Grant up to want hits at time t on the given state; pure.
local function simulate(ent, cnt, second_total, global_total, t, want)
  local cap_hard = want
  if hard >= 0 then cap_hard = hard - second_total end
  local cap_glob = want
  if glimit >= 0 then cap_glob = glimit - global_total end
  local cap = math.max(0, math.min(want, cap_hard, cap_glob))
  local hard_lim = cap_hard < want and cap_hard <= cap_glob
  local glob_lim = cap_glob < want and cap_glob <= cap_hard
  local cur = current(ent, t)
  local used, entered_now = {}, {}
  local burst = false
  local need = cap
  while need > 0 do
    local placed = false
    if cur >= 1 then
      local room = limit[cur] - cnt[cur] - (used[cur] or 0)
      if room > 0 then
        local take = math.min(room, need)
        used[cur] = (used[cur] or 0) + take
        need = need - take
        placed = true
      end
    end
    if not placed then
      local target = 0
      local j = cur + 1
      while j <= n do
        if phase(j, ent[j], t) == COOLDOWN or limit[j] <= 0 then
          if skip[j] then
            j = j + 1
          else
            break
          end
        else
          target = j
          break
        end
      end
      if target == 0 then break end
      entered_now[#entered_now + 1] = target
      burst = true
      cur = target
      -- A tier entered now starts with an empty window.
      ent = {unpack(ent, 1, n)}
      ent[target] = t
      cnt = {unpack(cnt, 1, n)}
      cnt[target] = 0
    end
  end
  return cap - need, used, entered_now, burst, hard_lim, glob_lim, cur
end

local granted, used, entered_now, burst, hard_lim, glob_lim, cur =
  simulate(entered, count, sc, gt, now, copies)
local ok = granted >= min_copies
if not ok then
  granted = 0
  burst = false
  cur = current(entered, now)
end

if ok and granted > 0 then
  for _, j in ipairs(entered_now) do
    entered[j] = now
    count[j] = 0
    redis.call('DEL', KEYS[4 + j])
  end
  local stamp = string.format('%.17g', now)
  for j, c in pairs(used) do
    redis.call('RPUSH', KEYS[4 + j], stamp .. ':' .. c)
    count[j] = count[j] + c
  end
  redis.call('RPUSH', K_SECOND, stamp .. ':' .. granted)
  redis.call('RPUSH', K_GLOBAL, stamp .. ':' .. granted)
  sc = sc + granted
  gt = gt + granted
end

-- Persist the refreshed (and possibly granted) state; idle state expires by itself.
local hset = {'sc', sc}
for i = 1, n do
  hset[#hset + 1] = 'e' .. i
  hset[#hset + 1] = entered[i] and string.format('%.17g', entered[i]) or ''
  hset[#hset + 1] = 'c' .. i
  hset[#hset + 1] = count[i]
end
redis.call('HSET', K_STATE, unpack(hset))
redis.call('SET', K_GTOTAL, gt, 'PX', 2000)
redis.call('PEXPIRE', K_GLOBAL, 2000)
redis.call('PEXPIRE', K_STATE, ttl)
redis.call('PEXPIRE', K_SECOND, ttl)
for i = 1, n do
  if entered[i] ~= nil then redis.call('PEXPIRE', KEYS[4 + i], ttl) end
end

local tier_limit, tier_hits, tier_window = 0, 0, 'inf'
if cur >= 1 then
  tier_limit = limit[cur]
  tier_hits = count[cur]
  tier_window = string.format('%.17g', window[cur])
end

local retry = '0'
if (not ok) or granted < copies or copies == 0 then
  retry = 'inf'
  local times = {}
  for i = 1, n do
    if entered[i] ~= nil then
      times[#times + 1] = entered[i] + active[i]
      times[#times + 1] = entered[i] + active[i] + cooldown[i]
    end
    local o = oldest(KEYS[4 + i])
    if o then times[#times + 1] = o + window[i] end
  end
  local o2 = oldest(K_SECOND)
  if o2 then times[#times + 1] = o2 + 1 end
  local o3 = oldest(K_GLOBAL)
  if o3 then times[#times + 1] = o3 + 1 end
  table.sort(times)
  local last = nil
  for _, when in ipairs(times) do
    if when > now and when ~= last then
      last = when
      local ent, cnt = {}, {}
      for i = 1, n do
        if phase(i, entered[i], when) == INACTIVE then
          ent[i] = nil
          cnt[i] = 0
        else
          ent[i] = entered[i]
          cnt[i] = remaining_at(KEYS[4 + i], count[i], when - window[i])
        end
      end
      local s2 = remaining_at(K_SECOND, sc, when - 1)
      local g2 = remaining_at(K_GLOBAL, gt, when - 1)
      if simulate(ent, cnt, s2, g2, when, 1) >= 1 then
        retry = string.format('%.17g', when - now)
        break
      end
    end
  end
end

return {
  granted, cur, tier_limit, tier_hits, tier_window, burst and 1 or 0,
  (hard_lim and granted < copies) and 1 or 0, (glob_lim and granted < copies) and 1 or 0,
  sc, gt, retry, string.format('%.17g', now)
}
