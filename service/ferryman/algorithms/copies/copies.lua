-- Held copies on one copy-limited node: reserve, release, transfer, seize, renew, trim.
-- Every call is atomic and first clears what dead servers and unclaimed transfers hold.
--
-- KEYS[1]   counts hash: "d:<tenant>", "g:<group>", "all" -> copies held
-- KEYS[2]   leases hash: server id -> lease expiry (ms, Redis clock)
-- KEYS[3]   this server's contributions hash (same fields as KEYS[1])
-- KEYS[4]   transfers sorted set: transfer id -> expiry (ms)
-- KEYS[5]   the transfer record hash for transfer/seize (else unused)
-- KEYS[6]   sorted set of servers whose lease lapsed here: id -> when (kept a day), so a
--           server that comes back after its holds were freed learns it at once
-- KEYS[7]   Envoy holds: sorted set hold id -> expiry (ms)
-- KEYS[8]   Envoy holds: hash hold id -> "tenant\ncopies\ngroup\ngroup..."
-- KEYS[9]   Envoy holds of this call's tenant: list of hold ids, oldest first
--           (Envoy's holds belong to no server: any replica may see the stream end)
-- KEYS[10]  the waiters' queue: sorted set waiter id -> -priority * 1e12 + arrival, so that
--           higher priorities come first and arrival orders one priority
-- KEYS[11]  the waiters: hash waiter id -> JSON [server, channel, tenant, copies, min_copies,
--           tenant limit, global limit, [group names], [group limits]]
-- KEYS[12]  the waiters' deadlines: sorted set waiter id -> when its entry lapses (ms); a
--           waiter granted stays here until it leaves, or its deadline passes
-- KEYS[13]  copies granted to waiters that have not left yet: hash waiter id -> JSON
--           [server, tenant, [group names], copies] (held by that server; a trim keeps them)
-- KEYS[14]  the arrival counter of KEYS[10]
--           All keys share one hash tag <tag>; dead servers' contribution hashes
--           (<tag>:c:<id>) and expired transfer records (<tag>:x:<id>) are found from
--           KEYS[2] and KEYS[4] and live in the same slot.
-- ARGV[1]   operation: reserve | release | transfer | seize | renew | trim
-- ARGV[2]   this server's id;  ARGV[3] lease length (ms);  ARGV[4] key tag <tag>
-- ARGV[5]   now in ms, or "" for the Redis clock
-- reserve:  ARGV[6] tenant, [7] copies, [8] min_copies, [9] tenant limit (-1 none),
--           [10] global limit (-1 none), [11] group count g, then g pairs (name, limit)
--           -> {"ok", granted, tenant_held, global_held, group_held...}
-- release:  ARGV[6] tenant, [7] copies, [8] g, then g group names -> {"ok"} or {"over", held}
-- transfer: like release, plus ARGV[9+g] ttl (ms) and ARGV[10+g] transfer id -> {"ok", id}
-- seize:    ARGV[6] transfer id -> {"ok", tenant, copies, group names...} or {"missing"}
-- renew:    -> {"ok"}
-- trim:     ARGV[6] n, then n pairs (field, copies): what this server's sessions hold; what
--           it holds beyond that (copies no session will release) is freed -> {"ok", freed}
--           reserve goes on with ARGV[12+2g] waiter id ("" for none), [13+2g] priority,
--           [14+2g] the longest it waits (ms), [15+2g] the channel its grant is published
--           on: one that cannot be granted now (a queue is served first) joins the queue
--           -> like the above plus one more element, 1 when it waits in the queue, else 0
-- leave:    ARGV[6] waiter id -> {"ok", copies granted to it before it left (now held by
--           its server), or 0}
-- peek:     ARGV[6] tenant, [7] g, then g group names -> {"ok", tenant_held, global_held,
--           group_held..., waiters queued} (takes nothing, renews no lease)
-- granted:  ARGV[6] n, then n waiter ids -> {"ok", the ids among them granted copies}
--           (what a replica without pub/sub asks now and then)
-- Whatever frees copies serves the queue in order: a waiter that fits is granted (the
-- copies counted as held by its server) and its id published on its channel; one that does
-- not fit keeps its tenant's later waiters waiting, and one that finds the pools it shares
-- with other tenants empty keeps everyone behind it waiting.
-- ereserve: like reserve, plus ARGV[12+2g] hold id and ARGV[13+2g] hold ttl (ms): a hold
--           for Envoy that expires by itself -> like reserve
-- erelease: ARGV[6] tenant, [7] copies -> {"ok", released} (oldest holds first; holds that
--           already expired are not released twice)
-- Any call returns {"lease_lost", 0} when this server's lease had lapsed: its holds are gone.
-- Every other reply ends with one more element: how many transfers this call expired (the
-- ones nobody seized in time), e.g. reserve -> {"ok", granted, ..., expired}.
local K_COUNTS, K_LEASES, K_MINE, K_XQ, K_XREC = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_DEAD = KEYS[6]
local K_EQ, K_EH, K_ET = KEYS[7], KEYS[8], KEYS[9]
local K_Q, K_QW, K_QD, K_QG, K_QS = KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local op, me, lease_ms, tag = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now = ferryman_now(ARGV[5], 'ms')

local function add(field, delta)
  local v = redis.call('HINCRBY', K_COUNTS, field, delta)
  if v <= 0 then redis.call('HDEL', K_COUNTS, field) end
end

-- Take back what a server held here; returns whether it held anything.
local function forget(contrib_key)
  local flat = redis.call('HGETALL', contrib_key)
  for i = 1, #flat, 2 do
    add(flat[i], -tonumber(flat[i + 1]))
  end
  redis.call('DEL', contrib_key)
  return #flat > 0
end
local serving = op ~= 'ereserve' and op ~= 'erelease' and op ~= 'peek'

-- Servers whose lease lapsed: take back everything they held here.
local lost = false
local leases = redis.call('HGETALL', K_LEASES)
for i = 1, #leases, 2 do
  local id, expiry = leases[i], tonumber(leases[i + 1])
  if expiry < now then
    -- A server that held nothing here lost nothing: no need to remember it.
    if forget(tag .. ':c:' .. id) then
      redis.call('ZADD', K_DEAD, now, id)
      if id == me then lost = true end
    end
    redis.call('HDEL', K_LEASES, id)
  end
end
redis.call('ZREMRANGEBYSCORE', K_DEAD, '-inf', now - 86400000)
if serving and (lost or redis.call('ZSCORE', K_DEAD, me) ~= false) then
  return {'lease_lost', 0}
end

-- Transfers nobody seized in time go back to the pools.
local expired = redis.call('ZRANGEBYSCORE', K_XQ, '-inf', '(' .. now)
local n_expired = #expired
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

-- Envoy holds whose ttl passed go back to the pools.
local function drop_envoy_hold(id, count)
  local rec = redis.call('HGET', K_EH, id)
  if not rec then return 0 end
  local parts = {}
  for part in string.gmatch(rec, '[^\n]+') do parts[#parts + 1] = part end
  local tenant, held = parts[1], tonumber(parts[2])
  local n = held
  if count ~= nil and count < held then n = count end
  add('d:' .. tenant, -n)
  add('all', -n)
  for i = 3, #parts do add('g:' .. parts[i], -n) end
  if n == held then
    redis.call('HDEL', K_EH, id)
    redis.call('ZREM', K_EQ, id)
  else
    parts[2] = tostring(held - n)
    redis.call('HSET', K_EH, id, table.concat(parts, '\n'))
  end
  return n
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_EQ, '-inf', '(' .. now)) do
  drop_envoy_hold(id, nil)
