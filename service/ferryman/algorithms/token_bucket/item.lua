-- A node's token bucket as one limit of a rate_limits list: the twin of item.py's
-- BucketStep.step (model.decide with no wait, the same double arithmetic in the same order),
-- on bucket.lua's bucket_refilled (which comes before this text). state {stored,
-- next_free_us} (nil: a new bucket, full); args {size, fill_rate, max_debt_millis}.
STEPS['token_bucket'] = function(state, cost, now, args)
  local size, fill_rate, max_debt = args[1], args[2], args[3]
  local saved = nil
  if state then
    saved = string.format('%.17g %.17g', state[1], state[2])
  end
  local stored, next_free = bucket_refilled(saved, size, fill_rate, now)
  local fits = 1
  if cost > 0 then
    if next_free - now > 0 then
      fits = 0
    else
      local spend = math.min(cost, stored)
      local missing = cost - spend
      local after = next_free
      if missing > 0 then
        if fill_rate <= 0 then
          fits = 0
        else
          after = next_free + missing * 1e6 / fill_rate
        end
      end
      if fits == 1 and after - now > max_debt * 1000.0 then
        fits = 0
      end
      if fits == 1 then
        stored, next_free = stored - spend, after
      end
    end
  end
  local debt = math.max(0, next_free - now)
  local full = debt + (size - stored) * 1e6 / fill_rate
  return fits, {stored, next_free}, math.max(0, math.floor(stored)), full, full
end
