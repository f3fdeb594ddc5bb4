-- spec/cp/custom_correction.lua — a correction written the way a user
-- writes one, in their own script (no library file copied or edited), run
-- in the p2p schedule. "post_loop_f32": TE's post-loop merge with every
-- step's partial (out, lse) kept in fp32 (dl.attn.fwd writes an f32 out
-- for bf16 q), merged after the loop into an output of q's dtype.
--
-- dofile'd (no arguments) it only registers the correction and returns
-- its spec (spec/cp_register_spec.lua checks its peak formula on meta).
-- Run on ranks with the argument "run": every layout and mask, with the
-- registered name and with the spec table given as correction =, against
-- the single-rank attention (dl.attn on the unsharded input): out, lse,
-- dq, dk, dv, each rank its own shard (TE's CP tolerance, 2.5e-2, and a
-- normwise bound). Prints "custom correction ok: N cases" per rank.
local dl = require "distlab"
local plan = dl.cp.plan

local correction = {
  name = "post_loop_f32",
  doc = "post_loop with fp32 partials",
  start = function(f) f.parts = {} end,
  step = function(f, st)
    -- an f32 (out, lse) for this step's rows of Q: the kernel writes its partial in fp32
    local part = f.pl:result(st.q, f.v, "out_per_step", "lse_per_step", "f32")
    part.half = st.part
    f.parts[#f.parts + 1] = part
    st.o.out, st.o.lse = part.out, part.lse
    dl.attn.fwd(st.q, st.k, st.v, st.o)
  end,
  finish = function(f)
    local acc = dl.mem.tag("accumulator", dl.attn.accumulator, f.q, f.v, { layout = f.pl.layout, dtype = f.q.dtype })
    for _, p in ipairs(f.parts) do dl.attn.merge_lse(acc.lse, p.lse, f.pl:merge_opts(p.half)) end
    for i, p in ipairs(f.parts) do
      dl.attn.merge_out(acc.out, acc.lse, p.out, p.lse,
        f.pl:merge_opts(p.half, { mode = i == 1 and "init" or "add", skip_zero_rows = f.pl.thd }))
      plan.free(p.out, p.lse)
    end
    return acc
  end,
  -- every step's f32 partial (half the rows for causal bshd/sbhd steps with
  -- src > r), then the merged output made once the K/V buffers are gone
  peak = function(g, comm)
    local part = g.Uo / g.e * 4 + g.l
    local n = g.C
    if g.causal and g.layout ~= "thd" then n = 1 + g.r + (g.C - 1 - g.r) / 2 end
    return n * part + math.max(comm, g.Uo + g.l)
  end,
}
dl.cp.register_correction("post_loop_f32", correction)

if ... ~= "run" then return correction end

local w = dl.comm.world { timeout = tonumber(os.getenv("SPEC_TIMEOUT") or "60") }
local C, r = w.size, w.rank

local function thd_seqs()
  local L = { 2 * C + 3, 0, 1, 6 * C - 1 }
  local cu, P = { 0 }, { 0 }
  for b, n in ipairs(L) do
    cu[b + 1] = cu[b] + n
    P[b + 1] = P[b] + math.max(2 * C, math.ceil(n / (2 * C)) * 2 * C)
  end
  return { cu_seqlens_q = cu, cu_seqlens_q_padded = P }
end

local function i32(t) return dl.from_table(t, { dtype = "i32" }) end

local function case(layout, mask, how)
  local seq = layout == "thd" and thd_seqs() or nil
  local S, B, h, d = 6 * C, 2, 4, 16
  local function shape()
    if layout == "thd" then return { seq.cu_seqlens_q_padded[#seq.cu_seqlens_q_padded], h, d } end
    return layout == "bshd" and { B, S, h, d } or { S, B, h, d }
  end
  local function rnd(seed) return dl.randn(shape(), { dtype = "f32", seed = seed }):bf16() end
  local q, k, v, dout = rnd(21), rnd(22), rnd(23), rnd(24)
  local o = { layout = layout, mask = mask }
  if seq then
    o.cu_seqlens_q, o.cu_seqlens_q_padded = i32(seq.cu_seqlens_q), i32(seq.cu_seqlens_q_padded)
    o.cu_seqlens_kv, o.cu_seqlens_kv_padded = o.cu_seqlens_q, o.cu_seqlens_q_padded
  end
  local out, lse = dl.attn.fwd(q, k, v, o)
  local dq, dk, dv = dl.attn.bwd(dout, q, k, v, out, lse, o)

  local so = { comm = w, layout = layout, cu_seqlens_padded = seq and seq.cu_seqlens_q_padded }
  local function shard(x, dim)
    so.dim = dim
    return dl.cp.shard(x, so)
  end
  local cp = dl.cp.attention { comm = w, layout = layout, mask = mask,
    correction = how == "table" and correction or "post_loop_f32" }
  local got = {}
  got.out, got.lse = cp:forward(shard(q), shard(k), shard(v), seq)
  got.dq, got.dk, got.dv = cp:backward(shard(dout))
  local bad = {}
  local want = { out = shard(out), lse = shard(lse, layout == "thd" and 2 or 3), dq = shard(dq), dk = shard(dk),
    dv = shard(dv) }
  for _, name in ipairs { "out", "lse", "dq", "dk", "dv" } do
    local tol = name == "lse" and 1e-3 or 2.5e-2
    local rep = dl.mismatch_report(got[name], want[name], tol, tol, 4)
    if rep then bad[#bad + 1] = name .. ": " .. rep end
    local e = dl.rel_err(got[name], want[name])
    if not (e <= (name == "lse" and 1e-5 or 1e-2)) then bad[#bad + 1] = string.format("%s: normwise error %.3g", name, e) end
  end
  if #bad > 0 then
    print(string.format("FAIL %s %s (%s) C=%d rank=%d:\n  %s", layout, mask, how, C, r, table.concat(bad, "\n  ")))
    return false
  end
  return true
end

local ok, failed = 0, 0
for _, layout in ipairs { "bshd", "sbhd", "thd" } do
  for _, mask in ipairs { "causal", "none" } do
    for _, how in ipairs { "name", "table" } do
      if case(layout, mask, how) then ok = ok + 1 else failed = failed + 1 end
    end
  end
end
w:barrier()
if failed > 0 then os.exit(1) end
print(string.format("custom correction ok: %d cases on rank %d of %d", ok, r, C))