end

if serving then redis.call('HSET', K_LEASES, me, now + lease_ms) end
local ttl = lease_ms * 10

local function mine(field, delta)
  local v = redis.call('HINCRBY', K_MINE, field, delta)
  if v <= 0 then redis.call('HDEL', K_MINE, field) end
end

local function held(field)
  return tonumber(redis.call('HGET', K_COUNTS, field) or '0')
end

-- The copies a tenant may have now in [min_copies, copies], or 0.
local function room_for(tenant, copies, min_copies, tlimit, glimit, names, limits)
  local room = copies
  if tlimit >= 0 then room = math.min(room, tlimit - held('d:' .. tenant)) end
  for i = 1, #names do room = math.min(room, limits[i] - held('g:' .. names[i])) end
  if glimit >= 0 then room = math.min(room, glimit - held('all')) end
  if room >= math.max(min_copies, 1) then return room end
  return 0
end

local function grant(server, tenant, names, n)
  local contrib = tag .. ':c:' .. server
  local fields = {'d:' .. tenant, 'all'}
  for i = 1, #names do fields[#fields + 1] = 'g:' .. names[i] end
  for _, f in ipairs(fields) do
    add(f, n)
    local v = redis.call('HINCRBY', contrib, f, n)
    if v <= 0 then redis.call('HDEL', contrib, f) end
  end
