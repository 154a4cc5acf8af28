-- Prepended to the token-bucket scripts: a bucket's saved state "<stored> <next_free_us>"
-- (false or nil: a new bucket, full) refilled at ``fill_rate`` tokens per second up to ``now``
-- (microseconds). Returns stored (at most ``size``) and next_free (the time the debt is
-- paid; ``now`` when there is none), as model.py's refilled() computes them.
local function bucket_refilled(saved, size, fill_rate, now)
  local stored, next_free
  if saved then
    local sep = string.find(saved, ' ', 1, true)
    stored = math.min(tonumber(string.sub(saved, 1, sep - 1)), size)
    next_free = tonumber(string.sub(saved, sep + 1))
  else
    stored, next_free = size, now
  end
  if now > next_free then
    if fill_rate > 0 then
      stored = math.min(size, stored + (now - next_free) * fill_rate / 1e6)
    end
    next_free = now
  end
  return stored, next_free
end
