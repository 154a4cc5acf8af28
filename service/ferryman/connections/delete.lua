-- An operator's reset of one counter: delete its keys together.
--
-- KEYS     the counter's keys (one hash tag: one Cluster slot)
-- returns  how many of them existed
return redis.call('DEL', unpack(KEYS))
