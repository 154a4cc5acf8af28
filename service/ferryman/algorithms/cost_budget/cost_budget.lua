-- A request's cost budget operations, applied together: the Redis twin of model.apply
-- (the same steps in the same order; every sum stays a whole number below 2^53).
--
-- KEYS[4i-3..4i]  tenant i's keys, one hash tag: its hash (w: window, c: charged,
--                 r: reserved), its open reservations (sorted set, id by expiry in ms),
--                 their estimates and makers (hash, id -> "estimate:owner"; a bare
--                 estimate is anyone's), its settled ids (sorted set, id by the ms they
--                 are forgotten at)
-- ARGV[1]         now in milliseconds, or "" to use the Redis server's clock (TIME)
-- ARGV[2]         "peek": read operation 1's tenant and write nothing; else "apply"
-- ARGV[11i-8..11i+2] operation i: mode (r reserve, s settle, x cancel), request id (""
--                 for none), amount, cap, window key, window start (ms), window end (ms),
--                 reservation time (ms), most open reservations (and settled ids) kept,
--                 who asks ("" for nobody in particular), 1 if it may settle for others
-- returns         peek: {charged, reserved, open}; apply: per operation {admitted,
--                 applied, charged, reserved, open, expired, refund, cost, foreign}
--                 (1/0 for the flags)
local now = ferryman_now(ARGV[1], 'ms')
local peek = ARGV[2] == 'peek'
local n = #KEYS / 4
local ops, tenants, order = {}, {}, {}

for i = 1, n do
  local a = 11 * i - 8
  ops[i] = {
    h = KEYS[4 * i - 3], o = KEYS[4 * i - 2], e = KEYS[4 * i - 1], s = KEYS[4 * i],
    mode = ARGV[a], rid = ARGV[a + 1], amount = tonumber(ARGV[a + 2]),
    cap = tonumber(ARGV[a + 3]), window = ARGV[a + 4], start = tonumber(ARGV[a + 5]),
    finish = tonumber(ARGV[a + 6]), ttl = tonumber(ARGV[a + 7]), most = tonumber(ARGV[a + 8]),
    owner = ARGV[a + 9], delegate = ARGV[a + 10] == '1',
  }
end

-- An open reservation's estimate and maker, from its "estimate:owner" (nil: none open).
local function held(op, rid)
  local v = redis.call('HGET', op.e, rid)
  if not v then return nil, nil end
  local estimate, owner = string.match(v, '^(%d+):?(.*)$')
  return tonumber(estimate), owner
end

-- Whether op's id is open under another identity (an owner "" is anyone's).
local function foreign(op)
  if op.rid == '' then return false end
  local estimate, owner = held(op, op.rid)
  return estimate ~= nil and owner ~= '' and owner ~= op.owner
end

