-- distlab.attn — one attention step and the merges of partial results that
-- context-parallel schedules are written from (C side: core/ops/attn/attn.c; kernels:
-- kernels/attn/attn.h). 1-based Lua, tensors in, tensors out, on core.stream.
--
-- Step
--   out, lse[, max_logit] = attn.fwd(q, k, v, opts)
--   dq, dk, dv            = attn.bwd(dout, q, k, v, out, lse, opts)
-- Shapes: bshd q [b, s, h, d], sbhd [s, b, h, d], thd [t, h, d]; k/v have
-- h_kv heads dividing h_q (GQA/MQA); v's head dim may differ from q/k's
-- (MLA 192/128). lse is f32 [b, h, s], or [h, t] for thd. bf16 or f16.
-- opts (all optional):
--   layout        "bshd" | "sbhd" | "thd"
--   mask          "none" | "causal" (top-left) | "causal_bottom_right"
--   window        {left, right}: key j visible to query i iff
--                 i+shift-left <= j <= i+shift+right (-1: no bound); a causal
--                 mask makes right 0. shift is 0 (top-left alignment) or
--                 s_kv - s_q of each sequence (bottom-right alignment: mask
--                 causal_bottom_right, or mask none with align)
--   align         "top_left" (default) | "bottom_right"
--   scale         softmax scale, default 1/sqrt(d_qk)
--   cu_seqlens_q, cu_seqlens_kv            thd: i32 [b+1], valid lengths
--   cu_seqlens_q_padded, cu_seqlens_kv_padded
--                 thd: i32 [b+1], row where each sequence starts (need not
--                 start at 0: all-gather CP passes the whole Q per step)
--   max_seqlen_q, max_seqlen_kv   thd: largest valid lengths; without them
--                 cu_seqlens are read back (a sync on cuda)
--   backend       "ours" (default: our kernel, its fp64 twin on cpu) |
--                 "cudnn" (cuDNN's fused attention, cuda only; a call it
--                 cannot run is an error saying why) | "auto" (cuDNN where
--                 it takes the call, else ours). attn.backends says which.
-- fwd only:
--   return_max_logit  also return f32 [h_q], the max scaled logit per head
--   max_logit     a running f32 [h_q] max to update (implies the above)
--   out, lse      preallocated results, written in place (rows outside the
--                 sequences untouched: all-gather CP fills one full tensor
--                 step by step through per-step padded offsets). out is q's
--                 dtype, or f32 for bf16/f16 q: a partial kept in fp32
--                 (written by the fused merge into (0, -inf): whole, rows
--                 outside the sequences 0 and lse -inf; backend "ours")
--   accumulate    {out = O, lse = L}: fused merge; the step is folded into
--                 the running (O, L) in the kernel's epilogue and no per-step
--                 output exists. O is f32, bf16 or f16; start from
--                 attn.accumulator(q, v) (O = 0, L = -inf). Returns O, L.
-- bwd only:
--   dq, dk, dv    preallocated gradients; accumulate_grads = true adds into
--                 them (all three needed)
-- Results the call allocates are charged to the current memory tag; for thd
-- they are zero (lse -inf) outside the sequences.
--
-- Backends
--   attn.backends(q, k, v, opts) -> {fwd = "cudnn" | "ours" | false, fwd_why = ...,
--       bwd = ..., bwd_why = ..., cudnn = attn.cudnn_info()}: what fwd and bwd
--       with these operands and opts would run (false: "cudnn" asked and
--       refused) and why; may build and cache cuDNN's plans. With "ours" on
--       cuda, fwd_why ends with the kernel: "kernel: hopper forward (...)"
--       (kernels/attn/hopper/: sm_90, bf16, head dims 64 or 128, accumulate in
--       f32 or bf16) or "kernel: portable (hopper forward: <why not>)"; bwd_why
--       likewise "kernel: hopper backward (...; N query rows an item)" or "kernel: portable (hopper
--       backward: <why not>)". DISTLAB_ATTN_HOPPER=0 keeps the
--       portable kernels (A/B timings).
--   attn.runs() -> {fwd = {cpu =, portable =, hopper =, cudnn =}, bwd = {...}}:
--       the steps each kernel has run in this process (a step with no rows
--       counts nowhere); the difference of two readings says which kernels
--       a schedule's steps really took (cp_bench prints it per strategy).
--   attn.cudnn_info() -> {version, header_version, frontend_version, path,
--       plans, builds, hits, build_ms, last_build_ms, max_workspace, pick}
--       pick: which libcudnn was taken and why (DISTLAB_CUDNN, else the newest
--       found: the pinned copy of scripts/fetch-cudnn-lib.sh, PyTorch's wheel,
--       the system's), or which will be, and every candidate with its version.
--       On a cuDNN known to compute a configuration wrongly (attn_cudnn.c's
--       errata), "cudnn" refuses it naming the version and the fix, and "auto"
--       runs ours.
--
-- Merges (the correction strategies). Common opts: layout, half = "first" |
-- "second" (rows of every sequence that take part; thd: halves of each
-- padded sequence, by cu_seqlens_padded, required for thd). A part (and
-- part_lse) holds the same rows as its target or, with a half and a shorter
-- sequence dim, only that half packed (thd: sequence i at row
-- (p[i] - p[1]) / 2).
--   attn.merge_lse(lse, part_lse, opts)               lse <- logaddexp(lse, part_lse)
--   attn.merge_out(out, lse, part, part_lse, opts)    opts.mode:
--       "incremental" (default)  out <- out e^(lse-L') + part e^(part_lse-L'), lse <- L'
--       "init" / "add"           out = / += part e^(part_lse - lse), lse final (read)
--     opts.skip_zero_rows: a part row that is exactly zero adds nothing
--   attn.correct_grad(grad, part, opts)  opts.first, opts.second: "copy" |
--       "add" | "none" (default) for each half of every sequence
--   attn.merge(parts, part_lses, opts) -> out, lse    post-loop merge of full parts
--   attn.accumulator(q, v, opts) -> {out = 0, lse = -inf}  (opts.dtype, default f32)
local ffi = require "ffi"
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local args = require "distlab.args"

local C, check, fail = core.C, core.check, core.fail
local T = tensor.methods
local M = {}

local opts_t = ffi.typeof("dl_attn_opts_t")
local merge_opts_t = ffi.typeof("dl_attn_merge_opts_t")
local slot_t = ffi.typeof("dl_tensor_t*[1]")

local layouts = { bshd = C.DL_ATTN_BSHD, sbhd = C.DL_ATTN_SBHD, thd = C.DL_ATTN_THD }
local halves = { all = C.DL_ATTN_ROWS_ALL, first = C.DL_ATTN_ROWS_FIRST_HALF,
  second = C.DL_ATTN_ROWS_SECOND_HALF }
local out_modes = { incremental = C.DL_ATTN_OUT_INCREMENTAL, init = C.DL_ATTN_OUT_INIT,
  add = C.DL_ATTN_OUT_ADD }
local grad_modes = { copy = C.DL_ATTN_GRAD_SET, add = C.DL_ATTN_GRAD_ACCUMULATE }
local backends = { ours = C.DL_ATTN_OURS, cudnn = C.DL_ATTN_CUDNN, auto = C.DL_ATTN_AUTO }
local backend_names = { [C.DL_ATTN_OURS] = "ours", [C.DL_ATTN_CUDNN] = "cudnn" }

local function keyset(list)
  local s = {}
  for _, k in ipairs(list) do s[k] = true end
  return s
end
local STEP = { "layout", "mask", "window", "align", "scale", "cu_seqlens_q", "cu_seqlens_kv",
  "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "max_seqlen_q", "max_seqlen_kv", "backend" }
local FWD_KEYS = keyset(STEP)
for _, k in ipairs({ "return_max_logit", "max_logit", "out", "lse", "accumulate" }) do FWD_KEYS[k] = true end
local BWD_KEYS = keyset(STEP)
for _, k in ipairs({ "dq", "dk", "dv", "accumulate_grads" }) do BWD_KEYS[k] = true end

local function check_keys(op, opts, keys)
  if type(opts) ~= "table" then fail("%s: opts must be a table, got %s", op, type(opts)) end
  args.options(opts, keys, op)
end

local function want_tensor(op, name, x, optional)
  if x == nil and optional then return nil end
  if not tensor.is_tensor(x) then fail("%s: %s must be a tensor, got %s", op, name, type(x)) end
  return x
end

-- the kernels take these as int32: checked before the conversion
local function int_opt(op, name, x, lo)
  if x == nil then return nil end
  return args.int32(x, op .. ": " .. name, lo)
end

local function layout_of(op, opts)
  local l = layouts[opts.layout or "bshd"]
  if not l then fail("%s: layout %s is not bshd, sbhd or thd", op, tostring(opts.layout)) end
  return l
end

-- Lua options -> dl_attn_opts_t (mask and window resolved into the kernel's window).
local function step_opts(op, opts, keys)
  check_keys(op, opts, keys)
  local o = opts_t()
  o.layout = layout_of(op, opts)
  local wl, wr = -1, -1
  if opts.window ~= nil then
    local w = opts.window
    if type(w) ~= "table" or #w ~= 2 then fail("%s: window must be {left, right}", op) end
    wl, wr = int_opt(op, "window[1]", w[1], -1), int_opt(op, "window[2]", w[2], -1)
  end
  local mask, br = opts.mask or "none", opts.align == "bottom_right"
  if opts.align ~= nil and opts.align ~= "top_left" and opts.align ~= "bottom_right" then
    fail("%s: align %s is not top_left or bottom_right", op, tostring(opts.align))
  end
  if mask == "causal" or mask == "causal_bottom_right" then
    if wr > 0 then fail("%s: window right bound %d contradicts mask %s (right bound 0)", op, wr, mask) end
    local cbr = mask == "causal_bottom_right"
    if opts.align ~= nil and br ~= cbr then fail("%s: align %s contradicts mask %s", op, opts.align, mask) end
    wr, br = 0, cbr
  elseif mask ~= "none" then
    fail("%s: mask %s is not none, causal or causal_bottom_right", op, tostring(mask))
  end
  o.window_left, o.window_right, o.bottom_right = wl, wr, br and 1 or 0
  if opts.scale ~= nil then
    if type(opts.scale) ~= "number" or not (opts.scale > 0) or opts.scale == math.huge then
      fail("%s: scale must be a finite number > 0, got %s", op, tostring(opts.scale))
    end
    o.scale = opts.scale
  end
  local thd = o.layout == C.DL_ATTN_THD
  for _, k in ipairs({ "cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded" }) do
    if opts[k] ~= nil then
      if not thd then fail("%s: %s is for layout thd only", op, k) end
      o[k] = want_tensor(op, k, opts[k])
    end
  end
  o.max_seqlen_q = int_opt(op, "max_seqlen_q", opts.max_seqlen_q, 1) or 0
  o.max_seqlen_kv = int_opt(op, "max_seqlen_kv", opts.max_seqlen_kv, 1) or 0
  local b = backends[opts.backend or "ours"]
  if not b then fail("%s: backend %s is not ours, cudnn or auto", op, tostring(opts.backend)) end
  o.backend = b
  return o
end

-- Device memory is invisible to Lua's GC: on DL_ENOMEM collect once and retry.
local function call(fn, ...)
  local rc = fn(...)
  if rc == C.DL_ENOMEM then
    collectgarbage("collect")
    collectgarbage("collect")
    rc = fn(...)
  end
  check(rc)
end

-- The tensor in a slot: the caller's own object, or a new one the GC owns.
local function take(slot, given)
  if given ~= nil then return given end
  return tensor.wrap(slot)
end

function M.fwd(q, k, v, opts)
  opts = opts or {}
  local op = "attn.fwd"
  local o = step_opts(op, opts, FWD_KEYS)
  want_tensor(op, "q", q)
  want_tensor(op, "k", k)
  want_tensor(op, "v", v)
  local acc = opts.accumulate
  local out, lse = slot_t(), slot_t()
  if acc ~= nil then
    if type(acc) ~= "table" then fail("%s: accumulate must be {out = O, lse = L}", op) end
    want_tensor(op, "accumulate.out", acc.out)
    want_tensor(op, "accumulate.lse", acc.lse)
    if opts.out ~= nil or opts.lse ~= nil then
      fail("%s: out/lse and accumulate exclude each other (the step goes into accumulate)", op)
    end
  else
    out[0] = want_tensor(op, "out", opts.out, true)
    lse[0] = want_tensor(op, "lse", opts.lse, true)
  end
  local ml
  if opts.return_max_logit or opts.max_logit ~= nil then
    ml = slot_t()
    ml[0] = want_tensor(op, "max_logit", opts.max_logit, true)
  end
  call(C.dl_attn_fwd, o, q, k, v, out, lse, ml, acc and acc.out, acc and acc.lse, core.stream)
  local mlt = ml and take(ml, opts.max_logit)
  if acc then return acc.out, acc.lse, mlt end
  return take(out, opts.out), take(lse, opts.lse), mlt
end

function M.bwd(dout, q, k, v, out, lse, opts)
  opts = opts or {}
  local op = "attn.bwd"
  local o = step_opts(op, opts, BWD_KEYS)
  for i, x in ipairs({ dout, q, k, v, out, lse }) do
    want_tensor(op, ({ "dout", "q", "k", "v", "out", "lse" })[i], x)
  end
  o.accumulate_grads = opts.accumulate_grads and 1 or 0
  local dq, dk, dv = slot_t(), slot_t(), slot_t()
  dq[0] = want_tensor(op, "dq", opts.dq, true)
  dk[0] = want_tensor(op, "dk", opts.dk, true)
  dv[0] = want_tensor(op, "dv", opts.dv, true)
  call(C.dl_attn_bwd, o, dout, q, k, v, out, lse, dq, dk, dv, core.stream)
  return take(dq, opts.dq), take(dk, opts.dk), take(dv, opts.dv)
end

-- ---- backends --------------------------------------------------------------------

function M.cudnn_info()
  local i = ffi.new("dl_attn_cudnn_info_t")
  check(C.dl_attn_cudnn_info(i))
  return { version = tonumber(i.version), header_version = tonumber(i.header_version),
    frontend_version = tonumber(i.frontend_version), path = ffi.string(i.path), plans = tonumber(i.plans),
    builds = tonumber(i.builds), hits = tonumber(i.hits), build_ms = i.build_ms, last_build_ms = i.last_build_ms,
    max_workspace = tonumber(i.max_workspace), pick = ffi.string(i.pick) }
end

local RUN_KINDS = { "cpu", "portable", "hopper", "cudnn" } -- dl_attn_runs' kinds, in order
function M.runs()
  local out = ffi.new("int64_t[?]", C.DL_ATTN_RUNS)
  check(C.dl_attn_runs(out))
  local r = { fwd = {}, bwd = {} }
  for i, kind in ipairs(RUN_KINDS) do
    r.fwd[kind], r.bwd[kind] = tonumber(out[i - 1]), tonumber(out[3 + i])
  end
  return r
end

function M.backends(q, k, v, opts)
  opts = opts or {}
  local op = "attn.backends"
  local keys = keyset(STEP)
  for _, key in ipairs({ "accumulate", "return_max_logit" }) do keys[key] = true end
  local o = step_opts(op, opts, keys)
  want_tensor(op, "q", q)
  want_tensor(op, "k", k)
  want_tensor(op, "v", v)
  local r = {}
  local chosen, why = ffi.new("int[1]"), ffi.new("char[1024]")
  for dir, name in pairs({ [0] = "fwd", [1] = "bwd" }) do
    -- the dtype of the accumulate.out the fwd call would have (-1: none; f32 where it is not a tensor yet)
    local acc = type(opts.accumulate) == "table" and opts.accumulate.out
    local fused = dir == 0 and opts.accumulate ~= nil and (tensor.is_tensor(acc) and acc.dtype_id or C.DL_F32) or -1
    local ml = dir == 0 and opts.return_max_logit and 1 or 0
    check(C.dl_attn_backend(o, q, k, v, dir, fused, ml, chosen, why, 1024))
    r[name] = backend_names[chosen[0]] or false
    r[name .. "_why"] = ffi.string(why)
  end
  r.cudnn = M.cudnn_info()
  return r
end

-- ---- merges ----------------------------------------------------------------------

local MERGE_KEYS = keyset({ "layout", "half", "cu_seqlens_padded" })
local OUT_KEYS = keyset({ "layout", "half", "cu_seqlens_padded", "mode", "skip_zero_rows" })
local GRAD_KEYS = keyset({ "layout", "cu_seqlens_padded", "first", "second" })

local function merge_opts(op, opts, keys)
  check_keys(op, opts, keys)
  local o = merge_opts_t()
  o.layout = layout_of(op, opts)
  local h = halves[opts.half or "all"]
  if not h then fail("%s: half %s is not first, second or all", op, tostring(opts.half)) end
  o.rows = h
  o.skip_zero_rows = opts.skip_zero_rows and 1 or 0
  o.cu_seqlens_padded = want_tensor(op, "cu_seqlens_padded", opts.cu_seqlens_padded, true)
  return o
end

function M.merge_lse(lse, part_lse, opts)
  local op = "attn.merge_lse"
  local o = merge_opts(op, opts or {}, MERGE_KEYS)
  check(C.dl_attn_merge_lse(o, want_tensor(op, "lse", lse), want_tensor(op, "part_lse", part_lse),
    core.stream))
  return lse
end

function M.merge_out(out, lse, part, part_lse, opts)
  opts = opts or {}
  local op = "attn.merge_out"
  local o = merge_opts(op, opts, OUT_KEYS)
  local mode = out_modes[opts.mode or "incremental"]
  if not mode then fail("%s: mode %s is not incremental, init or add", op, tostring(opts.mode)) end
  for i, x in ipairs({ out, lse, part, part_lse }) do
    want_tensor(op, ({ "out", "lse", "part", "part_lse" })[i], x)
  end
  check(C.dl_attn_merge_out(o, mode, out, lse, part, part_lse, core.stream))
  return out, lse
end

-- Sequence dim (1-based) of a [b, s, h, d]-like tensor in a layout.
local function seq_dim(layout) return layout == C.DL_ATTN_BSHD and 2 or 1 end

function M.correct_grad(grad, part, opts)
  opts = opts or {}
  local op = "attn.correct_grad"
  local o = merge_opts(op, opts, GRAD_KEYS)
  want_tensor(op, "grad", grad)
  want_tensor(op, "part", part)
  local first, second = opts.first or "none", opts.second or "none"
  for _, m in ipairs({ first, second }) do
    if m ~= "none" and not grad_modes[m] then fail("%s: %s is not copy, add or none", op, tostring(m)) end
  end
  if first ~= "none" and first == second then
    o.rows = C.DL_ATTN_ROWS_ALL
    check(C.dl_attn_merge_grad(o, grad_modes[first], grad, part, core.stream))
    return grad
  end
  local d = seq_dim(o.layout)
  if first ~= "none" and second ~= "none" and grad.nd >= d and part.nd >= d and
     T.size(part, d) ~= T.size(grad, d) then
    fail("%s: part holds one half only, so only one of first/second can be set", op)
  end
  for _, hm in ipairs({ { C.DL_ATTN_ROWS_FIRST_HALF, first }, { C.DL_ATTN_ROWS_SECOND_HALF, second } }) do
    if hm[2] ~= "none" then
      o.rows = hm[1]
      check(C.dl_attn_merge_grad(o, grad_modes[hm[2]], grad, part, core.stream))
    end
  end
  return grad
end

-- Post-loop merge: lse = logaddexp of all part_lses, out = sum_i e^(lse_i - lse) out_i.
function M.merge(parts, part_lses, opts)
  opts = opts or {}
  local op = "attn.merge"
  check_keys(op, opts, keyset({ "layout", "cu_seqlens_padded", "dtype" }))
  if type(parts) ~= "table" or type(part_lses) ~= "table" or #parts == 0 or #parts ~= #part_lses then
    fail("%s: expected two lists of the same non-zero length (parts, part_lses)", op)
  end
  local mo = { layout = opts.layout, cu_seqlens_padded = opts.cu_seqlens_padded }
  local lse = T.clone(want_tensor(op, "part_lses[1]", part_lses[1]))
  for i = 2, #part_lses do M.merge_lse(lse, want_tensor(op, "part_lses[" .. i .. "]", part_lses[i]), mo) end
  local out = tensor.empty_like(want_tensor(op, "parts[1]", parts[1]), { dtype = opts.dtype })
  for i = 1, #parts do
    mo.mode = i == 1 and "init" or "add"
    M.merge_out(out, lse, parts[i], part_lses[i], mo)
  end
  return out, lse
end

-- A running (out, lse) for incremental or fused merges: out = 0 shaped like
-- q with v's head dim, lse = -inf; f32 unless opts.dtype.
function M.accumulator(q, v, opts)
  opts = opts or {}
  local op = "attn.accumulator"
  check_keys(op, opts, keyset({ "layout", "dtype" }))
  local layout = layout_of(op, opts)
  want_tensor(op, "q", q)
  want_tensor(op, "v", v)
  local thd = layout == C.DL_ATTN_THD
  if q.nd ~= (thd and 3 or 4) or v.nd ~= q.nd then
    fail("%s: q and v must have %d dims for layout %s", op, thd and 3 or 4, opts.layout or "bshd")
  end
  local shape = q.shape
  shape[#shape] = v.shape[v.nd]
  local lse_shape
  if thd then
    lse_shape = { shape[2], shape[1] }
  else
    local sd = seq_dim(layout)
    lse_shape = { shape[3 - sd], shape[3], shape[sd] }
  end
  local dev = q.device
  return {
    out = T.zero_(tensor.empty(shape, { dtype = opts.dtype or "f32", device = dev })),
    lse = T.fill_(tensor.empty(lse_shape, { dtype = "f32", device = dev }), -math.huge),
  }
end

-- Options are built (allocations) between taking the tensors' pointers and the
-- C call: keep these interpreted so their arguments stay alive (see the end
-- of distlab.tensor). Each launches a kernel; the interpreter costs nothing here.
for _, fn in ipairs({ M.fwd, M.bwd, M.backends, M.merge_lse, M.merge_out, M.correct_grad }) do jit.off(fn) end

return M
