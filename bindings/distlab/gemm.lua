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
--   dl.gemm.stats() -> {calls, heuristics, cached, version, grouped_cublas, grouped_loop,
--     cublas_version}: cuBLASLt calls, algorithm-cache misses (heuristic
--     queries), cached configurations, the version of the library loaded (0
--     before the first GPU GEMM); grouped calls by backend, cuBLAS's version
--   dl.gemm.workspace_bytes
--
-- Grouped: one GEMM per expert, on the rows ep:dispatch grouped by expert
-- (the three GEMMs of a MoE expert layer, forward and backward):
--   dl.gemm.grouped(x, w, counts [, out] [, opts]) -> out, backend      Y_e = X_e W_e
--   dl.gemm.grouped_dx(dy, w, counts [, out] [, opts]) -> dx, backend   dX_e = dY_e W_e^T
--   dl.gemm.grouped_dw(x, dy, counts [, out] [, opts]) -> dw, backend   dW_e = X_e^T dY_e
--     x [E, R, K] expert-major (ep:dispatch's recv.x: rows r < counts[e] of
--       x[e]) or [T, K] packed (expert e's counts[e] rows after those of the
--       experts before it); dy likewise with N columns; rows past the counts
--       are neither read nor written (the out rows there keep what they held)
--     w [E, K, N] (a transposed view of [E, N, K] is fine: any strides with a unit
--       stride in one of the last two dimensions); dw [E, K, N]: zero for an
--       expert without rows
--     counts: int32/int64 [E] on cpu or on x's device (read back to the host:
--       the call waits for the stream; refused inside a graph capture), or a
--       Lua list of E integers. grouped(recv, w [, out] [, opts]) and
--       grouped_dw(recv, dy, ...) take ep:dispatch's recv table ({x =, counts =})
--     bf16 or f16 in, that dtype or f32 out, products summed in fp32 (fp64 on cpu)
--     opts: out_dtype (of an allocated out), accumulate (out += the products;
--       out must be given), backend ("auto" | "cublas" | "loop"; cuda only: cuBLAS's
--       grouped GEMM in one launch, or one cuBLASLt GEMM per expert, experts of one
--       shape as one strided-batched GEMM; "cublas" refuses accumulate into a bf16/f16
--       out: it rounds twice there), streams (loop: side streams the GEMMs are
--       spread over, 0..8; default 0: the current stream alone), workspace (cuda: a
--       tensor of at least
--       dl.gemm.grouped_workspace_bytes(E) bytes; default one from the allocator
--       per call, under the memory tag "gemm_workspace"; meta charges it)
--     backend (returned): "cublas" or "loop" where cuda ran, else the device type
--   dl.gemm.grouped_workspace_bytes(E)
--
-- How cuBLASLt is found and how its algorithm is chosen and cached:
-- core/ops/gemm/cublaslt.c; cuBLAS and the grouped call: core/ops/gemm/cublas.c;
-- how "auto" picks: core/ops/gemm/grouped.c. Products are summed in fp32 on the GPU.
local ffi = require "ffi"
local core = require "distlab.core"
local args = require "distlab.args"
local tensor = require "distlab.tensor"

local C, check, fail = core.C, core.check, core.fail

local M = { workspace_bytes = tonumber(C.DL_GEMM_WORKSPACE_BYTES) }

local KNOWN = { alpha = true, beta = true, c = true, out_dtype = true, workspace = true }
local o_t = ffi.typeof("dl_gemm_opts_t")
local out_pp = ffi.typeof("dl_tensor_t*[1]")

local function tensor_arg(t, name, fn)
  if not tensor.is_tensor(t) then fail("%s: %s must be a tensor, got %s", fn or "gemm", name, type(t)) end
  return t
end

-- opts.out_dtype as a dtype id (-1: none); a given out must be of it
local function out_dtype(name, out, fn)
  if name == nil then return -1 end
  local id = core.dtype_id(name)
  if out ~= nil and out.dtype_id ~= id then
    fail("%s: out_dtype is %s but the given out is %s (out_dtype is for an allocated out)", fn,
      core.dtype_names[id], out.dtype)
  end
  return id
end

function M.run(a, b, out, opts)
  if opts == nil and type(out) == "table" then out, opts = nil, out end
  opts = args.options(opts, KNOWN, "gemm")
  tensor_arg(a, "a")
  tensor_arg(b, "b")
  if out ~= nil then tensor_arg(out, "out") end
  local o = o_t()
  o.alpha = args.number(opts.alpha or 1, "gemm: alpha")
  o.beta = args.number(opts.beta or 0, "gemm: beta")
  o.out_dtype = out_dtype(opts.out_dtype, out, "gemm")
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
    version = tonumber(s.version), grouped_cublas = tonumber(s.grouped_cublas),
    grouped_loop = tonumber(s.grouped_loop), cublas_version = tonumber(s.cublas_version) }
