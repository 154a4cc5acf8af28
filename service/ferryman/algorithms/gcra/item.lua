-- GCRA as one limit of a rate_limits list: the twin of item.py's GcraStep.step, on
-- gcra_core.lua's functions (which come before this text). state {us, part, den} (nil:
-- none); args {step, den, burst}.
STEPS['gcra'] = function(state, cost, now, args)
  local step, den, burst = args[1], args[2], args[3]
  local saved = nil
  if state then
    saved = string.format('%d %d %d', state[1], state[2], state[3])
  end
  local before = gcra_debt(saved, den, now)
  local allowed, _, after = gcra_fit(before, step, den, burst, cost, 0)
  local shown, kept = before, state or {0, 0, den}
  if allowed then
    shown = after
    if cost > 0 then
      local part = math.fmod(after, den)
      kept = {now + (after - part) / den, part, den}
    end
  end
  local remaining = gcra_div(math.max(0, burst * step - shown), step)
  local full = gcra_ceil_div(shown, den)
  return allowed and 1 or 0, kept, remaining, full, full
end
