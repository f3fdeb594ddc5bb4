-- spec/allreduce/common.lua — what the all-reduce rank scripts share: the
-- world, inputs every rank can recompute for every other rank, the fp64
-- reference, tolerances per dtype, and failing with a line the spec reads.
local ffi = require "ffi"
local dl = require "distlab"

local A = {}

A.timeout = tonumber(os.getenv("SPEC_TIMEOUT") or "20")
A.w = dl.comm.world { timeout = A.timeout }
A.N, A.me = A.w.size, A.w.rank
-- every algorithm the library names, and "auto"; the kernels: all but nccl
A.algos, A.kernels = {}, {}
for _, a in ipairs(dl.allreduce.algos) do
  A.algos[#A.algos + 1] = a
  if a ~= "nccl" then A.kernels[#A.kernels + 1] = a end
end
A.algos[#A.algos + 1] = "auto"
A.dtypes = { "bf16", "f16", "f32" }

-- rank r's input of call `seed`: normal(0, 1), generated in dtype (Philox:
-- the same numbers on every device)
function A.input(n, dtype, seed, r, device)
  return dl.randn({ n }, { dtype = dtype, seed = seed * 16 + r, device = device or A.w.device })
end

-- the sum of every rank's input, in fp64 on the host
function A.reference(n, dtype, seed)
  local ref = dl.zeros({ n }, { dtype = "f64", device = "cpu" })
  for r = 0, A.N - 1 do ref:add_(A.input(n, dtype, seed, r, "cpu"):f64()) end
  return ref
end

-- |got - ref| <= atol + rtol |ref|: the result is the fp32 sum rounded once to dtype
local tol = { bf16 = { 2 ^ -7, 1e-2 }, f16 = { 2 ^ -10, 2e-3 }, f32 = { 1e-5, 1e-5 } }
function A.expect_near(got, ref, dtype, what)
  local rtol, atol = tol[dtype][1], tol[dtype][2] * A.N
  local report = dl.mismatch_report(got:to("cpu"):f64(), ref, atol, rtol, 4)
  if report then error(what .. ": " .. report, 0) end
end

-- exact small values: multiples of 1/4 in [-2, 2], sums exact in every dtype
function A.exact_value(call, r, i) return (((call * 7 + r * 13 + i * 5) % 17) - 8) / 4 end
function A.exact_input(n, dtype, call, r)
  local host = dl.empty({ n }, { dtype = "f64", device = "cpu" })
  local p = ffi.cast("double*", host:data_ptr())
  for i = 0, n - 1 do p[i] = A.exact_value(call, r, i) end
  return host:to(A.w.device):to(dtype)
end
function A.exact_check(t, call, what)
  local v = t:to("cpu"):f64()
  local p = ffi.cast("double*", v:data_ptr())
  for i = 0, t:numel() - 1 do
    local want = 0
    for r = 0, A.N - 1 do want = want + A.exact_value(call, r, i) end
    if p[i] ~= want then error(string.format("%s: element %d is %s, expected %s", what, i, tostring(p[i]), want), 0) end
  end
end

-- Run fn; on error print "ERR: <message>" and exit 3.
function A.report(fn)
  local ok, err = pcall(fn)
  if not ok then
    io.stdout:write("ERR: " .. tostring(err) .. "\n")
    io.stdout:flush()
    os.exit(3)
  end
end

return A