end

-- ---- grouped ------------------------------------------------------------------------------

local GROUPED_KNOWN = { out_dtype = true, accumulate = true, backend = true, streams = true, workspace = true }
M.grouped_backends = { auto = C.DL_GEMM_GROUPED_AUTO, cublas = C.DL_GEMM_GROUPED_CUBLAS, loop = C.DL_GEMM_GROUPED_LOOP }
local BACKEND_NAME = { [tonumber(C.DL_GEMM_GROUPED_CUBLAS)] = "cublas", [tonumber(C.DL_GEMM_GROUPED_LOOP)] = "loop" }
local go_t = ffi.typeof("dl_gemm_grouped_opts_t")
local i64_arr = ffi.typeof("int64_t[?]")
local DEVICE_NAME = { [tonumber(C.DL_CPU)] = "cpu", [tonumber(C.DL_CUDA)] = "cuda", [tonumber(C.DL_META)] = "meta" }

-- fn(a, b, counts [, out] [, opts]), or fn(recv, b [, out] [, opts]) with recv = {x =, counts =}
local function grouped_args(fn, first, ...)
  if type(first) == "table" and not tensor.is_tensor(first) then
    if first.x == nil or first.counts == nil then
      fail("%s: a table as the first argument must be ep:dispatch's recv ({x =, counts =})", fn)
    end
    local b, out, opts = ...
    return first.x, b, first.counts, out, opts
  end
  local b, counts, out, opts = ...
  return first, b, counts, out, opts
end

local function grouped(op, fn, an, bn, ...)
  local a, b, counts, out, opts = grouped_args(fn, ...)
  if opts == nil and type(out) == "table" and not tensor.is_tensor(out) then out, opts = nil, out end
  opts = args.options(opts, GROUPED_KNOWN, fn)
  tensor_arg(a, an, fn)
  tensor_arg(b, bn, fn)
  if out ~= nil then tensor_arg(out, "out", fn) end
  local o = go_t()
  o.op = op
  local backend = opts.backend or "auto"
  if M.grouped_backends[backend] == nil then
    fail("%s: backend %s (auto, cublas or loop)", fn, tostring(backend))
  end
  o.backend = M.grouped_backends[backend]
  o.streams = args.int(opts.streams or 0, fn .. ": streams", 0, tonumber(C.DL_GEMM_GROUPED_MAX_STREAMS))
  o.out_dtype = out_dtype(opts.out_dtype, out, fn)
  o.accumulate = opts.accumulate and 1 or 0
  if opts.workspace ~= nil then o.workspace = tensor_arg(opts.workspace, "workspace", fn) end
  local host
  if tensor.is_tensor(counts) then
    o.counts = counts
  elseif type(counts) == "table" then
    local n = #counts
    args.int(n, fn .. ": the number of counts", 0, tonumber(C.DL_GEMM_GROUPED_MAX))
    host = i64_arr(math.max(n, 1))
    for i = 1, n do host[i - 1] = args.size(counts[i], string.format("%s: counts[%d]", fn, i)) end
    o.host_counts, o.groups = host, n
  else
    fail("%s: counts must be a tensor (int32/int64 [E]) or a list of E integers, got %s", fn, type(counts))
  end
  local pp = out_pp()
  pp[0] = out
  check(C.dl_gemm_grouped(o, a, b, pp, core.stream))
  local chosen = BACKEND_NAME[tonumber(o.chosen)] or DEVICE_NAME[tonumber(a.dev_type)]
  if out ~= nil then return out, chosen end
  return tensor.wrap(pp), chosen
end

function M.grouped(...) return grouped(C.DL_GEMM_FWD, "gemm.grouped", "x", "w", ...) end
function M.grouped_dx(...) return grouped(C.DL_GEMM_DGRAD, "gemm.grouped_dx", "dy", "w", ...) end
function M.grouped_dw(...) return grouped(C.DL_GEMM_WGRAD, "gemm.grouped_dw", "x", "dy", ...) end

function M.grouped_workspace_bytes(E)
  return tonumber(C.dl_gemm_grouped_workspace_bytes(args.size(E, "gemm.grouped_workspace_bytes: E")))
end

return setmetatable(M, { __call = function(_, ...) return M.run(...) end })
