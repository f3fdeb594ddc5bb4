-- experiments/block/ops.lua — the block's communication, three ways. The
-- block (layer.lua) calls these and nothing else that crosses ranks; which
-- table it gets decides what runs:
--
--   ops.distributed(g, sch, comms)  the schedule under test: TP through
--       dl.overlap (all-gather + GEMM, GEMM + reduce-scatter; sch.ag, sch.rs,
--       transport, copy), CP through dl.cp.attention (sch.cp, correction,
--       comm_buffers, cp_overlap), EP through dl.ep.buffer (sch.ep,
--       ep_backend); a group of one rank runs the plain op instead
--   ops.single(g)                   the same block on one rank: GEMMs,
--       dl.attn over the whole sequence, and the experts' rows picked and
--       summed with index_select / index_add_ (fp64 on cpu): the reference
--   ops.compute_only(g, dist)       every transfer left out, the compute kept
--       at the shapes the distributed run had (its routing): the block's
--       compute stages alone, to set the step time against
--
-- Rows. g.T rows a rank, in the order context parallelism cuts the sequence
-- (dual chunks, cp/plan.lua) and then tensor parallelism's sequence split:
-- the TP group gathers its g.m = P T rows, a CP rank's share, for the QKV
-- GEMM. Rank = c P + t: t the TP rank (neighbours: the TP traffic is the
-- heaviest), c the CP rank; EP spans all N ranks.
--
-- Every op returns new tensors (or the op's own buffers, said where).
local dl = require "distlab"
local moe = require "distlab.moe"

local M = {}

local function gemm(a, b, o) return dl.gemm(a, b, o) end

-- Attention without communication: dl.attn over the rows g describes (the
-- whole sequence, or with local = true this rank's part of it), `times` times
-- over (compute_only: a CP rank's share of a causal attention is C times
-- the causal attention of its own rows). fwd keeps what bwd needs.
local function plain_attention(g, is_local, times)
  local o = { layout = g.layout, mask = "causal", backend = g.attn_backend }
  if g.layout == "thd" then
    local cu, cup = g.cu, g.cup
    if is_local then cu, cup = g.local_cu, g.local_cup end
    o.cu_seqlens_q = dl.from_table(cu, { dtype = "i32", device = g.device })
    o.cu_seqlens_q_padded = dl.from_table(cup, { dtype = "i32", device = g.device })
    o.cu_seqlens_kv, o.cu_seqlens_kv_padded = o.cu_seqlens_q, o.cu_seqlens_q_padded
    local mx = 0
    for i = 2, #cu do mx = math.max(mx, cu[i] - cu[i - 1]) end
    o.max_seqlen_q, o.max_seqlen_kv = mx, mx
  end
  local kept
  local function fwd(q, k, v)
    local out, lse
    for _ = 1, times or 1 do out, lse = dl.attn.fwd(q, k, v, o) end
    kept = { q, k, v, out, lse }
    return out
  end
  local function bwd(dout)
    local q, k, v, out, lse = unpack(kept)
    kept = nil
    local dq, dk, dv
    for _ = 1, times or 1 do dq, dk, dv = dl.attn.bwd(dout, q, k, v, out, lse, o) end
    return dq, dk, dv
  end
  return fwd, bwd
end

-- ---- one rank (the reference) ------------------------------------------------------------

-- The experts' side of EP on one rank: the rows of pl (moe.plan) picked from
-- x and, back, summed onto their tokens (weighted or not).
local function local_pick(x, pl) return x:index_select(1, pl.token) end
local function local_sum(g, rows, pl, weight)
  local acc = g.device == "cpu" and "f64" or "f32"
  local r = rows:to(acc)
  if weight then r = r:contiguous():mul_(pl.weight:to(acc):view(pl.M, 1):expand(pl.M, rows.shape[2])) end
  local out = dl.zeros({ g.T, rows.shape[2] }, { dtype = acc, device = g.device }):index_add_(1, pl.token, r)
  return out:bf16()
end

function M.single(g)
  local ops = { kind = "single", g = g }
  function ops.qkv(x, w) return gemm(x, w) end
  function ops.proj(o, w) return gemm(o, w) end
  function ops.proj_bwd(dh, w) return gemm(dh, w:transpose(1, 2)) end
  function ops.qkv_bwd(dqkv, w) return gemm(dqkv, w:transpose(1, 2)) end
  function ops.gather_tp(x) return x end
  ops.attn_fwd, ops.attn_bwd = plain_attention(g, false)
  function ops.route_all(ids, w) return ids, w end
  function ops.plan(ids_all, w_all) return moe.plan(ids_all, w_all, { experts = g.E }) end
  function ops.dispatch(h, ids, w, pl) return local_pick(h, pl) end
  function ops.combine(yp, pl) return local_sum(g, yp, pl, true) end
  function ops.dispatch_grad(dout, ids, pl) return local_pick(dout, pl) end
  function ops.combine_grad(dxp, pl) return local_sum(g, dxp, pl, false) end
  function ops.return_rows(ds, pl)
    local acc = g.device == "cpu" and "f64" or "f32"
    local dw = dl.zeros({ g.T * g.K }, { dtype = acc, device = g.device }):index_add_(1, pl.sel, ds:view(pl.M):to(acc))
    return dw:f32():view(g.T, g.K)
  end
  function ops.reduce() end
  function ops.bytes() return {} end
  function ops.free() end
  return ops
end

-- ---- the schedule under test ---------------------------------------------------------------

local function tp_opts(sch, comm, kind)
  local algo = sch[kind]
  local o = { comm = comm, algo = algo }
  if algo ~= "nccl_then_gemm" and algo ~= "gemm_then_nccl" then
    o.transport, o.copy = sch.transport, sch.copy
  end
  return o
end

function M.distributed(g, sch, comms)
  local ops = { kind = "distributed", g = g, sch = sch }
  local P, C, N = g.P, g.C, g.N
  local one = M.single(g) -- where a group is one rank
  local e2 = 2 -- bytes of a bf16 element

  -- TP: four ops, one for each shape (an op's buffers are made for its shapes)
  if P > 1 then
    local tp = comms.tp
    local ag_qkv = dl.overlap.ag_gemm(tp_opts(sch, tp, "ag"))
    local ag_do = dl.overlap.ag_gemm(tp_opts(sch, tp, "ag"))
    local rs_o = dl.overlap.gemm_rs(tp_opts(sch, tp, "rs"))
    local rs_dx = dl.overlap.gemm_rs(tp_opts(sch, tp, "rs"))
    ops.tp_ops = { ag_qkv, ag_do, rs_o, rs_dx }
    function ops.qkv(x, w) return ag_qkv:run(x, w) end
    function ops.proj(o, w) return rs_o:run(o, w) end
    function ops.proj_bwd(dh, w) return ag_do:run(dh, w:transpose(1, 2)) end
    function ops.qkv_bwd(dqkv, w) return rs_dx:run(dqkv, w:transpose(1, 2)) end
    -- the weight gradients' gathers (beside the chain on the second stream: their own communicator)
    function ops.gather_tp(x, side)
      local out = dl.empty({ P * x.shape[1], x.shape[2] }, { dtype = x.dtype, device = x.device })
      ;(side and comms.side.tp or tp):all_gather(out, x)
      return out
    end
  else
    ops.qkv, ops.proj, ops.proj_bwd, ops.qkv_bwd, ops.gather_tp = one.qkv, one.proj, one.proj_bwd, one.qkv_bwd,
      one.gather_tp
  end

  -- CP
  if C > 1 then
    local o = { comm = comms.cp, algo = sch.cp, layout = g.layout, mask = "causal", backend = g.attn_backend }
    if sch.cp == "p2p" then
      o.correction, o.comm_buffers = sch.correction, sch.comm_buffers
    else
      o.overlap = sch.cp_overlap
    end
    local cp = dl.cp.attention(o)
    ops.cp = cp
    local seqinfo
    if g.layout == "thd" then
      seqinfo = { cu_seqlens_q = dl.from_table(g.cu, { dtype = "i32", device = g.device }),
        cu_seqlens_q_padded = dl.from_table(g.cup, { dtype = "i32", device = g.device }) }
    end
    function ops.attn_fwd(q, k, v) return (cp:forward(q, k, v, seqinfo)) end
    function ops.attn_bwd(dout) return cp:backward(dout) end
  else
    ops.attn_fwd, ops.attn_bwd = plain_attention(g, true)
  end

  -- EP
  if N > 1 then
    local w = comms.world
    local o = { comm = w, max_tokens = g.T, hidden = g.H, experts = g.E, topk = g.K, layout = sch.ep,
      output = "expert_major" }
    if sch.ep_backend and sch.ep_backend ~= "ours" then o.backend = sch.ep_backend end
    local ep = dl.ep.buffer(o)
    ops.ep = ep
    -- the experts' outputs (and input gradients), expert-major as combine takes them: [L, N T, H]
    local y_em = dl.mem.tag("ep_y", dl.empty, { g.L, N * g.T, g.H }, { dtype = "bf16", device = g.device })
    local unit = dl.ones({ g.T, g.K }, { dtype = "f32", device = g.device })
    local handle
    function ops.route_all(ids, wts)
      local ids_all = dl.empty({ N * g.T, g.K }, { dtype = ids.dtype, device = g.device })
      local w_all = dl.empty({ N * g.T, g.K }, { dtype = "f32", device = g.device })
      w:all_gather(ids_all, ids)
      w:all_gather(w_all, wts)
      ops.last_route = { ids_all, w_all }
      return ids_all, w_all
    end
    function ops.plan(ids_all, w_all)
      return moe.plan(ids_all, w_all, { experts = g.E, first = g.rank * g.L, count = g.L })
    end
    -- the received rows packed (the block's saved activation); recv is the buffer's own
    function ops.dispatch(h, ids, wts, pl)
      local recv
      recv, handle = ep:dispatch(h, ids, wts)
      return moe.pack(recv.x, pl.counts)
    end
    function ops.combine(yp, pl)
      moe.unpack(yp, pl.counts, y_em)
      return ep:combine(y_em, handle):clone()
    end
    -- backward: dout to the experts unweighted (the weights multiply there), the
    -- input gradients back summed over a token's experts (weights 1)
    function ops.dispatch_grad(dout, ids, pl)
      local recv
      recv, handle = ep:dispatch(dout, ids, unit)
      return moe.pack(recv.x, pl.counts)
    end
    function ops.combine_grad(dxp, pl)
      moe.unpack(dxp, pl.counts, y_em)
      return ep:combine(y_em, handle):clone()
    end
    -- dLoss/dw of every row to the rank whose token it is: summed into the flat
    -- [N T K] positions, reduce-scattered (each position has one writer)
    function ops.return_rows(ds, pl)
      local full = dl.zeros({ N * g.T * g.K }, { dtype = "f32", device = g.device })
      if pl.M > 0 then full:index_add_(1, pl.sel, ds:view(pl.M)) end
      local out = dl.empty({ g.T * g.K }, { dtype = "f32", device = g.device })
      w:reduce_scatter(out, full, "sum")
      return out:view(g.T, g.K)
    end
  else
    ops.route_all, ops.dispatch, ops.combine = one.route_all, one.dispatch, one.combine
    ops.dispatch_grad, ops.combine_grad, ops.return_rows = one.dispatch_grad, one.combine_grad, one.return_rows
    ops.plan = one.plan
  end

  -- gradients of weights that several ranks hold: summed over the CP group
  -- (attention's TP shards) or all ranks (router, shared expert)
  function ops.reduce(list, group, side)
    local comm = side and comms.side[group] or comms[group]
    if not comm or comm.size == 1 then return end
    for _, t in ipairs(list) do comm:all_reduce(t, "sum") end
  end

  -- What each stage (layer.lua's names) sends to other ranks: payload bytes,
  -- analytic; the EP stages' from the routing this rank's tokens took (ids_ep).
  function ops.bytes(ids_ep)
    local T, H, m, hp, dh, K = g.T, g.H, g.m, g.hp, g.dh, g.K
    local rows = (P - 1) * T * H * e2       -- T rows to (or from) each TP peer
    local q = m * hp * dh * e2              -- one of this CP rank's Q, K, V, O
    local b = { ["qkv.fwd"] = rows, ["proj.fwd"] = rows, ["proj.bwd"] = rows, ["qkv.bwd"] = rows,
      ["wgrad.proj"] = rows, ["wgrad.qkv"] = rows,
      ["route.fwd"] = (N - 1) * T * K * 8,  -- ids and weights to every rank
      ["router.bwd"] = (N - 1) * T * K * 4 } -- dL/dw reduce-scattered
    if C > 1 then
      if sch.cp == "a2a" then
        b["attention.fwd"] = (C - 1) / C * 4 * q -- q, k, v over, out back
        b["attention.bwd"] = (C - 1) / C * 4 * q -- dout over, dq, dk, dv back
      else
        b["attention.fwd"] = (C - 1) * 2 * q     -- K, V to every other CP rank (ring or gather)
        b["attention.bwd"] = (C - 1) * 4 * q     -- K, V again, dK, dV back
      end
    end
    local attn_w = 4 * H * hp * dh * 4           -- f32 gradients: QKV and output shards
    local rep_w = (H * g.E + 3 * H * g.Fs) * 4   -- router, shared expert
    b["grads.bwd"] = 2 * (C - 1) / C * attn_w + 2 * (N - 1) / N * rep_w -- ring all-reduces
    if ids_ep and N > 1 then
      -- out: per_rank once per (token, other rank), per_expert once per (token, expert
      -- there); back (combine): once per (token, expert on another rank)
      local send, back = 0, 0
      for _, row in ipairs(ids_ep:tolist()) do
        local ranks = {}
        for _, e in ipairs(row) do
          local r = e >= 0 and math.floor(e / g.L) or g.rank
          if r ~= g.rank then
            back = back + 1
            if sch.ep ~= "per_rank" or not ranks[r] then send = send + 1 end
            ranks[r] = true
          end
        end
      end
      b["dispatch.fwd"], b["combine.bwd"] = send * H * e2, send * H * e2
      b["combine.fwd"], b["dispatch.bwd"] = back * H * e2, back * H * e2
    end
    return b
  end

  function ops.free()
    for _, op in ipairs(ops.tp_ops or {}) do op:free() end
    if ops.ep then ops.ep:free() end
  end
  return ops
end

-- ---- compute alone -------------------------------------------------------------------------

-- Transfers left out; the GEMMs at the distributed shapes (full gathered
-- rows), attention as C steps over this rank's rows (the FLOPs a CP rank
-- does for a causal mask), the experts on the rows the distributed run
-- routed here (its last route).
function M.compute_only(g, dist)
  local ops = { kind = "compute_only", g = g }
  local P, C = g.P, g.C
  local ids_all, w_all = unpack(dist.last_route or {})
  local scratch = {}
  local function full(x, rows)
    local key = rows .. "x" .. x.shape[2] .. x.dtype
    scratch[key] = scratch[key] or dl.zeros({ rows, x.shape[2] }, { dtype = x.dtype, device = x.device })
    return scratch[key]
  end
  function ops.qkv(x, w) return gemm(full(x, P * x.shape[1]), w) end
  function ops.proj(o, w) return gemm(o, w):narrow(1, 1, o.shape[1] / P):contiguous() end
  function ops.proj_bwd(dh, w) return gemm(full(dh, P * dh.shape[1]), w:transpose(1, 2)) end
  function ops.qkv_bwd(dqkv, w) return gemm(dqkv, w:transpose(1, 2)):narrow(1, 1, dqkv.shape[1] / P):contiguous() end
  function ops.gather_tp(x) return full(x, P * x.shape[1]) end
  ops.attn_fwd, ops.attn_bwd = plain_attention(g, true, C)
  function ops.route_all(ids, w)
    if ids_all then return ids_all, w_all end
    return ids, w
  end
  function ops.plan(ia, wa)
    if ids_all then return moe.plan(ia, wa, { experts = g.E, first = g.rank * g.L, count = g.L }) end
    return moe.plan(ia, wa, { experts = g.E })
  end
  local function rows(x, pl)
    if pl.M == 0 then return dl.empty({ 0, x.shape[2] }, { dtype = x.dtype, device = x.device }) end
    return full(x, pl.M)
  end
  function ops.dispatch(h, ids, w, pl) return rows(h, pl) end
  function ops.dispatch_grad(d, ids, pl) return rows(d, pl) end
  function ops.combine(yp) return full(yp, g.T):clone() end
  function ops.combine_grad(dxp) return full(dxp, g.T):clone() end
  function ops.return_rows() return dl.zeros({ g.T, g.K }, { dtype = "f32", device = g.device }) end
  function ops.reduce() end
  function ops.bytes() return {} end
  function ops.free() end
  return ops
end

return M