end

local function unqueue(id)
  redis.call('ZREM', K_Q, id)
  redis.call('HDEL', K_QW, id)
end

-- Serve the queue in order (see the header); ``quiet`` is a waiter answered by this call.
local function serve(quiet)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_QD, '-inf', '(' .. now)) do
    local raw = redis.call('HGET', K_QW, id)
    unqueue(id)
    redis.call('ZREM', K_QD, id)
    redis.call('HDEL', K_QG, id)
    if raw and id ~= quiet then redis.call('PUBLISH', cjson.decode(raw)[2], id) end
  end
  local blocked = {}
  for _, id in ipairs(redis.call('ZRANGE', K_Q, 0, -1)) do
    local w = cjson.decode(redis.call('HGET', K_QW, id))
    local tenant = w[3]
    if redis.call('HEXISTS', K_LEASES, w[1]) == 0 then
      -- Its server's lease lapsed: the place is lost, no copy is.
      unqueue(id)
      redis.call('ZREM', K_QD, id)
      if id ~= quiet then redis.call('PUBLISH', w[2], id) end
    elseif not blocked[tenant] then
      local n = room_for(tenant, w[4], w[5], w[6], w[7], w[8], w[9])
      if n > 0 then
        grant(w[1], tenant, w[8], n)
        unqueue(id)
        redis.call('HSET', K_QG, id, cjson.encode({w[1], tenant, w[8], n}))
        if id ~= quiet then redis.call('PUBLISH', w[2], id) end
      else
        if w[7] >= 0 and held('all') >= w[7] then return end
        for i = 1, #w[8] do
          if held('g:' .. w[8][i]) >= w[9][i] then return end
        end
        blocked[tenant] = true
      end
    end
  end
end

local function leave(id)
  unqueue(id)
  redis.call('ZREM', K_QD, id)
  local rec = redis.call('HGET', K_QG, id)
  redis.call('HDEL', K_QG, id)
  if not rec then return 0 end
  return cjson.decode(rec)[4]
end

if redis.call('ZCARD', K_QD) > 0 then serve('') end

