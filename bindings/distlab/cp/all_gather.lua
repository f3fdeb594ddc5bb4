-- distlab.cp.all_gather — context parallelism by gathering K/V: every rank
-- all-gathers the whole K/V once and attends with its own two Q chunks to
-- the keys each chunk can see (TransformerEngine's AllGather CP; thd as in
-- seed 001).
--
-- Forward
--   1. all-gather K, then V (rank order) and reorder to sequence order.
--   2. Two steps, one per local Q chunk j in {r, 2C-1-r} (global index):
--      Q chunk j x K/V rows [lo, hi), written straight into chunk j's rows
--      of out/lse (no merge: a chunk sees all its keys in one step).
--        causal: hi = (j+1)c, the visible prefix; otherwise hi = S
--        window {left, right}: lo = j c - left, hi = (j+1)c + right, clipped
--      bshd/sbhd express the mask relative to the clipped range as a
--      top-left window shifted by e = j c - lo.
--      thd: Q chunk j is picked by offset (per-step cu_seqlens_q_padded into
--      the whole local Q, no slicing). Visible K/V counts are clamped to the
--      real lengths, min(L_b, (j+1)c_b) — without the clamp the kernel would
--      take padding rows as keys (seed 001's pitfall) — and the mask is the
--      bottom-right causal, exact because of that clamp; windows must be
--      {left, 0} there. out and dq are zero outside the sequences.
-- Backward
--   re-gather K/V (nothing is kept between the passes); both steps add their
--   dK/dV into full-sequence buffers, which are reordered to rank order and
--   reduce-scattered (summed) into this rank's dk, dv.
--
-- Peak memory per rank (exact on meta). Per-rank sizes U_q, U_k, U_v, U_o
-- (= U for MHA: B S_r H D e bytes), l = B H S_r 4; inputs q, k, v counted:
--   forward   3U + max(2C U_k, C U_k + 2C U_v,     gather: K whole, V gathered + reordered
--                      C (U_k + U_v) + U + l)      attention: K/V whole, out, lse
--             = (3C + 3) U for MHA: K/V cost C units each, the gather a third
--   backward  5U + l (q, k, v, dout, out, lse: held) + max(
--               2C U_k, C U_k + 2C U_v,                  the gather again
--               2C (U_k + U_v) + U + W,                  K/V, dK/dV whole, dq, workspace
--               U + C U_v + 2C U_k, U + U_k + 2C U_v)    reduce-scatter of dK, of dV
--             W = the attention backward's workspace for the Q rows of one
--             step (fp32 dQ, rowsum and lse log2(e) padded: p2p.lua's W): bshd/sbhd
--             half the rows, thd all of them; cuda and meta only.
-- Plus 4H bytes with return_max_logit, and for thd a seqlens tensor of 9
-- rows of (B+1) int32. M.peak gives the exact bytes.
--
-- overlap = true (bshd/sbhd, no window): the gathers run on the comm stream
-- while each Q chunk attends, on the compute stream, to the K/V chunks this
-- rank already holds (its diagonal block causal); once they land, to the
-- rest of its visible keys. Every piece goes into (out, lse) through the
-- kernel's fused merge: the same work in 2-5 calls per chunk instead of one.
-- The (out, lse) accumulator and, backward, dq/dK/dV exist before the
-- gathers start:
--   forward   3U + U + l + max(2C U_k, C U_k + 2C U_v)
--   backward  5U + l + max(U + C (U_k + U_v) + max(2C U_k, C U_k + 2C U_v),
--               2C (U_k + U_v) + U + W, U + C U_v + 2C U_k, U + U_k + 2C U_v)
local dl = require "distlab"
local plan = require "distlab.cp.plan"

local free = plan.free
local M = {}

-- The K/V rows [lo, hi) chunk j sees (bshd/sbhd), and the top-left window
-- that expresses the mask relative to lo.
local function kv_range(cp, j, c, S)
  local wl, wr = -1, cp.causal and 0 or -1
  if cp.window then wl, wr = cp.window[1], cp.window[2] end
  local lo = wl < 0 and 0 or math.max(0, j * c - wl)
  local hi = wr < 0 and S or math.min(S, (j + 1) * c + wr)
  local e = j * c - lo
  return lo, hi, { wl < 0 and -1 or wl - e, wr < 0 and -1 or wr + e }
end

-- thd: the selections of the two steps (Q chunk by offset, K/V clamped).
local function select_rows(cp, pl)
  local wl = cp.window and cp.window[1] or -1
  for s, part in ipairs({ "first", "second" }) do
    local j = s == 1 and pl.r or 2 * pl.C - 1 - pl.r
    pl:select("q" .. s, pl:local_rows(pl.r, part))
    local counts, starts = {}, {}
    for b = 1, pl.B do
      local c = pl.c[b]
      local hi = cp.causal and math.min(pl.L[b], (j + 1) * c) or pl.L[b]
      local lo = (cp.causal and wl >= 0) and math.max(0, j * c - wl) or 0
      counts[b], starts[b] = math.max(0, hi - lo), pl.P[b] + lo
    end
    pl:select("kv" .. s, counts, starts, pl.T)
  end
end

-- Step s (1: chunk r, 2: chunk 2C-1-r): Q part and attention options; with
-- the K/V row range for bshd/sbhd.
local function step(cp, pl, s)
  local part = s == 1 and "first" or "second"
  local base = { layout = pl.layout, scale = cp.scale, backend = pl.backend }
  if pl.thd then
    base.mask = cp.causal and "causal_bottom_right" or "none"
    if cp.window and cp.causal and cp.window[1] >= 0 then base.window = { cp.window[1], 0 } end
    return part, pl:opts(base, "q" .. s, "kv" .. s)
  end
  local j = s == 1 and pl.r or 2 * pl.C - 1 - pl.r
  local lo, hi, w = kv_range(cp, j, pl.half, pl.half * 2 * pl.C)
  if w[1] ~= -1 or w[2] ~= -1 then base.window = w end
  return part, base, lo, hi
end

-- The whole-sequence shape of a local K or V shard.
local function whole(pl, x)
  local shape = x.shape
  shape[pl.sdim] = shape[pl.sdim] * pl.C
  return shape
end

-- The whole x (K or V) in sequence order: all-gather, then reorder. C U_x,
-- with another C U_x (the gathered copy) while it is made.
local function gather(comm, pl, x)
  local src = x:contiguous()
  local ranked = dl.mem.tag("comm_buffers", dl.empty, { pl.C, unpack(x.shape) }, { dtype = x.dtype, device = x.device })
  comm:all_gather(ranked, src)
  if src ~= x then src:free() end
  local full = dl.mem.tag("comm_buffers", dl.empty, whole(pl, x), { dtype = x.dtype, device = x.device })
  pl:reorder(ranked, full, pl.sdim, true)
  ranked:free()
  return full
end

-- K/V rows [lo, hi) of a whole-sequence tensor (thd: all of it).
local function rows(pl, x, lo, hi)
  if pl.thd then return x end
  return pl:track(x:narrow(pl.sdim, lo + 1, hi - lo))
end

-- overlap: the pieces of Q chunk j (step s) — the local K/V halves it sees
-- ({part, mask}) and the runs of other chunks it sees ({lo, hi} rows of the
-- whole sequence).
local function pieces(cp, pl, s)
  local C, r, c = pl.C, pl.r, pl.half
  local j = s == 1 and r or 2 * C - 1 - r
  local locals, runs = {}, {}
  for _, h in ipairs({ { "first", r }, { "second", 2 * C - 1 - r } }) do
    if not cp.causal or h[2] < j then locals[#locals + 1] = { part = h[1], mask = "none" }
    elseif h[2] == j then locals[#locals + 1] = { part = h[1], mask = "causal" } end
  end
  local last = cp.causal and j or 2 * C - 1
  local lo
  for x = 0, last + 1 do
    local remote = x <= last and x ~= r and x ~= 2 * C - 1 - r
    if remote and not lo then lo = x end
    if not remote and lo then runs[#runs + 1] = { lo = lo * c, hi = x * c }; lo = nil end
  end
  return locals, runs
end

-- overlap: K and V gathered on the comm stream after the compute stream's
-- work so far (k, v may be made there); ev.arrived marks them done.
local function gather_async(cp, pl, k, v)
  local comp, cs, ev = dl.current_stream(), cp.streams.comm, cp.events
  ev.ready:record(comp)
  plan.wait(cs, ev.ready)
  local K, V
  dl.with_stream(cs, function()
    K = gather(cp.comm, pl, k)
    V = gather(cp.comm, pl, v)
  end)
  ev.arrived:record(cs)
  plan.keep({ k, v }, cs)
  plan.keep({ K, V }, comp)
  return K, V
end

local function forward_overlap(cp, q, k, v, pl)
  local ml
  if cp.return_max_logit then
    ml = dl.mem.tag("accumulator", dl.full, { q:size(-2) }, -math.huge, { dtype = "f32", device = q.device })
  end
  local res = dl.mem.tag("accumulator", dl.attn.accumulator, q, v, { layout = pl.layout, dtype = q.dtype })
  local K, V = gather_async(cp, pl, k, v)
  local function piece(s, kk, vv, mask)
    local part = s == 1 and "first" or "second"
    dl.attn.fwd(pl:part(q, part), kk, vv, { layout = pl.layout, mask = mask, scale = cp.scale, max_logit = ml,
      backend = pl.backend,
      accumulate = { out = pl:part(res.out, part), lse = pl:part(res.lse, part, "lse") } })
    pl:drop_views()
  end
  for s = 1, 2 do -- what this rank holds, while the gathers run
    for _, h in ipairs((pieces(cp, pl, s))) do piece(s, pl:part(k, h.part), pl:part(v, h.part), h.mask) end
  end
  plan.wait(dl.current_stream(), cp.events.arrived)
  for s = 1, 2 do
    local _, runs = pieces(cp, pl, s)
    for _, run in ipairs(runs) do piece(s, rows(pl, K, run.lo, run.hi), rows(pl, V, run.lo, run.hi), "none") end
  end
  free(K, V)
  if ml then cp.comm:all_reduce(ml, "max") end
  return res.out, res.lse, ml
end

function M.forward(cp, q, k, v, pl)
  if cp.overlap then return forward_overlap(cp, q, k, v, pl) end
  if pl.thd then
    select_rows(cp, pl)
    pl:upload()
  end
  local ml
  if cp.return_max_logit then
    ml = dl.mem.tag("accumulator", dl.full, { q:size(-2) }, -math.huge, { dtype = "f32", device = q.device })
  end
  -- 1. The whole K and V, in sequence order.
  local K = gather(cp.comm, pl, k)
  local V = gather(cp.comm, pl, v)
  -- 2. One step per local Q chunk, straight into its rows of (out, lse).
  local res = dl.mem.tag("accumulator", dl.attn.accumulator, q, v, { layout = pl.layout, dtype = q.dtype })
  for s = 1, 2 do
    local part, o, lo, hi = step(cp, pl, s)
    o.out, o.lse, o.max_logit = pl:part(res.out, part), pl:part(res.lse, part, "lse"), ml
    dl.attn.fwd(pl:part(q, part), rows(pl, K, lo, hi), rows(pl, V, lo, hi), o)
    pl:drop_views()
  end
  free(K, V)
  if ml then cp.comm:all_reduce(ml, "max") end
  return res.out, res.lse, ml
end


-- overlap: the rows of the whole sequence where local half `part` sits.
local function local_rows(pl, part)
  local j = part == "first" and pl.r or 2 * pl.C - 1 - pl.r
  return j * pl.half, (j + 1) * pl.half
end

function M.backward(cp, dout, sv)
  local q, k, v, out, lse, pl = sv.q, sv.k, sv.v, sv.out, sv.lse, sv.pl
  local K, V, dq, dK, dV
  if cp.overlap then
    -- dq, dK, dV first: the local pieces fill them while the gathers run
    dq = dl.mem.tag("accumulator", dl.zeros_like, q)
    dK = dl.mem.tag("accumulator", dl.zeros, whole(pl, k), { dtype = k.dtype, device = k.device })
    dV = dl.mem.tag("accumulator", dl.zeros, whole(pl, v), { dtype = v.dtype, device = v.device })
    K, V = gather_async(cp, pl, k, v)
    local function piece(s, kk, vv, lo, hi, mask)
      local part = s == 1 and "first" or "second"
      dl.mem.tag("workspace", dl.attn.bwd, pl:part(dout, part), pl:part(q, part), kk, vv, pl:part(out, part),
        pl:part(lse, part, "lse"), { layout = pl.layout, mask = mask, scale = cp.scale, accumulate_grads = true,
          backend = pl.backend,
          dq = pl:part(dq, part), dk = rows(pl, dK, lo, hi), dv = rows(pl, dV, lo, hi) })
      pl:drop_views()
    end
    for s = 1, 2 do
      for _, h in ipairs((pieces(cp, pl, s))) do
        local lo, hi = local_rows(pl, h.part)
        piece(s, pl:part(k, h.part), pl:part(v, h.part), lo, hi, h.mask)
      end
    end
    plan.wait(dl.current_stream(), cp.events.arrived)
    for s = 1, 2 do
      local _, runs = pieces(cp, pl, s)
      for _, run in ipairs(runs) do
        piece(s, rows(pl, K, run.lo, run.hi), rows(pl, V, run.lo, run.hi), run.lo, run.hi, "none")
      end
    end
  else
    K = gather(cp.comm, pl, k)
    V = gather(cp.comm, pl, v)
    -- dq (U), and dK/dV of the whole sequence (C U_k + C U_v), summed over the steps.
    dq = dl.mem.tag("accumulator", dl.zeros_like, q)
    dK = dl.mem.tag("accumulator", dl.zeros_like, K)
    dV = dl.mem.tag("accumulator", dl.zeros_like, V)
    for s = 1, 2 do
      local part, o, lo, hi = step(cp, pl, s)
      o.dq, o.dk, o.dv = pl:part(dq, part), rows(pl, dK, lo, hi), rows(pl, dV, lo, hi)
      o.accumulate_grads = true
      dl.mem.tag("workspace", dl.attn.bwd, pl:part(dout, part), pl:part(q, part), rows(pl, K, lo, hi),
        rows(pl, V, lo, hi), pl:part(out, part), pl:part(lse, part, "lse"), o)
      pl:drop_views()
    end
  end
  free(K, V)
  -- Every rank's share of dK/dV, summed: reorder to rank order, reduce-scatter.
  local function scatter(full, like)
    local ranked = dl.mem.tag("comm_buffers", dl.empty, { pl.C, unpack(like.shape) }, { dtype = like.dtype, device = like.device })
    pl:reorder(ranked, full, pl.sdim, false)
    full:free()
    local mine = dl.mem.tag("accumulator", dl.empty_like, like)
    cp.comm:reduce_scatter(mine, ranked, "sum")
    ranked:free()
    return mine
  end
  local dk = scatter(dK, k)
  local dv = scatter(dV, v)
  return dq, dk, dv
end

-- ---- the memory formula ----------------------------------------------------------

function M.peak(g)
  local C, Uk, Uv, Uq, Uo, l = g.C, g.Uk, g.Uv, g.Uq, g.Uo, g.l
  local fixed = Uq + Uk + Uv + g.ml + g.seqlens_rows(9)
  local gather = math.max(2 * C * Uk, C * Uk + 2 * C * Uv)
  local W = g.workspace(g.layout == "thd" and g.rows or g.rows / 2)
  local rs = math.max(Uq + C * Uv + 2 * C * Uk, Uq + Uk + 2 * C * Uv) -- the reduce-scatters of dK, dV
  if g.overlap then -- the accumulators exist before the gathers
    return { fwd = fixed + Uo + l + gather,
      bwd = fixed + 2 * Uo + l + math.max(Uq + C * (Uk + Uv) + gather, 2 * C * (Uk + Uv) + Uq + W, rs) }
  end
  local fwd = fixed + math.max(gather, C * (Uk + Uv) + Uo + l)
  local bwd = fixed + 2 * Uo + l + math.max(gather, 2 * C * (Uk + Uv) + Uq + W, rs)
  return { fwd = fwd, bwd = bwd }
end

return M
