-- experiments/cp/f32_partials.lua — a CP correction of one's own, written
-- outside the library: p2p ring attention whose per-step partial output
-- and running output stay in fp32, rounded to bf16 once at the end. The
-- library's "fused" and "incremental" round the running output to bf16
-- after every step (C roundings); "post_loop" rounds every partial once
-- and then the sum. Registered with dl.cp.register_correction: no library
-- file copied or edited (the contract: bindings/distlab/cp/corrections.lua).
--
--   ./distlab run -n 4 experiments/cp/f32_partials.lua [--s 64] [--mask causal] [--check]
--
-- Each rank runs the p2p schedule with "incremental_f32" and with the
-- library's corrections on one input, and prints, per correction, the
-- normwise error of its output against the fp32 single-rank attention
-- (dl.attn.fwd with an f32 out: the step's result before any rounding);
-- the single-rank bf16 output's own error is the floor (one rounding).
-- Then the peak memory of each at CP = 8 on meta: the formula below and
-- what the allocator counted, in units of one per-rank Q. --check exits 1
-- unless incremental_f32 is at the floor (within 5%), below incremental's
-- error, its gradients within TE's CP tolerance, and its formula exact;
-- it prints "f32_partials ok" per rank.
--
-- Memory: the running (O, L) in fp32 and one fp32 slot, 2 (U32 + l), with
-- U32 = U / e * 4 (g.e: q's element size); the output O of q's dtype is
-- made after the loop, from the fp32 one: peak max(comm + 2 (U32 + l),
-- U32 + l + U) above the inputs. At bf16 that is 4U + 2l beside fused's U + l.
local dl = require "distlab"

local correction = {
  name = "incremental_f32",
  doc = "incremental merge, partials and the running output in fp32",
  start = function(f)
    f.acc = dl.mem.tag("accumulator", dl.attn.accumulator, f.q, f.v, { layout = f.pl.layout, dtype = "f32" })
    f.slot = f.pl:result(f.q, f.v, "out_per_step", "lse_per_step", "f32")
  end,
  step = function(f, st)
    -- the step's rows of the slot: the kernel writes its partial there in fp32
    st.o.out, st.o.lse = f.pl:part(f.slot.out, st.part), f.pl:part(f.slot.lse, st.part, "lse")
    dl.attn.fwd(st.q, st.k, st.v, st.o)
    dl.attn.merge_out(f.acc.out, f.acc.lse, f.slot.out, f.slot.lse,
      f.pl:merge_opts(st.part, { mode = "incremental", skip_zero_rows = f.pl.thd }))
  end,
  finish = function(f)
    dl.cp.free(f.slot.out, f.slot.lse)
    local out = dl.mem.tag("accumulator", dl.empty_like, f.acc.out, { dtype = f.q.dtype })
    out:copy_(f.acc.out)
    dl.cp.free(f.acc.out)
    return { out = out, lse = f.acc.lse }
  end,
  peak = function(g, comm)
    local u32 = g.Uo / g.e * 4
    return math.max(comm + 2 * (u32 + g.l), u32 + g.l + g.Uo)
  end,
}
dl.cp.register_correction("incremental_f32", correction)

local w = dl.comm.world()
local C, r = w.size, w.rank
local h = dl.bench.harness {
  name = "f32_partials", family = "cp", comm = w,
  usage = "./distlab run -n 4 experiments/cp/f32_partials.lua [options]",
  about = "a correction of one's own (fp32 partials and running output) against the library's; see the header",
  options = {
    { "s", "int", 64, "sequence positions per rank (the full length is s x C)" },
    { "mask", "choice", "causal", "attention mask", values = { "causal", "none" } },
    { "check", "flag", nil, "exit 1 unless incremental_f32 is at the rounding floor and its formula exact" },
  },
}
local S, B, H, D = h.opt.s * C, 1, 4, 64
local layout, mask = "bshd", h.opt.mask
local names = { "incremental_f32", "fused", "incremental", "post_loop" }

-- ---- accuracy against the fp32 single-rank attention --------------------------------

local function rnd(seed) return dl.randn({ B, S, H, D }, { dtype = "f32", seed = seed }):bf16() end
local q, k, v, dout = rnd(1), rnd(2), rnd(3), rnd(4)
local o = { layout = layout, mask = mask }
local ref32 = dl.attn.fwd(q, k, v, { layout = layout, mask = mask, out = dl.empty({ B, S, H, D }, "f32") })
local ref, lse = dl.attn.fwd(q, k, v, o)
local dq, dk, dv = dl.attn.bwd(dout, q, k, v, ref, lse, o)
local function shard(x) return dl.cp.shard(x, { comm = w, layout = layout }) end
local mine32 = shard(ref32)
local floor = dl.rel_err(shard(ref), mine32)

local err, grads_ok = {}, true
for _, name in ipairs(names) do
  local cp = dl.cp.attention { comm = w, layout = layout, mask = mask, correction = name }
  local out = cp:forward(shard(q), shard(k), shard(v))
  err[name] = dl.rel_err(out, mine32)
  if name == "incremental_f32" then
    local g = { cp:backward(shard(dout)) }
    for i, want in ipairs { dq, dk, dv } do
      grads_ok = grads_ok and dl.mismatch_report(g[i], shard(want), 2.5e-2, 2.5e-2) == nil
    end
  end
end
-- the worst rank's errors
local t = dl.from_table({ floor, err.incremental_f32, err.fused, err.incremental, err.post_loop }, { dtype = "f64" })
w:all_reduce(t, "max")
local e = t:tolist()
if r == 0 then
  print(string.format("p2p, %s %s, S = %d over %d ranks, bf16, h %d, d %d: normwise error of out against the fp32 "
    .. "single-rank attention (worst rank)", layout, mask, S, C, H, D))
  print(string.format("  %-22s %.3e", "single-rank bf16 out", e[1]))
  for i, name in ipairs(names) do print(string.format("  %-22s %.3e", name, e[i + 1])) end
end

-- ---- memory at CP = 8, on meta ----------------------------------------------------------

local formula_ok = true
do
  local comm = dl.comm.meta(8, 7)
  if r == 0 then print("peak above the inputs at CP = 8 (rank 7), units of one per-rank Q: formula / measured") end
  for _, name in ipairs(names) do
    local m = dl.cp.attention { comm = comm, layout = layout, mask = mask, correction = name }:memory(
      { B, 2048, 16, 128 }, { B, 2048, 16, 128 }, { B, 2048, 16, 128 })
    local unit = m.fwd.unit
    formula_ok = formula_ok and m.fwd.peak == m.formula.fwd
    if r == 0 then
      print(string.format("  %-22s fwd %.2f / %.2f   bwd %.2f / %.2f", name, m.formula.fwd / unit - 3,
        m.fwd.peak / unit - 3, m.formula.bwd / unit - 3, m.bwd.peak / unit - 3))
    end
  end
  comm:free()
end

if h.opt.check then
  local why = {}
  if not (e[2] <= 1.05 * e[1]) then why[#why + 1] = string.format("error %.3e above the floor %.3e", e[2], e[1]) end
  if not (e[2] < e[4]) then why[#why + 1] = string.format("error %.3e not below incremental's %.3e", e[2], e[4]) end
  if not grads_ok then why[#why + 1] = "gradients beyond 2.5e-2" end
  if not formula_ok then why[#why + 1] = "the peak formula differs from the measured peak" end
  if #why > 0 then
    print("f32_partials FAIL on rank " .. r .. ": " .. table.concat(why, "; "))
    os.exit(1)
  end
  print(string.format("f32_partials ok: rank %d", r))
end
