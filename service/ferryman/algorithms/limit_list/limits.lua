-- A node's limits decided together, atomically: the Redis twin of model.decide_all. The
-- kinds' steps (STEPS[kind], each from its own package's item.lua) come before this text.
--
-- KEYS[1]   the node's hash: one field per limit, its state as numbers (%.17g, spaces)
-- ARGV[1]   now in microseconds, or "" to use the Redis server's clock (TIME)
-- ARGV[2]   cost (0 only looks and writes nothing)
-- ARGV[3]   how many limits; then for each: field, kind, n, and its n numbers
-- returns   {fits (1/0), then per limit: fits, remaining, reset_us (text)}
local now = ferryman_now(ARGV[1], 'us')
local cost = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local fields, kinds, argsets = {}, {}, {}
local pos = 4
for i = 1, n do
  fields[i], kinds[i] = ARGV[pos], ARGV[pos + 1]
  local count = tonumber(ARGV[pos + 2])
  local args = {}
  for j = 1, count do
    args[j] = tonumber(ARGV[pos + 2 + j])
  end
  argsets[i] = args
  pos = pos + 3 + count
end
local saved = redis.call('HMGET', KEYS[1], unpack(fields))
local all, keep = 1, 0
local out, states = {0}, {}
for i = 1, n do
  local state = nil
  if saved[i] then
    state = {}
    for v in string.gmatch(saved[i], '%S+') do
      state[#state + 1] = tonumber(v)
    end
  end
  local fits, kept, remaining, reset, keep_us = STEPS[kinds[i]](state, cost, now, argsets[i])
  if fits == 0 then
    all = 0
  end
  states[i] = kept
  keep = math.max(keep, keep_us)
  out[#out + 1] = fits
  out[#out + 1] = remaining
  out[#out + 1] = string.format('%.17g', reset)
end
out[1] = all
if all == 1 and cost > 0 then
  local hset = {}
  for i = 1, n do
    local text = {}
    for j, v in ipairs(states[i]) do
      text[j] = string.format('%.17g', v)
    end
    hset[#hset + 1] = fields[i]
    hset[#hset + 1] = table.concat(text, ' ')
  end
  redis.call('HSET', KEYS[1], unpack(hset))
  redis.call('PEXPIRE', KEYS[1], math.ceil(keep / 1000) + 1000)
end
return out
