-- spec/overlap/tune.lua — dl.gemm with DISTLAB_GEMM_TUNE set (cuBLASLt's
-- candidates timed at a configuration's first call, the fastest kept:
-- core/ops/gemm/cublaslt.c), which the overlap pipelines' chunk GEMMs use
-- under ag_gemm_bench: the shapes of the spec/gemm_spec.lua bound, twice each
-- (tuned, then cached), against the fp64 reference; a given c accumulated
-- (beta = 1) only once, so the timing runs did not touch the caller's data.
-- Run by spec/overlap_spec.lua with the variable set; prints "tune ok".
local dl = require "distlab"
local R = dofile(dl.root .. "/spec/gemm_ref.lua")

local dev = arg[1] or "cuda:0"
for i, sh in ipairs { { 300, 700, 500 }, { 1024, 512, 768 }, { 5, 37, 23 } } do
  local m, k, n = sh[1], sh[2], sh[3]
  local a = dl.randn({ m, k }, { dtype = "bf16", device = "cpu", seed = 10 * i })
  local b = dl.randn({ k, n }, { dtype = "bf16", device = "cpu", seed = 10 * i + 1 })
  local c0 = dl.randn({ m, n }, { dtype = "bf16", device = "cpu", seed = 10 * i + 2 })
  local ref, abs = R.matmul(a, b, { beta = 1, c = c0 })
  -- c in place (beta 1), then a plain a @ b (beta 0: its own tuned choice), each twice
  local ref0, abs0 = R.matmul(a, b)
  for call = 1, 4 do
    local in_place = call <= 2
    local c = c0:clone():to(dev)
    local got = in_place and dl.gemm(a:to(dev), b:to(dev), c, { beta = 1, c = c }) or dl.gemm(a:to(dev), b:to(dev))
    local msg = R.check(got, in_place and ref or ref0, in_place and abs or abs0, R.u.bf16, R.sum_bound(k, R.u.bf16),
      string.format("tuned gemm %dx%dx%d call %d (%s)", m, k, n, call, in_place and "c in place, beta 1" or "beta 0"))
    if msg then error(msg, 0) end
    if in_place then assert(dl.max_abs_diff(c, got) == 0, "the in-place result is c itself") end
  end
end
print("tune ok: " .. (os.getenv("DISTLAB_GEMM_TUNE") or "unset"))
