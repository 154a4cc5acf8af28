-- A fixed window as one limit of a rate_limits list: the twin of item.py's WindowStep.step.
-- state {start_us, count} (nil: none); args {limit, start_us, end_us}.
STEPS['fixed_window'] = function(state, cost, now, args)
  local limit, start, finish = args[1], args[2], args[3]
  local count = 0
  if state and state[1] == start then
    count = state[2]
  end
  local fits = 0
  if count + cost <= limit then
    fits = 1
    count = count + cost
  end
  local reset = math.ceil((finish - now) / 1e6) * 1e6
  return fits, {start, count}, math.max(0, limit - count), reset, finish - now
end
