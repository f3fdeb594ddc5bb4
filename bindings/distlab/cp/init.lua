-- distlab.cp — context-parallel attention: one attention over a sequence
-- that is spread over the ranks of a communicator.
--
--   local cp = dl.cp.attention{comm = dl.comm.world(),
--     algo = "p2p" | "all_gather" | "a2a",
--     comm_buffers = "per_step" | 2,                         (p2p; default 2)
--     correction = "post_loop" | "incremental" | "fused" | a registered name | a spec table
--                                                            (p2p; default "fused")
--     dkv = "travel" | "local",                              (p2p backward; default "travel")
--     overlap = bool,        (all_gather, bshd/sbhd, no window: attend to the local
--                             K/V while the gathers run; a2a: two head groups in a
--                             pipeline, heads per rank even; default false)
--     backend = "ours" | "cudnn" | "auto",  (dl.attn's backend for every step; default
--                             "ours". correction "fused" and all_gather's overlap
--                             merge in our kernel's epilogue: with "cudnn" they are an
--                             error, with "auto" those steps run ours. "cudnn" needs
--                             a cuda communicator, or meta, where nothing runs and
--                             cuDNN's workspace is counted by its formula)
--     layout = "bshd" | "sbhd" | "thd", mask = "none" | "causal",
--     window = {left, right}, scale =, return_max_logit = bool}
--   out, lse[, max_logit] = cp:forward(q, k, v[, {cu_seqlens_q =, cu_seqlens_q_padded =}])
--   dq, dk, dv = cp:backward(dout)
--   cp:release()                      drop what forward kept for backward
--   cp:peak(q, k, v[, seq]) -> {fwd =, bwd =}: the schedule's memory formula, bytes
--   cp:memory(q_shape, k_shape, v_shape[, {dtype =, seq =}]) -> measured peaks by tag
--   x_shard = dl.cp.shard(x, {comm =, layout =, cu_seqlens_padded =, dim =})
--   x = dl.cp.unshard(x_shard, {comm =, layout =, cu_seqlens_padded =, dim =})
--   cp:geometry(q, k, v[, seq]) -> g: the sizes the memory formulas are
--                                     written in (cp/corrections.lua lists them)
--   dl.cp.register_correction(name, {start =, step =, finish =, peak =})
--   dl.cp.unregister_correction(name)  forget it (registering a name again replaces it)
--   dl.cp.corrections.names()         the names correction = takes
--   ?dl.cp.corrections                the contract of a correction
--       A correction of your own, in your own script: the contract (the
--       fields of f and st, what finish returns, what peak counts) is in
--       cp/corrections.lua, the plan's helpers in cp/plan.lua (dl.cp.plan);
--       experiments/cp/f32_partials.lua is one written as a user would.
--
-- q, k, v, out and lse are this rank's shards in dual-chunk order (plan.lua),
-- as dl.cp.shard cuts them (contiguous: p2p sends k and v as they are);
-- lse is [b, h, s_r] (thd [h, t_r]), max_logit [h]
-- is merged over steps and ranks. thd takes the cu_seqlens of the FULL
-- sequence (Lua tables or int32 tensors; tables on meta), every padded
-- length a multiple of 2C. The schedules are cp/p2p.lua, cp/all_gather.lua
-- and cp/a2a.lua: each reads top to bottom and states its peak memory.
local dl = require "distlab"
local plan = require "distlab.cp.plan"
local corrections = require "distlab.cp.corrections"
local args = require "distlab.args"

local fail = dl.fail
local M = {}
-- what a correction of one's own is written with (cp/corrections.lua)
M.plan, M.free, M.wait, M.on = plan, plan.free, plan.wait, plan.on
M.register_correction, M.unregister_correction, M.corrections = corrections.register, corrections.unregister,
  corrections
-- the named strategies (main, double, fused, ...): distlab.cp.presets
M.presets = require "distlab.cp.presets"
local CP = {}
CP.__index = CP

local KEYS = { comm = true, algo = true, comm_buffers = true, correction = true, dkv = true,
  layout = true, mask = true, window = true, scale = true, return_max_logit = true, overlap = true,
  backend = true }
local P2P_ONLY = { comm_buffers = true, correction = true, dkv = true }

local function one_of(name, x, list)
  for _, v in ipairs(list) do
    if x == v then return x end
  end
  local names = {}
  for i, v in ipairs(list) do names[i] = tostring(v) end
  fail("cp.attention: %s = %s is not one of %s", name, tostring(x), table.concat(names, ", "))
end

function M.attention(opts)
  opts = args.options(opts, KEYS, "cp.attention")
  if opts.comm ~= nil and not (type(opts.comm) == "table" and getmetatable(opts.comm) == dl.comm.Comm) then
    fail("cp.attention: comm must be a communicator (dl.comm.world(), a split), got %s",
      type(opts.comm) == "string" and string.format("%q", opts.comm) or type(opts.comm))
  end
  local self = setmetatable({}, CP)
  self.comm = opts.comm or dl.comm.world()
  self.algo = one_of("algo", opts.algo or "p2p", { "p2p", "all_gather", "a2a" })
  for k in pairs(P2P_ONLY) do
    if opts[k] ~= nil and self.algo ~= "p2p" then
      fail("cp.attention: %s is an option of algo p2p, not %s", k, self.algo)
    end
  end
  self.comm_buffers = one_of("comm_buffers", opts.comm_buffers or 2, { "per_step", 2 })
  self.correction, self.correction_spec = corrections.resolve(opts.correction or "fused", "cp.attention")
  self.dkv = one_of("dkv", opts.dkv or "travel", { "travel", "local" })
  self.layout = one_of("layout", opts.layout or "bshd", { "bshd", "sbhd", "thd" })
  self.backend = one_of("backend", opts.backend or "ours", { "ours", "cudnn", "auto" })
  if self.backend == "cudnn" and self.comm.device == "cpu" then
    fail("cp.attention: backend = \"cudnn\" needs a cuda device (cuDNN runs on cuda only), and comm '%s' is on "
      .. "cpu: use backend \"ours\" or \"auto\" there (on meta, cudnn counts its workspace by formula)", self.comm.name)
  end
  if self.backend == "cudnn" and self.algo == "p2p" and self.correction == "fused" then
    fail("cp.attention: correction = \"fused\" merges in our attention kernel's epilogue, which cuDNN " ..
      "has not: with backend = \"cudnn\" use correction \"incremental\" or \"post_loop\" (or backend \"auto\", " ..
      "which runs ours for the fused steps)")
  end
  local mask = one_of("mask", opts.mask or "none", { "none", "causal", "causal_bottom_right" })
  -- Q and KV cover the same positions: bottom-right and top-left causal agree.
  self.causal = mask ~= "none"
  if opts.scale ~= nil and (type(opts.scale) ~= "number" or not (opts.scale > 0)) then
    fail("cp.attention: scale must be a number > 0, got %s", tostring(opts.scale))
  end
  self.scale = opts.scale
  self.return_max_logit = opts.return_max_logit and true or false
  local w = opts.window
  if w ~= nil then
    if type(w) ~= "table" or #w ~= 2 then fail("cp.attention: window must be {left, right}") end
    for i = 1, 2 do
      if type(w[i]) ~= "number" or w[i] ~= math.floor(w[i]) or w[i] < -1 then
        fail("cp.attention: window[%d] = %s must be an integer >= -1 (-1: no bound)", i, tostring(w[i]))
      end
    end
    if self.causal and w[2] > 0 then
      fail("cp.attention: window {%d, %d} contradicts a causal mask (right bound 0)", w[1], w[2])
    end
    if self.algo == "p2p" then
      fail("cp.attention: sliding windows are supported by algo all_gather and a2a, not p2p")
    end
    if self.algo == "all_gather" and self.layout == "thd" and w[2] ~= 0 and not self.causal and
       not (w[1] == -1 and w[2] == -1) then
      fail("cp.attention: all_gather with thd takes windows {left, 0} (or a causal mask): a window " ..
        "reaching right of the diagonal cannot be clipped per sequence by the kernel's two alignments; use a2a")
    end
    -- {left, 0} is a causal mask with a left bound: one name for it.
    if w[2] == 0 then self.causal = true end
    self.window = { w[1], self.causal and 0 or w[2] }
  end
  if opts.overlap ~= nil and type(opts.overlap) ~= "boolean" then
    fail("cp.attention: overlap must be true or false, got %s", tostring(opts.overlap))
  end
  self.overlap = opts.overlap or false
  if self.overlap then
    if self.algo == "p2p" then fail("cp.attention: overlap is an option of algo all_gather and a2a, not p2p") end
    if self.algo == "all_gather" and self.layout == "thd" then
      fail("cp.attention: all_gather overlap takes bshd or sbhd, not thd")
    end
    if self.algo == "all_gather" and self.window then
      fail("cp.attention: all_gather overlap takes no window (a causal mask or none)")
    end
    if self.algo == "all_gather" and self.backend == "cudnn" then
      fail("cp.attention: all_gather overlap merges in our attention kernel's epilogue, which cuDNN has not: " ..
        "with backend = \"cudnn\" leave overlap off (or use backend \"auto\")")
    end
  end
  self.impl = require("distlab.cp." .. self.algo)
  -- ranks whose schedules differ (a mask, a correction) would each compute
  -- something plausible and wrong: every rank checks every other's, once
  self.comm:agree("cp.attention options", string.format(
    "algo=%s, backend=%s, layout=%s, causal=%s, window=%s, scale=%s, comm_buffers=%s, correction=%s, dkv=%s, " ..
    "overlap=%s, return_max_logit=%s", self.algo, self.backend, self.layout, tostring(self.causal),
    self.window and (self.window[1] .. ":" .. self.window[2]) or "none",
    self.scale and string.format("%.17g", self.scale) or "default", tostring(self.comm_buffers), self.correction,
    self.dkv, tostring(self.overlap), tostring(self.return_max_logit)))
  return self
end

CP.__tostring = function(s)
  local extra = s.algo == "p2p" and string.format(", comm_buffers %s, correction %s, dkv %s", s.comm_buffers,
    s.correction, s.dkv) or s.overlap and ", overlap" or ""
  return string.format("cp.attention(%s over %d ranks, %s, %s%s)", s.algo, s.comm.size, s.layout,
    s.causal and "causal" or "no mask", extra)
end

-- Streams and events of this object, made once on the tensors' device.
local function streams(self, device)
  if self.device == device then return end
  self.device = device
  self.streams = { comm = dl.stream(device), merge = dl.stream(device) }
  self.events = { ready = dl.event(device), arrived = dl.event(device), done = dl.event(device),
    back = dl.event(device), groups = {} }
  for s = 1, self.impl.GROUPS or 0 do -- a schedule's pipeline groups (a2a overlap): arrived, done
    self.events.groups[s] = { arrived = dl.event(device), done = dl.event(device) }
  end
end

local function check_inputs(self, q, k, v)
  local xs = { q, k, v } -- not ipairs: it stops at a nil q
  for i, name in ipairs { "q", "k", "v" } do
    if not dl.is_tensor(xs[i]) then fail("cp:forward: %s must be a tensor, got %s", name, type(xs[i])) end
  end
  local nd = self.layout == "thd" and 3 or 4
  if q.nd ~= nd or k.nd ~= nd or v.nd ~= nd then
    fail("cp:forward: layout %s needs %d-dim q, k, v", self.layout, nd)
  end
  local dev = self.comm.device
  if q.device ~= dev and not (dev:match("^cuda") and q.device:match("^cuda")) then
    fail("cp:forward: q is on %s but the communicator on %s", q.device, dev)
  end
end

function CP:forward(q, k, v, seq)
  if getmetatable(self) ~= CP then fail("cp:forward: call it as cp:forward(q, k, v[, seq]) (a colon, not a dot)") end
  check_inputs(self, q, k, v)
  self:release()
  streams(self, q.device)
  local pl = plan.new { C = self.comm.size, r = self.comm.rank, layout = self.layout, x = q, seq = seq,
    backend = self.backend }
  local out, lse, ml = self.impl.forward(self, q, k, v, pl)
  self.saved = self.saved or {}
  local sv = self.saved
  sv.q, sv.k, sv.v, sv.out, sv.lse, sv.pl = q, k, v, out, lse, pl
  return out, lse, ml
end

function CP:backward(dout)
  if getmetatable(self) ~= CP then fail("cp:backward: call it as cp:backward(dout) (a colon, not a dot)") end
  if not self.saved then fail("cp:backward: call cp:forward first (or again after a backward)") end
  if not dl.is_tensor(dout) then fail("cp:backward: dout must be a tensor") end
  local dq, dk, dv = self.impl.backward(self, dout, self.saved)
  self:release()
  return dq, dk, dv
end

-- Drops what forward kept for backward (the schedule's own saved tensors,
-- the plan's seqlens); the caller's tensors are left alone.
function CP:release()
  local sv = self.saved
  if not sv then return end
  for _, t in ipairs(sv.own or {}) do t:free() end
  if sv.pl then sv.pl:release() end
  self.saved = nil
end

-- ---- memory formula --------------------------------------------------------------

local function round256(n) return math.ceil(n / 256) * 256 end

-- The sizes the formulas are written in, for this object and these shards.
function CP:geometry(q, k, v, seq)
  local C = self.comm.size
  local pl = plan.new { C = C, r = self.comm.rank, layout = self.layout, x = q, seq = seq, backend = self.backend }
  local rows = pl.thd and pl.T_r or q:size(self.layout == "sbhd" and 2 or 1) * pl.S_r
  local e, hq, hkv = q:element_size(), q:size(-2), k:size(-2)
  local dqk, dv = q:size(-1), v:size(-1)
  local g = { C = C, r = self.comm.rank, layout = self.layout, causal = self.causal, window = self.window,
    comm_buffers = self.comm_buffers, correction = self.correction, correction_spec = self.correction_spec,
    dkv = self.dkv, overlap = self.overlap, rows = rows, hq = hq, hkv = hkv, e = e, dqk = dqk, dv = dv,
    Uq = rows * hq * dqk * e, Uk = rows * hkv * dqk * e, Uv = rows * hkv * dv * e, Uo = rows * hq * dv * e,
    l = rows * hq * 4, ml = self.return_max_logit and 4 * hq or 0, B = pl.B }
  g.seqlens_rows = function(n) return pl.thd and n * (pl.B + 1) * 4 or 0 end
  -- The attention backward's workspace for `rws` query rows of `h` heads
  -- (fp32 dQ, 256-aligned; a rowsum and the Hopper kernel's lse log2(e), each
  -- in rows padded to 64 a sequence: dl_attn_bwd_lse_rows), on cuda and meta.
  -- Every step's attention call has the shard's batches (bshd, sbhd) or sequences (thd).
  local nb = pl.thd and pl.B or q:size(self.layout == "sbhd" and 2 or 1)
  g.workspace = function(rws, h)
    h = h or hq
    if q.device == "cpu" then return 0 end
    return round256(rws * h * dqk * 4) + 2 * h * 4 * (math.ceil(rws / 64) * 64 + 64 * nb)
  end
  return g
end

-- {fwd =, bwd =}: peak bytes of this rank by the schedule's formula, counting
-- q, k, v (and dout, out, lse in the backward) as held by the caller.
function CP:peak(q, k, v, seq)
  return self.impl.peak(self:geometry(q, k, v, seq))
end

-- cp:memory(q_shape, k_shape, v_shape, {dtype =, seq =, unit =}) measures
-- one forward and one backward on the communicator's device with fresh
-- inputs (tag "inputs"; dout made after the forward): {fwd =, bwd =} as
-- dl.mem.report tables whose .peak counts from what was allocated before,
-- and .formula = cp:peak(...). On meta nothing runs and bytes are exact.
function CP:memory(q_shape, k_shape, v_shape, o)
  o = args.options(o, { "dtype", "seq", "unit" }, "cp:memory")
  local dev = self.comm.device
  collectgarbage("collect")
  collectgarbage("collect")
  dl.synchronize(dev)
  local base = dl.mem.stats(dev).allocated
  local function input(shape)
    local t = dl.mem.tag("inputs", dl.empty, shape, { dtype = o.dtype or "bf16", device = dev })
    if dev ~= "meta" then t:uniform_(-1, 1) end
    return t
  end
  local q, k, v = input(q_shape), input(k_shape), input(v_shape)
  local formula = self:peak(q, k, v, o.seq)
  local function measure(fn)
    dl.synchronize(dev)
    dl.mem.reset_peak(dev)
    local res = { fn() }
    dl.synchronize(dev)
    local rep = dl.mem.report { device = dev, unit = o.unit or q:nbytes() }
    rep.peak = rep.peak - base
    rep.peak_mib, rep.peak_units = rep.peak / 1048576, rep.peak / rep.unit
    return rep, res
  end
  local fwd, res = measure(function() return self:forward(q, k, v, o.seq) end)
  local dout = input(res[1].shape)
  local bwd, grads = measure(function() return self:backward(dout) end)
  plan.free(q, k, v, dout, res[1], res[2], res[3], grads[1], grads[2], grads[3])
  return { fwd = fwd, bwd = bwd, formula = formula }
end

-- ---- shard / unshard ------------------------------------------------------------

local function shard_plan(op, x, opts, full)
  if not dl.is_tensor(x) then fail("%s: expected a tensor", op) end
  opts = args.options(opts, { "comm", "layout", "cu_seqlens_padded", "dim" }, op)
  local comm = opts.comm or dl.comm.world()
  local layout = opts.layout or "bshd"
  if layout ~= "bshd" and layout ~= "sbhd" and layout ~= "thd" then
    fail("%s: layout %s is not bshd, sbhd or thd", op, tostring(layout))
  end
  local seq
  if layout == "thd" then
    if opts.cu_seqlens_padded == nil then fail("%s: layout thd needs cu_seqlens_padded (of the full sequence)", op) end
    seq = { cu_seqlens_q = opts.cu_seqlens_padded, cu_seqlens_q_padded = opts.cu_seqlens_padded }
  end
  local pl = plan.new { C = comm.size, r = comm.rank, layout = layout, x = x, seq = seq, full = full, dim = opts.dim }
  return pl, opts.dim or pl.sdim, comm
end

-- This rank's shard (a new tensor): chunks r and 2C-1-r of every sequence.
-- dim: the sequence dim when it is not the layout's (an lse: 3, thd 2).
function M.shard(x, opts)
  local pl, d = shard_plan("cp.shard", x, opts, true)
  local shape = x.shape
  shape[d] = shape[d] / pl.C
  local out = dl.empty(shape, { dtype = x.dtype, device = x.device })
  pl:copy_pieces(pl.r, out, x, d, false)
  return out
end

-- The full tensor in sequence order from every rank's shard (collective).
function M.unshard(x, opts)
  local pl, d, comm = shard_plan("cp.unshard", x, opts, false)
  local shape = x.shape
  local ranked = dl.empty({ pl.C, unpack(shape) }, { dtype = x.dtype, device = x.device })
  local src = x:contiguous()
  comm:all_gather(ranked, src)
  if src ~= x then src:free() end
  shape[d] = shape[d] * pl.C
  local full = dl.empty(shape, { dtype = x.dtype, device = x.device })
  pl:reorder(ranked, full, d, true)
  ranked:free()
  return full
end

return M
