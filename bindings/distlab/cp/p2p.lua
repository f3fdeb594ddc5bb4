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
-- correction    how the per-step (out, lse) become one (O, L): an entry of
--               CORRECTIONS below, {start, step, finish, peak}, around the
--               one ring loop. "post_loop": keep every step's (out, lse) and
--               merge after the loop (TE main). "incremental": merge each
--               step into a running (O, L) as it finishes (seed 000), on a
--               side stream, with SLOTS = 2 out/lse slots so that step i+1
--               computes while step i merges. "fused": the attention kernel
--               folds each step into (O, L) in its epilogue; no per-step
--               output ever exists.
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
-- m = min(SLOTS, C-1), both min(2, C-1); the inputs q, k, v count.
--   forward, fused        3U + comm + U + l
--   forward, incremental  3U + comm + (1 + m)(U + l)
--   forward, post_loop    3U + P + max(comm, U + l)
--     comm = 2C U (per_step) or 2n U (2). P = the per-step (out, lse), all
--     kept: C (U + l), but causal bshd/sbhd steps with src > r (C-1-r of
--     them) hold half the rows: (1 + r + (C-1-r)/2)(U + l).
--   backward  5U + l (q, k, v, dout, out, lse: held) + U (dq) + 2n U (K/V)
--     + 2 x 2U (the travelling dK/dV and the one arriving; "local" 3 x 2U,
--     with its own share; C = 1 only 2U) + W, where
--     W = 2U + l is the attention backward's workspace (fp32 dQ, rowsum;
--     the dQ part rounded up to 256 B), taken on cuda and meta only.
-- Plus 4H bytes with return_max_logit, and for thd the seqlens tensor:
-- (2C + 5) rows causal, (2C + 3) not, of (B+1) int32. GQA scales the K/V
-- terms by h_kv/h. M.peak gives the exact bytes of any configuration.
-- Above the inputs, in units (C >= 3): main (per_step + post_loop) 3C at
-- the last rank, growing with C; double + incremental 4 + 3 = 7; fused
-- 4 + 1 = 5; each plus its LSE fractions.
local dl = require "distlab"
local plan = require "distlab.cp.plan"

local free, wait = plan.free, plan.wait
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

-- A K/V receive buffer: U_k + U_v.
local function kv_buffer(k, v, s)
  local b = dl.mem.tag("comm_buffers", function() return { k = dl.empty_like(k), v = dl.empty_like(v) } end)
  b.k:record_stream(s)
  b.v:record_stream(s)
  return b
end

-- Runs fn on stream s and records ev there.
local function on(s, ev, fn)
  dl.with_stream(s, fn)
  ev:record(s)
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

-- ---- corrections ----------------------------------------------------------------
--
-- How the steps' partial (out, lse) become one (O, L). start(f) runs before
-- the loop and keeps in f what the correction needs; step(f, st) runs the
-- attention of step st.i (st.q: its rows st.part of Q; st.k, st.v; options
-- st.o) and folds it in; finish(f), after the loop and after the K/V
-- buffers are freed, returns (O, L). peak(g, comm) is the memory it adds to
-- the inputs, given comm bytes of K/V buffers (g: see M.peak). f holds the
-- forward's pl, q, v, compute and merge streams (comp, ms) and events (ev).
-- Adding an entry adds a correction: cp.attention accepts its name.

-- incremental: out/lse slots that rotate, so that step i+1 computes while
-- step i merges.
local SLOTS = 2

local function accumulator(f)
  return dl.mem.tag("accumulator", dl.attn.accumulator, f.q, f.v, { layout = f.pl.layout, dtype = f.q.dtype })
end

local function attend(st) dl.attn.fwd(st.q, st.k, st.v, st.o) end