-- Step 1: each tenant at now, in the operation's window; expired reservations charged.
local function bring(op)
  local t = tenants[op.h]
  if t then return t end
  local saved = redis.call('HMGET', op.h, 'w', 'c', 'r')
  t = {charged = 0, reserved = tonumber(saved[3] or '0'), expired = 0, op = op}
  if saved[1] == op.window then t.charged = tonumber(saved[2] or '0') end
  local due = redis.call('ZRANGEBYSCORE', op.o, '-inf', now, 'WITHSCORES')
  for j = 1, #due, 2 do
    local estimate = held(op, due[j]) or 0
    t.reserved = t.reserved - estimate
    if tonumber(due[j + 1]) >= op.start then t.charged = t.charged + estimate end
    t.expired = t.expired + 1
    if not peek then redis.call('HDEL', op.e, due[j]) end
  end
  t.open = redis.call('ZCARD', op.o) - #due / 2
  if not peek then
    if #due > 0 then redis.call('ZREMRANGEBYSCORE', op.o, '-inf', now) end
    redis.call('ZREMRANGEBYSCORE', op.s, '-inf', now)
  end
  tenants[op.h] = t
  order[#order + 1] = op.h
  return t
end

if peek then
  local t = bring(ops[1])
  return {t.charged, t.reserved, t.open}
end
for i = 1, n do bring(ops[i]) end

local function release(op, t)
  local estimate = held(op, op.rid)
  if not estimate then return nil end
  redis.call('ZREM', op.o, op.rid)
  redis.call('HDEL', op.e, op.rid)
  t.reserved = t.reserved - estimate
  t.open = t.open - 1
  return estimate
end

-- Step 2: settlements (an open reservation first, else once per id; another identity's
-- reservation only by a delegate, charged at least its estimate) and cancels.
local done, strangers = {}, {}
for i = 1, n do
  local op = ops[i]
  local t = tenants[op.h]
  if op.mode == 'x' then
    done[i] = {release(op, t) and 1 or 0, 0, 0}
  elseif op.mode == 's' then
    local cost = op.amount
    local open, owner = held(op, op.rid)
    local other = open ~= nil and owner ~= '' and owner ~= op.owner
    if open == nil and redis.call('ZSCORE', op.s, op.rid) then
      done[i] = {0, 0, 0}
    elseif other and not op.delegate then
      strangers[i] = true
      done[i] = {0, 0, 0}
    else
      if other then cost = math.max(cost, open) end
      local estimate = release(op, t)
      local refund = 0
      if estimate and estimate > cost then refund = estimate - cost end
      t.charged = t.charged + cost
      redis.call('ZADD', op.s, now + op.ttl, op.rid)
      if redis.call('ZCARD', op.s) > op.most then redis.call('ZPOPMIN', op.s) end
      done[i] = {1, refund, cost}
    end
  end
end

-- Step 3: reservations, all admitted or none; an id open under another identity is
-- refused, one settled lately is reserved afresh.
local function is_repeat(op)
  if op.rid == '' then return false end
  return redis.call('ZSCORE', op.o, op.rid) and not foreign(op)
end

local admitted, extra, every = {}, {}, true
for i = 1, n do
  local op = ops[i]
  if op.mode == 'r' and foreign(op) then
    strangers[i] = true
    admitted[i] = false
    every = false
  elseif op.mode == 'r' then
    local t = tenants[op.h]
    local again = is_repeat(op)
    local amount = op.amount
    if again then amount = 0 end
    admitted[i] = t.charged + t.reserved + (extra[op.h] or 0) + amount <= op.cap
    if not admitted[i] then every = false end
    if op.rid ~= '' and op.amount > 0 and not again then
      extra[op.h] = (extra[op.h] or 0) + amount
    end
  end
end

for i = 1, n do
  local op = ops[i]
  if op.mode == 'r' then
    local t = tenants[op.h]
    local taken = 0
    if every and op.rid ~= '' and op.amount > 0 and not is_repeat(op) then
      taken = 1
      redis.call('ZADD', op.o, now + op.ttl, op.rid)
      redis.call('HSET', op.e, op.rid, string.format('%d', op.amount) .. ':' .. op.owner)
      t.reserved = t.reserved + op.amount
      t.open = t.open + 1
      while t.open > op.most do
        local oldest = redis.call('ZPOPMIN', op.o)
        local estimate = held(op, oldest[1]) or 0
        redis.call('HDEL', op.e, oldest[1])
        t.reserved = t.reserved - estimate
        t.charged = t.charged + estimate
        t.open = t.open - 1
        t.expired = t.expired + 1
      end
    end
    done[i] = {taken, 0, 0}
  end
end

-- Step 4: each tenant written once, kept while its window or a reservation may matter.
for _, h in ipairs(order) do
  local t = tenants[h]
  local op = t.op
  redis.call('HSET', h, 'w', op.window, 'c', string.format('%d', t.charged),
    'r', string.format('%d', t.reserved))
  local keep = math.max(op.finish - now, op.ttl) + 1000
  for _, key in ipairs({op.h, op.o, op.e, op.s}) do
    redis.call('PEXPIRE', key, keep)
  end
end

local out, reported = {}, {}
for i = 1, n do
  local op = ops[i]
  local t = tenants[op.h]
  local expired = 0
  if not reported[op.h] then
    expired = t.expired
    reported[op.h] = true
  end
  local ok = 1
  if admitted[i] == false then ok = 0 end
  local d = done[i] or {0, 0, 0}
  local stranger = 0
  if strangers[i] then stranger = 1 end
  for _, v in ipairs({ok, d[1], t.charged, t.reserved, t.open, expired, d[2], d[3], stranger}) do
    out[#out + 1] = v
  end
end
return out
