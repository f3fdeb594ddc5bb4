-- distlab.cp.p2p — ring attention: context parallelism by passing K/V
-- around the ranks, forward and backward.
--
-- Rank r holds chunks r and 2C-1-r of the sequence (plan.lua). Forward
-- step i computes on the K/V of rank src = r-i, which came along the ring
-- r-1 -> r:
--   not causal        all of Q x all of KV, no mask
--   causal, src = r   all of Q x all of KV, causal (step 0, the diagonal)
--   causal, src < r   all of Q x the first half of KV (chunk src), no mask
--   causal, src > r   the second half of Q (chunk 2C-1-r) x all of KV, no mask
-- thd picks the halves through per-step cu_seqlens (plan.lua), not copies.
-- While step i computes, the K/V of step i+1 is in flight on a comm stream.
--
-- comm_buffers  "per_step": TransformerEngine's main. K/V are copied into a
--               first buffer and every step receives into a fresh one; all
--               C live until the loop ends.
--               2: double buffering (seed 000). Step 0 sends the input K/V
--               itself; KV_BUFFERS = 2 receive buffers rotate (one when C = 2).
-- correction    how the per-step (out, lse) become one (O, L): a spec
--               {start, step, finish, peak} around the one ring loop, from
--               cp/corrections.lua (the library's post_loop, incremental,
--               fused; the contract; dl.cp.register_correction for yours).
-- Backward: the K/V ring runs the other way (step i holds rank r+i's K/V,
-- received from r+1) with KV_BUFFERS buffers whatever comm_buffers says, as
-- in TE's main. The dK/dV of that K/V travel one hop behind it, to r-1;
-- after C hops they are home, complete.
-- dkv           "travel": each step adds its share straight into the
--               travelling dK/dV (accumulate_grads), so it computes only
--               once they have arrived. "local" (TE's main): each step
--               computes into a local buffer while they travel, and adds
--               when they arrive; one more buffer, the transfer hidden.
--
-- Peak memory per rank (exact on meta; cuda adds the allocator's rounding).
-- U = one per-rank Q, B*S_r*H*D*e bytes (K, V and O alike for MHA); l = one
-- per-rank LSE, B*H*S_r*4 bytes; n = min(KV_BUFFERS, C-1) and
-- m = min(SLOTS, C-1) (cp/corrections.lua), both min(2, C-1); the inputs q,
-- k, v count.
--   forward, fused        3U + comm + U + l
--   forward, incremental  3U + comm + (1 + m)(U + l)
--   forward, post_loop    3U + P + max(comm, U + l)
--     comm = 2C U (per_step) or 2n U (2). P = the per-step (out, lse), all
--     kept: C (U + l), but causal bshd/sbhd steps with src > r (C-1-r of
--     them) hold half the rows: (1 + r + (C-1-r)/2)(U + l).
--   backward  5U + l (q, k, v, dout, out, lse: held) + U (dq) + 2n U (K/V)
--     + 2 x 2U (the travelling dK/dV and the one arriving; "local" 3 x 2U,
--     with its own share; C = 1 only 2U) + W, where
--     W = 2U + 2l' is the attention backward's workspace (fp32 dQ, rounded
--     up to 256 B; a rowsum and the Hopper kernel's lse log2(e), each l' =
--     l over the rows rounded up to 64, plus 64 rows a batch or sequence),
--     taken on cuda and meta only.
-- Plus 4H bytes with return_max_logit, and for thd the seqlens tensor:
-- (2C + 5) rows causal, (2C + 3) not, of (B+1) int32. GQA scales the K/V
-- terms by h_kv/h. M.peak gives the exact bytes of any configuration.
-- Above the inputs, in units (C >= 3): main (per_step + post_loop) 3C at
-- the last rank, growing with C; double + incremental 4 + 3 = 7; fused
-- 4 + 1 = 5; each plus its LSE fractions.
local dl = require "distlab"
local plan = require "distlab.cp.plan"

local free, wait, on = plan.free, plan.wait, plan.on
local M = {}

-- K/V receive buffers that rotate through the ring: double buffering
-- (seed 000), what comm_buffers = 2 names and what the backward always uses.
local KV_BUFFERS = 2

-- n buffers that rotate over the C-1 hops of the ring: never more than C-1.
local function rotating(n, C) return math.min(n, C - 1) end

-- The rows step src computes on this rank: Q part, KV part, mask.
local function parts_of(causal, r, src)
  if not causal then return "all", "all", "none" end
  if src == r then return "all", "all", "causal" end
  if src < r then return "all", "first", "none" end
  return "second", "all", "none"
end

-- thd: the row selections of every step (before plan:upload).
local function select_rows(pl, causal)
  pl:select("q_all", pl:local_rows(pl.r, "all"))
  if causal then pl:select("q_second", pl:local_rows(pl.r, "second")) end
  for src = 0, pl.C - 1 do
    local _, kvp = parts_of(causal, pl.r, src)
    pl:select("kv" .. src, pl:local_rows(src, kvp))
  end
end

-- A K/V receive buffer: U_k + U_v (under `tag`, default comm_buffers).
local function kv_buffer(k, v, s, tag)
  local b = dl.mem.tag(tag or "comm_buffers", function() return { k = dl.empty_like(k), v = dl.empty_like(v) } end)
  b.k:record_stream(s)
  b.v:record_stream(s)
  return b
end

-- Point-to-point exchange: send `give` to one neighbour, receive `take` from
-- the other. One group per tensor: the shm backend may hand the message of
-- one receive to another when a group holds two receives from one peer.
local function exchange(comm, give, to, take, from)
  for _, x in ipairs({ "k", "v" }) do
    dl.comm.group(function()
      comm:send(give[x], to)
      comm:recv(take[x], from)
    end)
  end
end

local function step_opts(cp, pl, src, extra)
  local qp, kvp, mask = parts_of(cp.causal, pl.r, src)
  return qp, kvp, pl:opts({ layout = pl.layout, mask = mask, scale = cp.scale }, "q_" .. qp, "kv" .. src, extra)
end

-- ---- the schedule ------------------------------------------------------------------

function M.forward(cp, q, k, v, pl)
  local C, r, comm = pl.C, pl.r, cp.comm
  local nxt, prv = (r + 1) % C, (r - 1 + C) % C
  local comp, cs, ev = dl.current_stream(), cp.streams.comm, cp.events
  local correction = cp.correction_spec
  if pl.thd then
    select_rows(pl, cp.causal)
    pl:upload()
  end

  -- What the correction keeps across the steps.
  local f = { pl = pl, q = q, k = k, v = v, cp = cp, comp = comp, ms = cp.streams.merge, ev = ev }
  correction.start(f)
  -- The running max logit, 4H bytes, merged over the ranks at the end.
  local ml
  if cp.return_max_logit then
    ml = dl.mem.tag("accumulator", dl.full, { q:size(-2) }, -math.huge, { dtype = "f32", device = q.device })
  end

  -- The K/V step 0 computes on, and where the next step's arrives, U_k + U_v
  -- per buffer: "per_step" copies K/V into a first buffer and receives every
  -- step into a fresh one (C buffers by the end); 2 sends k, v themselves and
  -- receives into KV_BUFFERS buffers in turn.
  local cur, bufs, receive = { k = k, v = v }, {}
  if cp.comm_buffers == "per_step" then
    cur = kv_buffer(k, v, cs)
    cur.k:copy_(k)
    cur.v:copy_(v)
    bufs[1] = cur
    receive = function()
      bufs[#bufs + 1] = kv_buffer(k, v, cs)
      return bufs[#bufs]
    end
  else
    for j = 1, rotating(KV_BUFFERS, C) do bufs[j] = kv_buffer(k, v, cs) end
    receive = function(i) return bufs[i % #bufs + 1] end
  end

  for i = 0, C - 1 do
    local src = (r - i) % C
    -- 1. Communication: pass our K/V to r+1, receive step i+1's from r-1.
    local incoming
    if i < C - 1 then
      incoming = receive(i)
      ev.ready:record(comp) -- cur is ready; incoming's last reader (step i-1) is queued
      wait(cs, ev.ready)
      on(cs, ev.arrived, function() exchange(comm, cur, nxt, incoming, prv) end)
    end

    -- 2. Attention of step i, folded into (O, L) by the correction.
    local qp, kvp, o = step_opts(cp, pl, src, { max_logit = ml })
    correction.step(f, { i = i, src = src, part = qp, q = pl:part(q, qp), k = pl:part(cur.k, kvp),
      v = pl:part(cur.v, kvp), o = o })
    pl:drop_views()

    -- 3. Step i+1 computes on what arrived.
    if incoming then
      wait(comp, ev.arrived)
      cur = incoming
    end
  end
  for _, b in ipairs(bufs) do free(b.k, b.v) end
  local acc = correction.finish(f)
  if type(acc) ~= "table" or not (dl.is_tensor(acc.out) and dl.is_tensor(acc.lse)) then
    dl.fail("cp: correction %s: finish must return {out = O, lse = L}, got %s", cp.correction, tostring(acc))
  end
  if ml then comm:all_reduce(ml, "max") end
  return acc.out, acc.lse, ml
end

function M.backward(cp, dout, sv)
  local q, k, v, out, lse, pl = sv.q, sv.k, sv.v, sv.out, sv.lse, sv.pl
  local C, r, comm = pl.C, pl.r, cp.comm
  local nxt, prv = (r + 1) % C, (r - 1 + C) % C
  local comp, cs, ev = dl.current_stream(), cp.streams.comm, cp.events

  local dq = dl.mem.tag("accumulator", dl.zeros_like, q)
  local bufs = {}
  for j = 1, rotating(KV_BUFFERS, C) do bufs[j] = kv_buffer(k, v, cs) end
  -- The travelling dK/dV (starts at zero) and the one arriving: 2 x (U_k + U_v);
  -- "local" adds the step's own share: U_k + U_v. Gradients, as dq: charged
  -- to "accumulator" (the one that ends here is returned), not comm_buffers.
  local grad, other = kv_buffer(k, v, cs, "accumulator"), C > 1 and kv_buffer(k, v, cs, "accumulator") or nil
  local mine = cp.dkv == "local" and C > 1 and kv_buffer(k, v, cs, "accumulator") or nil
  grad.k:zero_()
  grad.v:zero_()

  local cur = { k = k, v = v }
  for i = 0, C - 1 do
    local src = (r + i) % C
    -- 1. Pass the K/V on to r-1, receive step i+1's from r+1.
    local incoming
    if i < C - 1 then
      incoming = bufs[i % #bufs + 1]
      ev.ready:record(comp)
      wait(cs, ev.ready)
      on(cs, ev.arrived, function() exchange(comm, cur, prv, incoming, nxt) end)
    end

    -- 2. This step's gradients, added into dq and into src's dK/dV: the
    --    travelling one (waiting for it), or our own share while it travels.
    local into = (mine and i > 0) and mine or grad
    if into == mine then
      mine.k:zero_()
      mine.v:zero_()
    elseif i > 0 then
      wait(comp, ev.done)
    end
    local qp, kvp, o = step_opts(cp, pl, src, { accumulate_grads = true })
    o.dq, o.dk, o.dv = pl:part(dq, qp), pl:part(into.k, kvp), pl:part(into.v, kvp)
    dl.mem.tag("workspace", dl.attn.bwd, pl:part(dout, qp), pl:part(q, qp), pl:part(cur.k, kvp),
      pl:part(cur.v, kvp), pl:part(out, qp), pl:part(lse, qp, "lse"), o)
    pl:drop_views()
    if into == mine then
      wait(comp, ev.done)
      grad.k:add_(mine.k)
      grad.v:add_(mine.v)
    end

    -- 3. The dK/dV moves one hop (to r-1); the next arrives from r+1 — after
    --    the last step, our own, complete.
    if C > 1 then
      ev.ready:record(comp)
      wait(cs, ev.ready)
      on(cs, ev.done, function() exchange(comm, grad, prv, other, nxt) end)
      grad, other = other, grad
    end
    -- 4. Step i+1 computes on the K/V that arrived.
    if incoming then
      wait(comp, ev.arrived)
      cur = incoming
    end
  end
  if C > 1 then wait(comp, ev.done) end
  for _, b in ipairs(bufs) do free(b.k, b.v) end
  for _, b in pairs({ other, mine }) do free(b.k, b.v) end
  return dq, grad.k, grad.v
end

-- ---- the memory formula ----------------------------------------------------------

-- Peak bytes per rank of forward and backward (see the top of this file).
-- g: the geometry from cp.geometry (rows, units, seqlens rows, ...).
function M.peak(g)
  local C, n, Ukv = g.C, rotating(KV_BUFFERS, g.C), g.Uk + g.Uv
  local fixed = g.Uq + Ukv + g.ml + g.seqlens_rows(g.causal and 2 * C + 5 or 2 * C + 3)
  local comm = (g.comm_buffers == "per_step" and C or n) * Ukv
  local fwd = fixed + g.correction_spec.peak(g, comm)
  local dkv = C == 1 and 1 or g.dkv == "local" and 3 or 2
  local bwd = fixed + 2 * g.Uo + g.l + g.Uq + n * Ukv + dkv * Ukv + g.workspace(g.rows)
  return { fwd = fwd, bwd = bwd }
end

return M
