-- Commit a config version only on the version it was based on (compare and set).
--
-- KEYS[1]  the latest version number
-- KEYS[2]  the history list (entries as JSON, newest first)
-- KEYS[3]  the new version's hash: meta (its entry) and d:<name> (each document)
-- KEYS[4]  the hash of the version that falls out of the history (deleted)
--          (all keys share one hash tag: one Cluster slot)
-- ARGV[1]  the version the write was based on
-- ARGV[2]  the new version's number
-- ARGV[3]  the new version's entry (JSON)
-- ARGV[4]  how many history entries to keep
-- ARGV[5..] document name, text, name, text, ...
-- returns  {1, new number} when written, {0, latest number} when the base is stale
local latest = tonumber(redis.call('GET', KEYS[1]) or '0')
if latest ~= tonumber(ARGV[1]) then
  return {0, latest}
end
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], 'meta', ARGV[3])
for i = 5, #ARGV, 2 do
  redis.call('HSET', KEYS[3], 'd:' .. ARGV[i], ARGV[i + 1])
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[4]) - 1)
if KEYS[4] ~= KEYS[3] then
  redis.call('DEL', KEYS[4])
end
return {1, tonumber(ARGV[2])}
