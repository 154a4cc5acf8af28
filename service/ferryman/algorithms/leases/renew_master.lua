-- Renew the master's term, only if this replica still holds it.
-- KEYS[1]: the mastership key
-- ARGV[1]: this replica's value (its address and a nonce; the key's value while it is master)
-- ARGV[2]: the term in milliseconds
-- Returns 1 when the term was renewed, 0 when the key is gone or another replica holds it.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
