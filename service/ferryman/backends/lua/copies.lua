-- Held copies on one copy-limited node: reserve, release, transfer, seize, renew.
-- Every call is atomic and first clears what dead servers and unclaimed transfers hold.
--
-- KEYS[1]   counts hash: "d:<tenant>", "g:<group>", "all" -> copies held
-- KEYS[2]   leases hash: server id -> lease expiry (ms, Redis clock)
-- KEYS[3]   this server's contributions hash (same fields as KEYS[1])
-- KEYS[4]   transfers sorted set: transfer id -> expiry (ms)
-- KEYS[5]   the transfer record hash for transfer/seize (else unused)
-- KEYS[6]   sorted set of servers whose lease lapsed here: id -> when (kept a day), so a
--           server that comes back after its holds were freed learns it at once
--           All keys share one hash tag <tag>; dead servers' contribution hashes
--           (<tag>:c:<id>) and expired transfer records (<tag>:x:<id>) are found from
--           KEYS[2] and KEYS[4] and live in the same slot.
-- ARGV[1]   operation: reserve | release | transfer | seize | renew
-- ARGV[2]   this server's id;  ARGV[3] lease length (ms);  ARGV[4] key tag <tag>
-- ARGV[5]   now in ms, or "" for the Redis clock
-- reserve:  ARGV[6] tenant, [7] copies, [8] min_copies, [9] tenant limit (-1 none),
--           [10] global limit (-1 none), [11] group count g, then g pairs (name, limit)
--           -> {"ok", granted, tenant_held, global_held, group_held...}
-- release:  ARGV[6] tenant, [7] copies, [8] g, then g group names -> {"ok"} or {"over", held}
-- transfer: like release, plus ARGV[9+g] ttl (ms) and ARGV[10+g] transfer id -> {"ok", id}
-- seize:    ARGV[6] transfer id -> {"ok", tenant, copies, group names...} or {"missing"}
-- renew:    -> {"ok"}
-- Any call returns {"lease_lost"} when this server's lease had lapsed: its holds are gone.
local K_COUNTS, K_LEASES, K_MINE, K_XQ, K_XREC = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_DEAD = KEYS[6]
local op, me, lease_ms, tag = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now
if ARGV[5] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[5])
end

local function add(field, delta)
  local v = redis.call('HINCRBY', K_COUNTS, field, delta)
  if v <= 0 then redis.call('HDEL', K_COUNTS, field) end
end

local function forget(contrib_key)
  local flat = redis.call('HGETALL', contrib_key)
  for i = 1, #flat, 2 do
    add(flat[i], -tonumber(flat[i + 1]))
  end
  redis.call('DEL', contrib_key)
end

-- Servers whose lease lapsed: take back everything they held here.
local lost = false
local leases = redis.call('HGETALL', K_LEASES)
for i = 1, #leases, 2 do
  local id, expiry = leases[i], tonumber(leases[i + 1])
  if expiry < now then
    forget(tag .. ':c:' .. id)
    redis.call('HDEL', K_LEASES, id)
    redis.call('ZADD', K_DEAD, now, id)
    if id == me then lost = true end
  end
end
redis.call('ZREMRANGEBYSCORE', K_DEAD, '-inf', now - 86400000)
if lost or redis.call('ZSCORE', K_DEAD, me) ~= false then return {'lease_lost'} end

-- Transfers nobody seized in time go back to the pools.
local expired = redis.call('ZRANGEBYSCORE', K_XQ, '-inf', '(' .. now)
for _, id in ipairs(expired) do
  local rec = tag .. ':x:' .. id
  local copies = tonumber(redis.call('HGET', rec, 'copies') or '0')
  if copies > 0 then
    add('d:' .. redis.call('HGET', rec, 'tenant'), -copies)
    add('all', -copies)
    local groups = redis.call('HGET', rec, 'groups') or ''
    for name in string.gmatch(groups, '[^\n]+') do add('g:' .. name, -copies) end
  end
  redis.call('DEL', rec)
  redis.call('ZREM', K_XQ, id)
end

redis.call('HSET', K_LEASES, me, now + lease_ms)
local ttl = lease_ms * 10

local function mine(field, delta)
  local v = redis.call('HINCRBY', K_MINE, field, delta)
  if v <= 0 then redis.call('HDEL', K_MINE, field) end
end

local function held(field)
  return tonumber(redis.call('HGET', K_COUNTS, field) or '0')
end

if op == 'renew' then
  return {'ok'}
end

if op == 'reserve' then
  local tenant, copies, min_copies = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
  local tlimit, glimit, g = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
  local room = copies
  local th = held('d:' .. tenant)
  if tlimit >= 0 then room = math.min(room, tlimit - th) end
  local names = {}
  for i = 1, g do
    local name, limit = ARGV[10 + 2 * i], tonumber(ARGV[11 + 2 * i])
    names[i] = name
    room = math.min(room, limit - held('g:' .. name))
  end
  local all = held('all')
  if glimit >= 0 then room = math.min(room, glimit - all) end
  local granted = 0
  if room >= math.max(min_copies, 1) then granted = room end
  if granted > 0 then
    add('d:' .. tenant, granted)
    mine('d:' .. tenant, granted)
    add('all', granted)
    mine('all', granted)
    for i = 1, g do
      add('g:' .. names[i], granted)
      mine('g:' .. names[i], granted)
    end
  end
  local out = {'ok', granted, held('d:' .. tenant), held('all')}
  for i = 1, g do out[#out + 1] = held('g:' .. names[i]) end
  return out
end

if op == 'release' or op == 'transfer' then
  local tenant, copies, g = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
  local fields = {'d:' .. tenant, 'all'}
  local names = {}
  for i = 1, g do
    names[i] = ARGV[8 + i]
    fields[#fields + 1] = 'g:' .. names[i]
  end
  for _, f in ipairs(fields) do
    local have = tonumber(redis.call('HGET', K_MINE, f) or '0')
    if have < copies then return {'over', have} end
  end
  for _, f in ipairs(fields) do mine(f, -copies) end
  if op == 'release' then
    for _, f in ipairs(fields) do add(f, -copies) end
    return {'ok'}
  end
  local xttl, id = tonumber(ARGV[9 + g]), ARGV[10 + g]
  redis.call('HSET', K_XREC, 'tenant', tenant, 'copies', copies, 'groups', table.concat(names, '\n'))
  redis.call('PEXPIRE', K_XREC, xttl + ttl)
  redis.call('ZADD', K_XQ, now + xttl, id)
  return {'ok', id}
end

if op == 'seize' then
  local id = ARGV[6]
  if redis.call('ZSCORE', K_XQ, id) == false then return {'missing'} end
  local tenant = redis.call('HGET', K_XREC, 'tenant')
  local copies = tonumber(redis.call('HGET', K_XREC, 'copies') or '0')
  local groups = redis.call('HGET', K_XREC, 'groups') or ''
  redis.call('DEL', K_XREC)
  redis.call('ZREM', K_XQ, id)
  mine('d:' .. tenant, copies)
  mine('all', copies)
  local out = {'ok', tenant, copies}
  for name in string.gmatch(groups, '[^\n]+') do
    mine('g:' .. name, copies)
    out[#out + 1] = name
  end
  return out
end

return redis.error_reply('unknown operation ' .. tostring(op))
