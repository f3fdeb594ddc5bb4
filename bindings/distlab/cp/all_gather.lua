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
--             step (fp32 dQ + rowsum): bshd/sbhd half the rows (U + l/2),
--             thd all of them (2U + l); cuda and meta only.
-- Plus 4H bytes with return_max_logit, and for thd a seqlens tensor of 9
-- rows of (B+1) int32. M.peak gives the exact bytes.
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
  local base = { layout = pl.layout, scale = cp.scale }
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

-- The whole x (K or V) in sequence order: all-gather, then reorder. C U_x,
-- with another C U_x (the gathered copy) while it is made.
local function gather(comm, pl, x)
  local src = x:contiguous()
  local ranked = dl.mem.tag("comm_buffers", dl.empty, { pl.C, unpack(x.shape) }, { dtype = x.dtype, device = x.device })
  comm:all_gather(ranked, src)
  if src ~= x then src:free() end
  local shape = x.shape
  shape[pl.sdim] = shape[pl.sdim] * pl.C
  local full = dl.mem.tag("comm_buffers", dl.empty, shape, { dtype = x.dtype, device = x.device })
  pl:reorder(ranked, full, pl.sdim, true)
  ranked:free()
  return full
end

-- K/V rows [lo, hi) of a whole-sequence tensor (thd: all of it).
local function rows(pl, x, lo, hi)
  if pl.thd then return x end
  return pl:track(x:narrow(pl.sdim, lo + 1, hi - lo))
end

function M.forward(cp, q, k, v, pl)
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

function M.backward(cp, dout, sv)
  local q, k, v, out, lse, pl = sv.q, sv.k, sv.v, sv.out, sv.lse, sv.pl
  local K = gather(cp.comm, pl, k)
  local V = gather(cp.comm, pl, v)
  -- dq (U), and dK/dV of the whole sequence (C U_k + C U_v), summed over the steps.
  local dq = dl.mem.tag("accumulator", dl.zeros_like, q)
  local dK = dl.mem.tag("accumulator", dl.zeros_like, K)
  local dV = dl.mem.tag("accumulator", dl.zeros_like, V)
  for s = 1, 2 do
    local part, o, lo, hi = step(cp, pl, s)
    o.dq, o.dk, o.dv = pl:part(dq, part), rows(pl, dK, lo, hi), rows(pl, dV, lo, hi)
    o.accumulate_grads = true
    dl.mem.tag("workspace", dl.attn.bwd, pl:part(dout, part), pl:part(q, part), rows(pl, K, lo, hi),
      rows(pl, V, lo, hi), pl:part(out, part), pl:part(lse, part, "lse"), o)
    pl:drop_views()
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
  local fwd = fixed + math.max(gather, C * (Uk + Uv) + Uo + l)
  local W = g.workspace(g.layout == "thd" and g.rows or g.rows / 2)
  local bwd = fixed + 2 * Uo + l + math.max(gather, 2 * C * (Uk + Uv) + Uq + W,
    Uq + C * Uv + 2 * C * Uk, Uq + Uk + 2 * C * Uv)
  return { fwd = fwd, bwd = bwd }
end

return M
