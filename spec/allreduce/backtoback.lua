-- spec/allreduce/backtoback.lua [calls] — 1000 all-reduces back to back, no
-- host synchronisation in between: sizes (1, 7, 4095, 65537 elements),
-- dtypes and algorithms alternate, some in place, some out of place, some
-- zero-copy (the region is rewritten right after the previous call). Every
-- result is kept and checked exactly at the end (inputs are multiples of 1/4,
-- so every sum is exact in every dtype).
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local A = dofile(dir .. "/common.lua")
local dl = require "distlab"

local calls = tonumber(arg[1] or "1000")
local w, me = A.w, A.me
local sizes = { 1, 7, 4095, 65537 }

-- every call's dtype, size, algorithm and mode, drawn independently from one
-- seeded generator (the same on every rank): Park-Miller, exact in doubles
local state = 20261122
local function draw(k)
  state = state * 16807 % 2147483647
  return state % k + 1
end
local plan = {}
for c = 1, calls do
  plan[c] = { dtype = A.dtypes[draw(3)], n = sizes[draw(#sizes)], algo = A.algos[draw(#A.algos)], mode = draw(5) - 1 }
end

A.report(function()
  local ar = dl.allreduce.get(w)
  -- inputs made up front: the loop below issues only all-reduces (and copies)
  local inputs, results = {}, {}
  for c = 1, calls do inputs[c] = A.exact_input(plan[c].n, plan[c].dtype, c, me) end
  w:barrier()
  for c = 1, calls do
    local x = inputs[c]
    local algo, mode = plan[c].algo, plan[c].mode
    if mode == 0 and (algo == "one_shot" or algo:match("^two_shot")) then
      local z = ar:buffer({ x:numel() }, x.dtype, 16 * (c % 3))
      z:copy_(x)
      if algo == "one_shot" then
        ar:run(z, { algo = algo, out = x })
      else
        ar:run(z, { algo = algo })
        x:copy_(z)
      end
    elseif mode == 1 then
      local out = dl.empty({ x:numel() }, { dtype = x.dtype })
      ar:run(x, { algo = algo, out = out })
      inputs[c] = out
    else
      ar:run(x, { algo = algo })
    end
    results[c] = { algo = algo, mode = mode }
  end
  ar:check()
  for c = 1, calls do
    A.exact_check(inputs[c], c, string.format("call %d (%s, mode %d, %s, n=%d)", c, results[c].algo,
      results[c].mode, inputs[c].dtype, inputs[c]:numel()))
  end
  w:barrier()
  print(string.format("backtoback ok: rank %d of %d on %s, %d calls", me, A.N, w.device, calls))
end)
