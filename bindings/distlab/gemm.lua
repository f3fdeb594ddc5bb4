-- distlab.gemm — out = alpha * a @ b + beta * c: cuBLASLt on cuda, an fp64
-- CPU twin on cpu, nothing (but the accounting) on meta.
--
--   dl.gemm(a, b [, out] [, opts]) -> out      on the current stream
--     a [m, k], b [k, n]: both bf16 or both f16, any strides with a unit
--     stride in one dimension (a:t() is a transposed GEMM, no copy)
--     out [m, n]: a's dtype or f32; allocated when not given
--     opts: alpha (1), beta (0), c (the addend, default out; not read when
--     beta is 0), out_dtype ("bf16" | "f16" | "f32", for an allocated out;
--     default a's), workspace (cuda: a tensor of at least
--     dl.gemm.workspace_bytes; default one from the allocator per call,
--     under the memory tag "gemm_workspace")
--   dl.gemm.stats() -> {calls, heuristics, cached, version}: cuBLASLt calls,
--     algorithm-cache misses (heuristic queries), cached configurations, and
--     the version of the library loaded (0 before the first GPU GEMM)
--   dl.gemm.workspace_bytes
--
-- How cuBLASLt is found and how its algorithm is chosen and cached:
-- core/ops/gemm/cublaslt.c. Products are summed in fp32 on the GPU.
local ffi = require "ffi"
local core = require "distlab.core"
local args = require "distlab.args"
local tensor = require "distlab.tensor"

local C, check, fail = core.C, core.check, core.fail

local M = { workspace_bytes = tonumber(C.DL_GEMM_WORKSPACE_BYTES) }

local KNOWN = { alpha = true, beta = true, c = true, out_dtype = true, workspace = true }
local o_t = ffi.typeof("dl_gemm_opts_t")
local out_pp = ffi.typeof("dl_tensor_t*[1]")

local function tensor_arg(t, name)
  if not tensor.is_tensor(t) then fail("gemm: %s must be a tensor, got %s", name, type(t)) end
  return t
end

function M.run(a, b, out, opts)
  if opts == nil and type(out) == "table" then out, opts = nil, out end
  opts = args.options(opts, KNOWN, "gemm")
  tensor_arg(a, "a")
  tensor_arg(b, "b")
  if out ~= nil then tensor_arg(out, "out") end
  local o = o_t()
  o.alpha = opts.alpha or 1
  o.beta = opts.beta or 0
  o.out_dtype = opts.out_dtype and core.dtype_id(opts.out_dtype) or -1
  if opts.c ~= nil then o.c = tensor_arg(opts.c, "c") end
  if opts.workspace ~= nil then o.workspace = tensor_arg(opts.workspace, "workspace") end
  local pp = out_pp()
  pp[0] = out
  check(C.dl_gemm(o, a, b, pp, core.stream))
  if out ~= nil then return out end
  return tensor.wrap(pp)
end

function M.stats()
  local s = ffi.new("dl_gemm_stats_t")
  check(C.dl_gemm_stats(s))
  return { calls = tonumber(s.calls), heuristics = tonumber(s.heuristics), cached = tonumber(s.cached),
    version = tonumber(s.version) }
end

return setmetatable(M, { __call = function(_, ...) return M.run(...) end })
