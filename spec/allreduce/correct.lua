-- spec/allreduce/correct.lua [sizes...] — every algorithm, dtype and size
-- against the fp64 sum: in place, with the same bits on every rank;
-- zero-copy (the input in the all-reduce's own region: one_shot out of
-- place, two_shot in place); below 2^20 elements also out of place and a
-- misaligned view (odd element offset); and sizes above the piece size.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local A = dofile(dir .. "/common.lua")
local dl = require "distlab"

local sizes = {}
for i = 1, #arg do sizes[i] = tonumber(arg[i]) end
if #sizes == 0 then sizes = { 1, 7, 4095, 2 ^ 20 + 3 } end
local w, me, N = A.w, A.me, A.N
local checks = 0

local function in_place(algo, dtype, input, ref, tag)
  local t = input:clone()
  dl.allreduce.run(t, { algo = algo })
  A.expect_near(t, ref, dtype, tag .. " in place")
  -- every rank has the same bits
  local all = dl.empty({ N, t:numel() }, { dtype = dtype })
  w:all_gather(all, t)
  for r = 0, N - 1 do
    if dl.max_abs_diff(all:select(1, r + 1), t) ~= 0 then error(tag .. ": rank " .. r .. " got other bits", 0) end
  end
  checks = checks + 1
end

local function pointer_cases(algo, dtype, input, ref, tag)
  local n = input:numel()
  local x = input:clone()
  local out = dl.empty({ n }, { dtype = dtype })
  dl.allreduce.run(x, { algo = algo, out = out })
  A.expect_near(out, ref, dtype, tag .. " out of place")
  A.expect_near(x, input:to("cpu"):f64(), dtype, tag .. " input untouched")
  -- misaligned view: element 2 of a bigger tensor
  local big = dl.zeros({ n + 1 }, { dtype = dtype })
  local v = big:narrow(1, 2, n)
  v:copy_(input)
  dl.allreduce.run(v, { algo = algo })
  A.expect_near(v, ref, dtype, tag .. " misaligned")
  if big:narrow(1, 1, 1):item() ~= 0 then error(tag .. " misaligned: wrote before the view", 0) end
  checks = checks + 2
end

local function zero_copy(ar, algo, dtype, input, ref, tag)
  local z = ar:buffer({ input:numel() }, dtype, 32)
  z:copy_(input)
  if algo == "one_shot" then
    local zo = dl.empty({ input:numel() }, { dtype = dtype })
    ar:run(z, { algo = algo, out = zo })
    A.expect_near(zo, ref, dtype, tag .. " zero copy")
  else
    ar:run(z, { algo = algo })
    A.expect_near(z, ref, dtype, tag .. " zero copy in place")
  end
  checks = checks + 1
end

A.report(function()
  local ar = dl.allreduce.get(w)
  local seed = 0
  for _, dtype in ipairs(A.dtypes) do
    for _, n in ipairs(sizes) do
      seed = seed + 1
      local ref = A.reference(n, dtype, seed)
      local input = A.input(n, dtype, seed, me)
      for _, algo in ipairs(A.algos) do
        local tag = string.format("%s %s n=%d", algo, dtype, n)
        in_place(algo, dtype, input, ref, tag)
        if n < 2 ^ 20 then pointer_cases(algo, dtype, input, ref, tag) end
        if (algo == "one_shot" or algo:match("^two_shot")) and n * 4 + 32 <= ar.max_bytes then
          zero_copy(ar, algo, dtype, input, ref, tag)
        end
      end
    end
  end
  -- pieces: a small all-reduce object, a tensor many times its slot
  local small = dl.allreduce.new(w, { max_bytes = 4096 })
  for _, algo in ipairs(A.kernels) do
    seed = seed + 1
    local n = 3 * 1024 + 5
    local t = A.input(n, "f32", seed, me)
    small:run(t, { algo = algo })
    A.expect_near(t, A.reference(n, "f32", seed), "f32", algo .. " in pieces of 4 KiB")
    checks = checks + 1
  end
  small:check()
  ar:check()
  w:barrier()
  print(string.format("correct ok: rank %d of %d on %s, %d checks", me, N, w.device, checks))
end)