local CORRECTIONS = {
  -- TE's main: keep every step's (out, lse), U + l each (half the rows for
  -- bshd/sbhd steps on the second half of Q), and merge them after the loop
  -- into (O, L), U + l, made once the K/V buffers are gone: L = logaddexp of
  -- every step's lse, then O = sum_i e^(L_i - L) O_i.
  post_loop = {
    start = function(f) f.parts = {} end,
    step = function(f, st)
      local part = f.pl:result(st.q, f.v, "out_per_step", "lse_per_step")
      part.half = st.part
      f.parts[#f.parts + 1] = part
      st.o.out, st.o.lse = part.out, part.lse
      attend(st)
    end,
    finish = function(f)
      local acc = accumulator(f)
      for _, p in ipairs(f.parts) do dl.attn.merge_lse(acc.lse, p.lse, f.pl:merge_opts(p.half)) end
      for i, p in ipairs(f.parts) do
        dl.attn.merge_out(acc.out, acc.lse, p.out, p.lse,
          f.pl:merge_opts(p.half, { mode = i == 1 and "init" or "add", skip_zero_rows = f.pl.thd }))
        free(p.out, p.lse)
      end
      return acc
    end,
    peak = function(g, comm)
      local P = g.C * (g.Uo + g.l)
      if g.causal and g.layout ~= "thd" then P = (1 + g.r + (g.C - 1 - g.r) / 2) * (g.Uo + g.l) end
      return P + math.max(comm, g.Uo + g.l)
    end,
  },

  -- Seed 000: the running (O, L), U + l, and SLOTS out/lse slots, U + l
  -- each; each step is merged into (O, L) as it finishes, on the merge
  -- stream, while the next computes into another slot. Step 0 covers
  -- every row: it writes (O, L) itself.
  incremental = {
    start = function(f)
      f.acc = accumulator(f)
      f.slots = {}
      for j = 1, rotating(SLOTS, f.pl.C) do
        local s = f.pl:result(f.q, f.v, "out_per_step", "lse_per_step")
        s.merged = dl.event(f.q.device):record(f.comp) -- the merge that last read the slot
        s.out:record_stream(f.ms)
        s.lse:record_stream(f.ms)
        f.slots[j] = s
      end
      if f.pl.thd then f.pl.meta_t:record_stream(f.ms) end
    end,
    step = function(f, st)
      if st.i == 0 then
        st.o.out, st.o.lse = f.acc.out, f.acc.lse
        return attend(st)
      end
      local s = f.slots[(st.i - 1) % #f.slots + 1]
      wait(f.comp, s.merged)
      st.o.out, st.o.lse = f.pl:part(s.out, st.part), f.pl:part(s.lse, st.part, "lse")
      attend(st)
      f.ev.done:record(f.comp)
      wait(f.ms, f.ev.done)
      on(f.ms, s.merged, function()
        dl.attn.merge_out(f.acc.out, f.acc.lse, s.out, s.lse,
          f.pl:merge_opts(st.part, { mode = "incremental", skip_zero_rows = f.pl.thd }))
      end)
    end,
    finish = function(f)
      for _, s in ipairs(f.slots) do
        wait(f.comp, s.merged)
        free(s.out, s.lse)
      end
      return f.acc
    end,
    peak = function(g, comm) return comm + (1 + rotating(SLOTS, g.C)) * (g.Uo + g.l) end,
  },

  -- The running (O, L), U + l: the attention kernel folds each step into it
  -- in its epilogue; no per-step output ever exists.
  fused = {
    start = function(f) f.acc = accumulator(f) end,
    step = function(f, st)
      st.o.accumulate = { out = f.pl:part(f.acc.out, st.part), lse = f.pl:part(f.acc.lse, st.part, "lse") }
      attend(st)
    end,
    finish = function(f) return f.acc end,
    peak = function(g, comm) return comm + g.Uo + g.l end,
  },
}

-- The names cp.attention accepts for `correction`.
M.corrections = {}
for name in pairs(CORRECTIONS) do M.corrections[#M.corrections + 1] = name end
table.sort(M.corrections)

-- ---- the schedule ------------------------------------------------------------------

function M.forward(cp, q, k, v, pl)
  local C, r, comm = pl.C, pl.r, cp.comm
  local nxt, prv = (r + 1) % C, (r - 1 + C) % C
  local comp, cs, ev = dl.current_stream(), cp.streams.comm, cp.events
  local correction = CORRECTIONS[cp.correction]
  if pl.thd then
    select_rows(pl, cp.causal)
    pl:upload()
  end

  -- What the correction keeps across the steps.
  local f = { pl = pl, q = q, v = v, comp = comp, ms = cp.streams.merge, ev = ev }
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
    correction.step(f, { i = i, part = qp, q = pl:part(q, qp), k = pl:part(cur.k, kvp), v = pl:part(cur.v, kvp),
      o = o })
    pl:drop_views()

    -- 3. Step i+1 computes on what arrived.
    if incoming then
      wait(comp, ev.arrived)
      cur = incoming
    end
  end
  for _, b in ipairs(bufs) do free(b.k, b.v) end
  local acc = correction.finish(f)
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
  -- "local" adds the step's own share: U_k + U_v.
  local grad, other = kv_buffer(k, v, cs), C > 1 and kv_buffer(k, v, cs) or nil
  local mine = cp.dkv == "local" and C > 1 and kv_buffer(k, v, cs) or nil
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
  local fwd = fixed + CORRECTIONS[g.correction].peak(g, comm)
  local dkv = C == 1 and 1 or g.dkv == "local" and 3 or 2
  local bwd = fixed + 2 * g.Uo + g.l + g.Uq + n * Ukv + dkv * Ukv + g.workspace(g.rows)
  return { fwd = fwd, bwd = bwd }
end

return M
