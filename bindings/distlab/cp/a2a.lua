-- distlab.cp.a2a — Ulysses context parallelism: an all-to-all trades the
-- sequence split for a head split, each rank attends over the whole
-- sequence with H/C heads, and an all-to-all trades back.
--
-- Forward
--   1. For q, k, v: heads split into C groups (group j for rank j), one
--      all-to-all, and the C shards received reordered to sequence order:
--      [.., S, H/C, D] (thd: the whole packed sequence, padded offsets).
--   2. One attention over the whole sequence: mask and window as given.
--   3. out and lse go back the same way (reorder to rank order, all-to-all,
--      heads joined); max_logit [H/C] is all-gathered to [H].
-- The head-split q, k, v, out, lse are kept for the backward (as in
-- TransformerEngine), which sends dout over, runs one attention backward,
-- and sends dq, dk, dv back. Heads (and K/V heads) must divide by C.
--
-- Peak memory per rank (exact on meta). Per-rank sizes U_q, U_k, U_v, U_o
-- (= U for MHA), l = B H S_r 4; the head-split copies are the same sizes;
-- inputs q, k, v counted:
--   forward   3U + max(2U_q, U_q + 2U_k, U_q + U_k + 2U_v,      q, k, v over
--                      U_q + U_k + U_v + 3U_o + l,             out back (split, sent, joined)
--                      U_q + U_k + U_v + 2U_o + 3l)            lse back
--             = 9U + l for MHA; the forward keeps 3U + U + l (head-split
--             q, k, v, out, lse) for the backward, plus out and lse.
--   backward  5U + l (q, k, v, dout, out, lse: held) + 4U + l (kept)
--             + max(2U_o, U_o + U_q + U_k + U_v + W,            dout over; attention
--                   U_k + U_v + 2U_q, U_q + U_v + 2U_k, U_q + U_k + 2U_v)   dq, dk, dv back
--             W = the attention backward's workspace over the whole sequence
--             with H/C heads, the same bytes as 2U + 2l' (p2p.lua's W); cuda and meta only.
-- Plus 4H + 4H/C bytes with return_max_logit (the gathered max and this
-- rank's), and for thd a seqlens tensor of 3 rows of (B+1) int32.
--
-- overlap = true: the heads of each rank in G = 2 groups, in a pipeline.
-- Every group's all-to-alls go on the comm stream at once; group s attends
-- on the compute stream as soon as its q, k, v have arrived, and its out,
-- lse (backward: dq, dk, dv) travel back while group s+1 attends. Heads per
-- rank (q and k/v) must be even. This rank's (out, lse) and, backward,
-- dq/dk/dv are allocated first and filled group by group (n = G):
--   forward   3U + U_o + l + max(S/n + 2U_q/n, S/n + U_q/n + 2U_k/n,
--               S/n + (U_q + U_k)/n + 2U_v/n, S + 2(U_o + l)/n + 2U_o/n,
--               S + 2(U_o + l)/n + 2l/n),   S = U_q + U_k + U_v
--   backward  5U + l + (S + U_o + l) kept + S + max(3U_o/n,
--               2U_o/n + S/n + W_n, U_o/n + (2U_q + U_k + U_v)/n,
--               U_o/n + (2U_k + U_v)/n, U_o/n + 2U_v/n)
--             W_n = the attention backward's workspace for H/(C n) heads.
local dl = require "distlab"
local plan = require "distlab.cp.plan"

local free = plan.free
local M = {}

-- x [.., H, D] -> [C, .., H/C, D], head group j at index j+1. With
-- sub-group s of G (overlap): the s-th of G equal parts of every group.
local function split_heads(x, C, tag, s, G)
  s, G = s or 1, G or 1
  local hd = x.nd - 1
  local gC = x:size(hd) / C
  local g = gC / G
  local shape = x.shape
  shape[hd] = g
  local out = dl.mem.tag(tag, dl.empty, { C, unpack(shape) }, { dtype = x.dtype, device = x.device })
  for j = 1, C do
    local dst, src = out:select(1, j), x:narrow(hd, (j - 1) * gC + (s - 1) * g + 1, g)
    dst:copy_(src)
    free(dst, src)
  end
  return out
end

-- The inverse of split_heads: [C, .., g, D] -> [.., C g, D] (hd: head dim of
-- the result), or into sub-group s of G of `into` (overlap).
local function join_heads(parts, hd, tag, into, s, G)
  s, G = s or 1, G or 1
  local C = parts:size(1)
  local shape = parts.shape
  table.remove(shape, 1)
  local g = shape[hd]
  shape[hd] = g * C
  local out = into or dl.mem.tag(tag, dl.empty, shape, { dtype = parts.dtype, device = parts.device })
  for j = 1, C do
    local dst, src = out:narrow(hd, ((j - 1) * G + s - 1) * g + 1, g), parts:select(1, j)
    dst:copy_(src)
    free(dst, src)
  end
  return out
end

-- This rank's shard x [.., S_r, H, D] -> the whole sequence with H/C heads
-- (with s, G: H/(C G), sub-group s). hd: head dim of x, d: its sequence dim.
local function to_sequence(comm, pl, x, d, s, G)
  local send = split_heads(x, pl.C, "comm_buffers", s, G)
  local recv = dl.mem.tag("comm_buffers", dl.empty_like, send)
  comm:all_to_all(recv, send)
  send:free()
  local shape = recv.shape
  table.remove(shape, 1)
  shape[d] = shape[d] * pl.C
  local seq = dl.mem.tag("comm_buffers", dl.empty, shape, { dtype = x.dtype, device = x.device })
  pl:reorder(recv, seq, d, true)
  recv:free()
  return seq
end

-- The inverse: whole sequence with H/C heads -> this rank's shard with H
-- heads (hd: head dim). consume: free xs as soon as it has been read. With
-- into, s, G: xs is sub-group s of G, written into its heads of `into`.
local function to_shard(comm, pl, xs, d, hd, tag, consume, into, s, G)
  local shape = xs.shape
  shape[d] = shape[d] / pl.C
  local send = dl.mem.tag("comm_buffers", dl.empty, { pl.C, unpack(shape) }, { dtype = xs.dtype, device = xs.device })
  pl:reorder(send, xs, d, false)
  if consume then xs:free() end
  local recv = dl.mem.tag("comm_buffers", dl.empty_like, send)
  comm:all_to_all(recv, send)
  send:free()
  local x = join_heads(recv, hd, tag, into, s, G)
  recv:free()
  return x
end

-- A gradient of the head-split x, for the attention backward to write (thd:
-- zeroed, since padding rows are never written).
local function grad(pl, x)
  local t = dl.mem.tag("accumulator", dl.empty_like, x)
  if pl.thd then t:zero_() end
  return t
end

-- overlap: G head sub-groups in a pipeline. The all-to-alls of every group
-- go on the comm stream at once; group s attends on the compute stream once
-- its q, k, v have arrived, and its out, lse travel back while group s+1
-- attends. Events (cp/init.lua): groups[s].arrived, groups[s].done, and back
-- (all groups home).
local G = 2
M.GROUPS = G
local keep = plan.keep

local function forward_overlap(cp, q, k, v, pl, ml_mine)
  local comm, comp, cs = cp.comm, dl.current_stream(), cp.streams.comm
  local ev = cp.events
  local sd, hd, lhd = pl.sdim, q.nd - 1, pl.thd and 1 or 2
  local g = q:size(-2) / pl.C / G
  -- this rank's out, lse with every head, filled group by group
  local res = pl:result(q, v, "accumulator", "accumulator")
  ev.ready:record(comp)
  plan.wait(cs, ev.ready)
  keep({ q, k, v, res.out, res.lse }, cs)
  local qs, ks, vs, outs, lses = {}, {}, {}, {}, {}
  for s = 1, G do
    dl.with_stream(cs, function()
      qs[s], ks[s], vs[s] = to_sequence(comm, pl, q, sd, s, G), to_sequence(comm, pl, k, sd, s, G),
        to_sequence(comm, pl, v, sd, s, G)
    end)
    ev.groups[s].arrived:record(cs)
    keep({ qs[s], ks[s], vs[s] }, comp)
  end
  for s = 1, G do
    plan.wait(comp, ev.groups[s].arrived)
    local o = pl:opts({ layout = pl.layout, mask = cp.causal and "causal" or "none", window = cp.window,
      scale = cp.scale, max_logit = ml_mine and pl:track(ml_mine:narrow(1, (s - 1) * g + 1, g)) }, "all", "all")
    local r = pl:result(qs[s], vs[s], "out_per_step", "lse_per_step")
    o.out, o.lse = r.out, r.lse
    dl.attn.fwd(qs[s], ks[s], vs[s], o)
    pl:drop_views()
    outs[s], lses[s] = r.out, r.lse
    ev.groups[s].done:record(comp)
    plan.wait(cs, ev.groups[s].done)
    keep({ r.out, r.lse }, cs)
    dl.with_stream(cs, function()
      to_shard(comm, pl, r.out, sd, hd, "accumulator", false, res.out, s, G)
      to_shard(comm, pl, r.lse, pl.ldim, lhd, "accumulator", false, res.lse, s, G)
    end)
  end
  ev.back:record(cs)
  plan.wait(comp, ev.back)
  local own = {}
  for s = 1, G do for _, t in ipairs({ qs[s], ks[s], vs[s], outs[s], lses[s] }) do own[#own + 1] = t end end
  cp.saved = { own = own, qs = qs, ks = ks, vs = vs, outs = outs, lses = lses }
  return res.out, res.lse
end

local function backward_overlap(cp, dout, sv)
  local pl, comm, sd = sv.pl, cp.comm, sv.pl.sdim
  local comp, cs = dl.current_stream(), cp.streams.comm
  local ev = cp.events
  local hd = dout.nd - 1
  local dq = dl.mem.tag("accumulator", dl.empty_like, sv.q)
  local dk = dl.mem.tag("accumulator", dl.empty_like, sv.k)
  local dv = dl.mem.tag("accumulator", dl.empty_like, sv.v)
  ev.ready:record(comp)
  plan.wait(cs, ev.ready)
  keep({ dout, dq, dk, dv }, cs)
  local douts = {}
  for s = 1, G do
    dl.with_stream(cs, function() douts[s] = to_sequence(comm, pl, dout, sd, s, G) end)
    ev.groups[s].arrived:record(cs)
    keep({ douts[s] }, comp)
  end
  for s = 1, G do
    plan.wait(comp, ev.groups[s].arrived)
    local o = pl:opts({ layout = pl.layout, mask = cp.causal and "causal" or "none", window = cp.window,
      scale = cp.scale }, "all", "all")
    o.dq, o.dk, o.dv = grad(pl, sv.qs[s]), grad(pl, sv.ks[s]), grad(pl, sv.vs[s])
    dl.mem.tag("workspace", dl.attn.bwd, douts[s], sv.qs[s], sv.ks[s], sv.vs[s], sv.outs[s], sv.lses[s], o)
    douts[s]:free()
    ev.groups[s].done:record(comp)
    plan.wait(cs, ev.groups[s].done)
    keep({ o.dq, o.dk, o.dv }, cs)
    dl.with_stream(cs, function()
      to_shard(comm, pl, o.dq, sd, hd, "accumulator", true, dq, s, G)
      to_shard(comm, pl, o.dk, sd, hd, "accumulator", true, dk, s, G)
      to_shard(comm, pl, o.dv, sd, hd, "accumulator", true, dv, s, G)
    end)
  end
  ev.back:record(cs)
  plan.wait(comp, ev.back)
  return dq, dk, dv
end

function M.forward(cp, q, k, v, pl)
  local C, comm = pl.C, cp.comm
  local h, hkv = q:size(-2), k:size(-2)
  if h % C ~= 0 or hkv % C ~= 0 then
    dl.fail("cp a2a: heads (q %d, k/v %d) must be divisible by the CP size %d", h, hkv, C)
  end
  local thd = pl.thd
  if thd then
    local counts, starts = {}, {}
    for b = 1, pl.B do counts[b], starts[b] = pl.L[b], pl.P[b] end
    pl:select("all", counts, starts, pl.T)
    pl:upload()
  end
  local ml, ml_mine
  if cp.return_max_logit then
    ml = dl.mem.tag("accumulator", dl.empty, { h }, { dtype = "f32", device = q.device })
    ml_mine = dl.mem.tag("accumulator", dl.full, { h / C }, -math.huge, { dtype = "f32", device = q.device })
  end
  if cp.overlap then
    if (h / C) % G ~= 0 or (hkv / C) % G ~= 0 then
      dl.fail("cp a2a overlap: heads per rank (q %d, k/v %d) must be divisible by its %d sub-groups", h / C, hkv / C, G)
    end
    local out, lse = forward_overlap(cp, q, k, v, pl, ml_mine)
    if ml then
      comm:all_gather(ml, ml_mine)
      ml_mine:free()
    end
    return out, lse, ml
  end
  -- 1. Sequence split -> head split.
  local sd = pl.sdim
  local qs, ks, vs = to_sequence(comm, pl, q, sd), to_sequence(comm, pl, k, sd), to_sequence(comm, pl, v, sd)
  -- 2. One attention over the whole sequence.
  local o = pl:opts({ layout = pl.layout, mask = cp.causal and "causal" or "none", window = cp.window,
    scale = cp.scale, max_logit = ml_mine }, "all", "all")
  local res = pl:result(qs, vs, "out_per_step", "lse_per_step")
  o.out, o.lse = res.out, res.lse
  dl.attn.fwd(qs, ks, vs, o)
  -- 3. Back to the sequence split.
  local out = to_shard(comm, pl, res.out, sd, q.nd - 1, "accumulator")
  local lse = to_shard(comm, pl, res.lse, pl.ldim, thd and 1 or 2, "accumulator")
  if ml then
    comm:all_gather(ml, ml_mine)
    ml_mine:free()
  end
  cp.saved = { own = { qs, ks, vs, res.out, res.lse }, qs = qs, ks = ks, vs = vs, outs = res.out, lses = res.lse }
  return out, lse, ml
end

function M.backward(cp, dout, sv)
  if cp.overlap then return backward_overlap(cp, dout, sv) end
  local pl, comm, sd = sv.pl, cp.comm, sv.pl.sdim
  local douts = to_sequence(comm, pl, dout, sd)
  local o = pl:opts({ layout = pl.layout, mask = cp.causal and "causal" or "none", window = cp.window,
    scale = cp.scale }, "all", "all")
  o.dq, o.dk, o.dv = grad(pl, sv.qs), grad(pl, sv.ks), grad(pl, sv.vs)
  dl.mem.tag("workspace", dl.attn.bwd, douts, sv.qs, sv.ks, sv.vs, sv.outs, sv.lses, o)
  douts:free()
  local hd = dout.nd - 1
  local dq = to_shard(comm, pl, o.dq, sd, hd, "accumulator", true)
  local dk = to_shard(comm, pl, o.dk, sd, hd, "accumulator", true)
  local dv = to_shard(comm, pl, o.dv, sd, hd, "accumulator", true)
  return dq, dk, dv
end

-- ---- the memory formula ----------------------------------------------------------

function M.peak(g)
  local Uq, Uk, Uv, Uo, l = g.Uq, g.Uk, g.Uv, g.Uo, g.l
  local ml = g.ml > 0 and g.ml + g.ml / g.C or 0
  local fixed = Uq + Uk + Uv + g.seqlens_rows(3)
  local S3 = Uq + Uk + Uv
  local kept = S3 + Uo + l
  if g.overlap then -- G head groups; (out, lse) of every head and dq/dk/dv exist from the start
    local n = G
    local fwd = fixed + ml + Uo + l + math.max(S3 / n + 2 * Uq / n, S3 / n + Uq / n + 2 * Uk / n,
      S3 / n + (Uq + Uk) / n + 2 * Uv / n, S3 + 2 * (Uo + l) / n + 2 * Uo / n, S3 + 2 * (Uo + l) / n + 2 * l / n)
    local Wg = g.workspace(g.rows * g.C, g.hq / (g.C * n))
    local bwd = fixed + g.ml + 2 * Uo + l + kept + S3 + math.max(3 * Uo / n, 2 * Uo / n + S3 / n + Wg,
      Uo / n + (2 * Uq + Uk + Uv) / n, Uo / n + (2 * Uk + Uv) / n, Uo / n + 2 * Uv / n)
    return { fwd = fwd, bwd = bwd }
  end
  local fwd = fixed + ml + math.max(2 * Uq, Uq + 2 * Uk, Uq + Uk + 2 * Uv,
    S3 + 3 * Uo + l, S3 + 2 * Uo + 3 * l)
  local W = g.workspace(g.rows * g.C, g.hq / g.C)
  local bwd = fixed + g.ml + 2 * Uo + l + kept + math.max(2 * Uo, Uo + S3 + W,
    Uk + Uv + 2 * Uq, Uq + Uv + 2 * Uk, Uq + Uk + 2 * Uv)
  return { fwd = fwd, bwd = bwd }
end

return M
