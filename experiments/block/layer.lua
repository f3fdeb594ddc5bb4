-- experiments/block/layer.lua — one MoE transformer block, forward and
-- backward, as one rank runs it. What crosses ranks is ops.lua's (a
-- schedule under test, the same block on one rank, or the compute alone);
-- this file is the algorithm, a stage at a time:
--
--   forward (x: this rank's T rows, bf16 [T, H])
--     qkv        all-gather x over TP under the GEMM with this rank's heads   [m, 3 hp dh]
--     attention  causal attention over the whole sequence, context-parallel  [m, hp, dh]
--     proj       GEMM of this rank's heads, reduce-scattered over TP; + x = h [T, H]
--     router     logits = h Wr (f32), p = softmax, ids = top-k of p (or a
--                routing given: a file, a Zipf draw), w = p at ids
--     shared     the shared expert, SwiGLU(h Ws13) Ws2              (2nd stream)
--     route      every rank's ids and w (a few KB), so each rank knows which
--                rows its experts get, and their order, before the dispatch
--     dispatch   h to the experts its ids name (dl.ep), rows packed  [M, H]
--     experts    per expert SwiGLU(x W13) W2 (dl.gemm.grouped)     [M, H]
--     combine    back to the tokens, sum_k w_k y_k (dl.ep)           [T, H]
--     out = h + routed + shared
--   backward (dout [T, H]) runs the stages in reverse: the shared expert's
--   gradient (2nd stream); dout to the experts unweighted (combine.bwd), there
--   dy = w dout and dL/dw = <dout, y> (a row dot), the experts' input gradient
--   back summed over a token's experts (dispatch.bwd), their weight
--   gradients (2nd stream); dL/dw to the token's rank, the router's softmax
--   gradient; dh = dout + the three; the projections' input gradients through
--   all-gather + GEMM and GEMM + reduce-scatter, CP attention's backward, and
--   their weight gradients from x and dh gathered again (2nd stream); last,
--   the gradients of weights several ranks hold summed: attention's over the
--   CP group, router's and shared expert's over all ranks (2nd stream).
--
-- o.side names the work that goes on the second stream ({shared, expert_dw,
-- wgrad, grads}; nil: one stream); it forks after what the main stream has
-- issued and joins where its result is read. Every stage is a span in
-- dl.trace ("<stage>.fwd" / ".bwd", args: iteration and bytes sent) and
-- charges what it allocates to a memory tag of its name.
--
-- Weights (this rank's; gradients in f32, same names): qkv [H, 3 hp dh]
-- (q | k | v columns of this rank's heads), o [hp dh, H], r [H, E],
-- e13 [L, H, 2F] (gate | up), e2 [L, F, H], s13 [H, 2Fs], s2 [Fs, H].
local dl = require "distlab"
local moe = require "distlab.moe"
local core = require "distlab.core"

local M = {}
local Block = {}
Block.__index = Block

-- g: the geometry (block.lua), W: this rank's weights, ops: ops.lua's, o: {side =,
-- ids = i64 [T, K] (a given routing; nil: top-k), pad = {{first, count}, ...} (thd
-- padding rows: routed nowhere)}
function M.new(g, W, ops, o)
  o = o or {}
  local b = setmetatable({ g = g, W = W, ops = ops, side = o.side or {}, ids = o.ids, pad = o.pad or {},
    iter = 0, bytes = {} }, Block)
  if next(b.side) then
    b.side_stream = dl.stream(g.device)
    b.fork, b.done = dl.event(g.device), dl.event(g.device)
  end
  return b
end

-- ---- stages and streams ------------------------------------------------------------

-- fn as a stage: a span, a memory tag; on the second stream when `group` is
-- in o.side (after all the main stream has issued; `uses`, tensors made on
-- the main stream, are kept from reuse until the second stream is done with them)
function Block:stage(name, fn, group, uses)
  local a = { iter = self.iter, bytes = self.bytes[name] }
  local run = function() return dl.mem.tag(name, dl.trace.span, name, fn, a) end
  if not (group and self.side[group] and self.side_stream) then return run() end
  self.fork:record()
  self.side_stream:wait(self.fork)
  for _, t in ipairs(uses or {}) do t:record_stream(self.side_stream) end
  return dl.with_stream(self.side_stream, run)
end

-- the main stream waits for the second; `made`, tensors the second stream made, are read here
function Block:join(made)
  if not self.side_stream then return end
  self.done:record(self.side_stream)
  core.check(core.C.dl_stream_wait_event(core.stream, self.done.ptr))
  local main = dl.current_stream()
  for _, t in ipairs(made or {}) do t:record_stream(main) end
end

local function gemm(a, b, o) return dl.gemm(a, b, o) end
local function f32_out() return { out_dtype = "f32" } end

-- head group j (0 q, 1 k, 2 v) of qkv, in attention's layout
function Block:heads(qkv, j)
  local g = self.g
  local x = qkv:narrow(2, j * g.hp * g.dh + 1, g.hp * g.dh):contiguous()
  if g.layout == "thd" then return x:view(g.m, g.hp, g.dh) end
  return x:view(1, g.m, g.hp, g.dh)
end

-- ---- forward ----------------------------------------------------------------------------

function Block:forward(x)
  local g, W, ops = self.g, self.W, self.ops
  local s = { x = x }
  self.s = s
  local qkv = self:stage("qkv.fwd", function() return ops.qkv(x, W.qkv) end)
  s.o = self:stage("attention.fwd", function()
    return ops.attn_fwd(self:heads(qkv, 0), self:heads(qkv, 1), self:heads(qkv, 2))
  end)
  qkv = nil
  s.o2 = s.o:contiguous():view(g.m, g.hp * g.dh)
  local h = self:stage("proj.fwd", function() return ops.proj(s.o2, W.o):add_(x) end)
  s.h = h

  self:stage("router.fwd", function()
    local logits = gemm(h, W.r, f32_out())
    local given = self.ids and self.ids:clone()
    for _, r in ipairs(given and self.pad or {}) do given:narrow(1, r[1], r[2]):fill_(0) end -- any expert: dL/dw is 0
    s.p, s.w, s.ids = moe.route(logits, given or g.K)
    s.ids_ep = s.ids:i32()
    for _, r in ipairs(self.pad) do s.ids_ep:narrow(1, r[1], r[2]):fill_(-1) end -- padding goes nowhere
    self.last_ids_ep = s.ids_ep -- the routing taken (block.lua's check and bytes read it)
  end)

  local ys = self:stage("shared.fwd", function()
    s.hs = gemm(h, W.s13)
    s.as = moe.swiglu(s.hs)
    return gemm(s.as, W.s2)
  end, "shared", { h })

  self:stage("route.fwd", function()
    local ids_all, w_all = ops.route_all(s.ids_ep, s.w)
    s.pl = ops.plan(ids_all, w_all)
  end)
  s.xp = self:stage("dispatch.fwd", function() return ops.dispatch(h, s.ids_ep, s.w, s.pl) end)
  local counts = s.pl.counts
  self:stage("experts.fwd", function()
    s.h13 = dl.gemm.grouped(s.xp, W.e13, counts)
    s.a = moe.swiglu(s.h13)
    s.yp = dl.gemm.grouped(s.a, W.e2, counts)
  end)
  local y = self:stage("combine.fwd", function() return ops.combine(s.yp, s.pl) end)
  self:join({ ys })
  return y:add_(h):add_(ys)
end

-- ---- backward ---------------------------------------------------------------------------

function Block:backward(dout)
  local g, W, ops, s = self.g, self.W, self.ops, self.s
  if not s then error("block: backward without a forward", 2) end
  local d = {}
  local counts = s.pl.counts

  local dh_s = self:stage("shared.bwd", function()
    d.s2 = gemm(s.as:transpose(1, 2), dout, f32_out())
    local dhs = moe.swiglu_bwd(gemm(dout, W.s2:transpose(1, 2)), s.hs)
    d.s13 = gemm(s.h:transpose(1, 2), dhs, f32_out())
    return gemm(dhs, W.s13:transpose(1, 2))
  end, "shared", { dout })

  local D = self:stage("combine.bwd", function() return ops.dispatch_grad(dout, s.ids_ep, s.pl) end)
  local dxp = self:stage("experts.bwd", function()
    s.ds = moe.rowdot(D, s.yp)                                           -- dL/dw of each row
    s.dy = D:clone():mul_(s.pl.weight:view(s.pl.M, 1):expand(s.pl.M, g.H)) -- w dout
    s.dh13 = moe.swiglu_bwd(dl.gemm.grouped_dx(s.dy, W.e2, counts), s.h13)
    return dl.gemm.grouped_dx(s.dh13, W.e13, counts)
  end)
  D = nil
  local dh_moe = self:stage("dispatch.bwd", function() return ops.combine_grad(dxp, s.pl) end)
  self:stage("experts_dw.bwd", function()
    d.e2 = dl.gemm.grouped_dw(s.a, s.dy, counts, { out_dtype = "f32" })
    d.e13 = dl.gemm.grouped_dw(s.xp, s.dh13, counts, { out_dtype = "f32" })
  end, "expert_dw", { s.a, s.dy, s.xp, s.dh13 })

  local dh_r = self:stage("router.bwd", function()
    local dw = ops.return_rows(s.ds, s.pl)
    local dlogits = moe.route_bwd(s.p, s.w, s.ids, dw):bf16()
    d.r = gemm(s.h:transpose(1, 2), dlogits, f32_out())
    return gemm(dlogits, W.r:transpose(1, 2))
  end)

  self:join({ dh_s })
  local dh = dout:clone():add_(dh_moe):add_(dh_r):add_(dh_s)
  local do2 = self:stage("proj.bwd", function() return ops.proj_bwd(dh, W.o) end)
  local side = self.side.wgrad and self.side_stream ~= nil
  self:stage("wgrad.proj", function()
    d.o = gemm(s.o2:transpose(1, 2), ops.gather_tp(dh, side), f32_out())
  end, "wgrad", { dh, s.o2 })

  local dq, dk, dv = self:stage("attention.bwd", function() return ops.attn_bwd(do2:view(unpack(s.o.shape))) end)
  local dqkv = dl.empty({ g.m, 3 * g.hp * g.dh }, { dtype = "bf16", device = g.device })
  for j, t in ipairs { dq, dk, dv } do
    dqkv:narrow(2, (j - 1) * g.hp * g.dh + 1, g.hp * g.dh):copy_(t:contiguous():view(g.m, g.hp * g.dh))
  end
  local dx = self:stage("qkv.bwd", function() return ops.qkv_bwd(dqkv, W.qkv):add_(dh) end)
  self:stage("wgrad.qkv", function()
    d.qkv = gemm(ops.gather_tp(s.x, side):transpose(1, 2), dqkv, f32_out())
  end, "wgrad", { dqkv, s.x })

  self:stage("grads.bwd", function()
    local on_side = self.side.grads and self.side_stream ~= nil
    ops.reduce({ d.qkv, d.o }, "cp", on_side)
    ops.reduce({ d.r, d.s13, d.s2 }, "world", on_side)
  end, "grads")
  self:join({ d.qkv, d.o, d.r, d.s13, d.s2, d.e13, d.e2 })
  self.s = nil
  return dx, d
end

M.Block = Block
return M
