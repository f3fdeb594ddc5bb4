-- spec/allreduce/graph.lua — all-reduces captured in a graph (dl.graph.capture:
-- a CUDA graph on cuda, a recorded Lua function on cpu) and replayed, with
-- eager all-reduces of other sizes and algorithms in between (they move the
-- device-side counters and the staging half a replay finds): every replay's
-- results are exact, with fresh inputs before every replay. Also: an odd number of calls per graph, so consecutive
-- replays start on different staging halves.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local A = dofile(dir .. "/common.lua")
local dl = require "distlab"

local w, me = A.w, A.me
local replays = tonumber(arg[1] or "20")
local verbose = os.getenv("SPEC_VERBOSE")
local function say(...) if verbose then io.stdout:write(string.format(...) .. "\n"); io.stdout:flush() end end
local algos = A.algos -- SPEC_ALGOS=a,b narrows them (for bisecting on a GPU)
if os.getenv("SPEC_ALGOS") then
  algos = {}
  for a in os.getenv("SPEC_ALGOS"):gmatch("[^,]+") do algos[#algos + 1] = a end
end

A.report(function()
  local ar = dl.allreduce.get(w)
  local cases = {}
  local k = 0
  for _, algo in ipairs(algos) do
    for _, n in ipairs { 7, 4095, 65537 } do
      k = k + 1
      local dtype = A.dtypes[k % 3 + 1]
      local src = A.exact_input(n, dtype, k, me)
      cases[#cases + 1] = { algo = algo, n = n, call = k, k = k, src = src, x = dl.empty({ n }, { dtype = dtype }),
        out = dl.empty({ n }, { dtype = dtype }), dtype = dtype }
    end
  end
  -- warm up every algorithm eagerly (NCCL sets up its channels on first use)
  for _, c in ipairs(cases) do
    c.x:copy_(c.src)
    ar:run(c.x, { algo = c.algo })
  end
  ar:check()
  say("rank %d: warm-up done", me)
  local g = dl.graph.capture(function()
    for _, c in ipairs(cases) do
      c.x:copy_(c.src)
      ar:run(c.x, { algo = c.algo }) -- in place
      ar:run(c.src, { algo = c.algo, out = c.out }) -- out of place: src stays
    end
    if not os.getenv("SPEC_NO_ODD") then
      local last = cases[1]
      last.x:copy_(last.src)
      ar:run(last.x, { algo = "one_shot" }) -- an odd count of kernel calls
    end
  end)
  say("rank %d: captured %d nodes", me, g:nodes())
  local junk = A.exact_input(1000, "f32", 999, me)
  for r = 1, replays do
    -- fresh data for every replay, written into the tensors the graph reads (the same
    -- memory): a replay that reused a stale staging copy or result would not match
    for _, c in ipairs(cases) do
      c.call = c.k + 1000 * r -- 1000 * 7 is not a multiple of 17: the values move
      c.src:copy_(A.exact_input(c.n, c.dtype, c.call, me))
    end
    g:replay()
    ar:check()
    say("rank %d: replay %d done", me, r)
    for _, c in ipairs(cases) do
      A.exact_check(c.x, c.call, string.format("replay %d: %s n=%d in place", r, c.algo, c.n))
      A.exact_check(c.out, c.call, string.format("replay %d: %s n=%d out of place", r, c.algo, c.n))
    end
    -- eager calls in between: other sizes, other algorithms, r of them
    for i = 1, r % 3 do ar:run(junk:clone(), { algo = A.kernels[(r + i) % 4 + 1] }) end
  end
  ar:check()
  say("rank %d: checked; barrier", me)
  w:barrier()
  say("rank %d: barrier done", me)
  print(string.format("graph ok: rank %d of %d on %s, %d replays of %d nodes", me, A.N, w.device, replays, g:nodes()))
end)
