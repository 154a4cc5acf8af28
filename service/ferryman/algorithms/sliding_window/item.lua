-- A sliding window as one limit of a rate_limits list: the twin of item.py's SlidingStep
-- (model.decide's arithmetic, in the same order). state {start_us, previous, current}
-- (nil: none); args {limit, window_us}.
STEPS['sliding_window'] = function(state, cost, now, args)
  local limit, window = args[1], args[2]
  local start = now - now % window
  local previous, current = 0, 0
  if state then
    if state[1] == start then
      previous, current = state[2], state[3]
    elseif state[1] == start - window then
      previous = state[3]
    end
  end
  local weight = (window - (now - start)) / window
  local estimate = previous * weight + current
  local fits = 0
  if estimate + cost <= limit then
    fits = 1
    if cost > 0 then
      current = current + cost
      estimate = estimate + cost
    end
  end
  local left = math.max(0, math.floor(limit - estimate))
  return fits, {start, previous, current}, left, window - (now - start), 2 * window
end