-- The operation itself; nil for an unknown one.
local function dispatch()
  if op == 'renew' then
    return {'ok'}
  end

  if op == 'erelease' then
    local want = tonumber(ARGV[7])
    local released = 0
    while released < want do
      local id = redis.call('LPOP', K_ET)
      if not id then break end
      if redis.call('HEXISTS', K_EH, id) == 1 then
        local n = drop_envoy_hold(id, want - released)
        released = released + n
        if redis.call('HEXISTS', K_EH, id) == 1 then redis.call('LPUSH', K_ET, id) end
      end
    end
    return {'ok', released}
  end

  if op == 'reserve' or op == 'ereserve' then
    local tenant, copies, min_copies = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
    local tlimit, glimit, g = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
    local names, limits = {}, {}
    for i = 1, g do
      names[i], limits[i] = ARGV[10 + 2 * i], tonumber(ARGV[11 + 2 * i])
    end
    local granted, queued = 0, 0
    if op == 'reserve' then
      local wid, priority = ARGV[12 + 2 * g], tonumber(ARGV[13 + 2 * g])
      local max_ms, channel = tonumber(ARGV[14 + 2 * g]), ARGV[15 + 2 * g]
      if redis.call('ZCARD', K_Q) == 0 then
        granted = room_for(tenant, copies, min_copies, tlimit, glimit, names, limits)
        if granted > 0 then grant(me, tenant, names, granted) end
      end
      if granted == 0 and (redis.call('ZCARD', K_Q) > 0 or max_ms > 0) then
        -- Join the queue at the back of this priority and see what is served.
        if wid == '' then wid = '-' end
        local seq = redis.call('INCR', K_QS)
        redis.call('ZADD', K_Q, string.format('%.0f', -priority * 1e12 + seq), wid)
        redis.call('HSET', K_QW, wid, cjson.encode(
          {me, channel, tenant, copies, min_copies, tlimit, glimit, names, limits}))
        redis.call('ZADD', K_QD, now + math.max(max_ms, 0), wid)
        serve(wid)
        if redis.call('HEXISTS', K_QG, wid) == 1 or max_ms <= 0 then
          granted = leave(wid)
        else
          queued = 1
        end
      end
    else
      granted = room_for(tenant, copies, min_copies, tlimit, glimit, names, limits)
    end
    if granted > 0 and op == 'ereserve' then
      local id, hold_ttl = ARGV[12 + 2 * g], tonumber(ARGV[13 + 2 * g])
      add('d:' .. tenant, granted)
      add('all', granted)
      for i = 1, g do add('g:' .. names[i], granted) end
      local rec = {tenant, tostring(granted)}
      for i = 1, g do rec[#rec + 1] = names[i] end
      redis.call('HSET', K_EH, id, table.concat(rec, '\n'))
      redis.call('ZADD', K_EQ, now + hold_ttl, id)
      -- Forget ids at the head of the tenant's list whose holds are gone, then queue this one.
      while true do
        local head = redis.call('LINDEX', K_ET, 0)
        if not head or redis.call('HEXISTS', K_EH, head) == 1 then break end
        redis.call('LPOP', K_ET)
      end
      redis.call('RPUSH', K_ET, id)
    end
    local out = {'ok', granted, held('d:' .. tenant), held('all')}
    for i = 1, g do out[#out + 1] = held('g:' .. names[i]) end
    out[#out + 1] = queued
    return out
  end

  if op == 'peek' then
    local tenant, g = ARGV[6], tonumber(ARGV[7])
    local out = {'ok', held('d:' .. tenant), held('all')}
    for i = 1, g do out[#out + 1] = held('g:' .. ARGV[7 + i]) end
    out[#out + 1] = redis.call('ZCARD', K_Q)
    return out
  end

  if op == 'leave' then
    return {'ok', leave(ARGV[6])}
  end

  if op == 'granted' then
    local out = {'ok'}
    for i = 1, tonumber(ARGV[6]) do
      if redis.call('HEXISTS', K_QG, ARGV[6 + i]) == 1 then out[#out + 1] = ARGV[6 + i] end
    end
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

  if op == 'trim' then
    local keep = {}
    for i = 1, tonumber(ARGV[6]) do keep[ARGV[5 + 2 * i]] = tonumber(ARGV[6 + 2 * i]) end
    -- Granted to this server's waiters and not collected yet: theirs, not stranded.
    local grants = redis.call('HVALS', K_QG)
    for _, raw in ipairs(grants) do
      local g = cjson.decode(raw)
      if g[1] == me then
        local fields = {'d:' .. g[2], 'all'}
        for i = 1, #g[3] do fields[#fields + 1] = 'g:' .. g[3][i] end
        for _, f in ipairs(fields) do keep[f] = (keep[f] or 0) + g[4] end
      end
    end
    local flat = redis.call('HGETALL', K_MINE)
    local freed = 0
    for i = 1, #flat, 2 do
      local f, n = flat[i], tonumber(flat[i + 1])
      local surplus = n - math.min(n, keep[f] or 0)
      if surplus > 0 then
        mine(f, -surplus)
        add(f, -surplus)
        if f == 'all' then freed = surplus end
      end
    end
    return {'ok', freed}
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

  return nil
end

local reply = dispatch()
if reply == nil then return redis.error_reply('unknown operation ' .. tostring(op)) end
if (op == 'release' or op == 'trim' or op == 'erelease' or op == 'leave')
    and redis.call('ZCARD', K_QD) > 0 then
  serve('')
end
reply[#reply + 1] = n_expired
return reply
