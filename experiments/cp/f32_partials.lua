-- experiments/cp/f32_partials.lua — a CP correction of one's own, written
-- outside the library: p2p ring attention whose per-step partial output
-- and running output stay in fp32, rounded to bf16 once at the end. The
-- library's "fused" and "incremental" round the running output to bf16
-- after every step (C roundings); "post_loop" rounds every partial once
-- and then the sum. Registered with dl.cp.register_correction: no library
-- file copied or edited (the contract: bindings/distlab/cp/corrections.lua).
--
--   ./distlab run -n 4 experiments/cp/f32_partials.lua [--s 64] [--mask causal] [--quick]
--
-- Each rank runs the p2p schedule with "incremental_f32" and with the
-- library's corrections on one input, and prints, per correction, the
-- normwise error of its output against the fp32 single-rank attention
-- (dl.attn.fwd with an f32 out: the step's result before any rounding);
-- the single-rank bf16 output's own error is the floor (one rounding).
-- Then the peak memory of each at CP = 8 on meta: the formula below and
-- what the allocator counted, in units of one per-rank Q. The data check
-- (h:verify; --plant noop | scale=X must fail it): incremental_f32's out at
-- the floor (within 5%; 50% on cuda, whose kernels round P to bf16) and below
-- every library correction's error, its lse and
-- gradients within TE's CP tolerance, and every formula exact. Prints
-- "f32_partials ok" per rank, or "data check failed" and exits 1.
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
  },
}
local S, B, H, D = (h.quick and 16 or h.opt.s) * C, 1, 4, 64
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
local lse_mine = dl.cp.shard(lse, { comm = w, layout = layout, dim = 3 })
local floor = dl.rel_err(shard(ref), mine32)

-- the worst rank's error of each correction's out
local err = {}
for i, name in ipairs(names) do
  local cp = dl.cp.attention { comm = w, layout = layout, mask = mask, correction = name }
  err[i] = dl.rel_err(cp:forward(shard(q), shard(k), shard(v)), mine32)
  cp:release()
end
local e = h:max({ floor, unpack(err) })
if r == 0 then
  print(string.format("p2p, %s %s, S = %d over %d ranks, bf16, h %d, d %d: normwise error of out against the fp32 "
    .. "single-rank attention (worst rank)", layout, mask, S, C, H, D))
  print(string.format("  %-22s %.3e", "single-rank bf16 out", e[1]))
  for i, name in ipairs(names) do print(string.format("  %-22s %.3e", name, e[i + 1])) end
end

-- The data check: incremental_f32's forward and backward (--plant goes into
-- what they return): out at the floor (within 5%, 50% on cuda) and below the
-- library corrections' errors, lse, dq, dk, dv within TE's CP tolerance.
local cp = dl.cp.attention { comm = w, layout = layout, mask = mask, correction = "incremental_f32" }
h:verify {
  what = "incremental_f32 forward + backward",
  fresh = function() end,
  run = h:planted(function()
    local out, l = cp:forward(shard(q), shard(k), shard(v))
    return out, l, cp:backward(shard(dout))
  end, { returns = true }),
  check = function(out, l, gq, gk, gv)
    local why, n = {}, 0
    local rel = dl.rel_err(out, mine32)
    -- on cuda each step's kernel rounds its probabilities to bf16 before P V (the flash
    -- kernels do): that error stays with fp32 partials, so there out must beat every library
    -- correction (H200, S 128 over 2 ranks: 1.2x the floor, the best of the others 1.36x)
    local worst = tostring(h.device):find("cuda") and 1.5 or 1.05
    if not (rel <= worst * e[1] and rel < math.min(e[3], e[4], e[5])) then
      n, why[#why + 1] = n + 1, string.format("out: error %.3e, floor %.3e (bound %.2fx), the library's best %.3e",
        rel, e[1], worst, math.min(e[3], e[4], e[5]))
    end
    for name, pair in pairs { lse = { l, lse_mine, 1e-3 }, dq = { gq, shard(dq), 2.5e-2 },
      dk = { gk, shard(dk), 2.5e-2 }, dv = { gv, shard(dv), 2.5e-2 } } do
      local c = dl.compare(pair[1], pair[2], pair[3], pair[3])
      if c.n_not_close > 0 then n, why[#why + 1] = n + c.n_not_close, name .. ": " .. c.n_not_close .. " beyond tolerance" end
    end
    return n, n > 0 and table.concat(why, "; ") or string.format("out error %.3e at the floor %.3e", rel, e[1])
  end,
}

-- ---- memory at CP = 8, on meta ----------------------------------------------------------

local comm = dl.comm.meta(8, 7)
if r == 0 then print("peak above the inputs at CP = 8 (rank 7), units of one per-rank Q: formula / measured") end
local misses = 0
for _, name in ipairs(names) do
  local m = dl.cp.attention { comm = comm, layout = layout, mask = mask, correction = name }:memory(
    { B, 2048, 16, 128 }, { B, 2048, 16, 128 }, { B, 2048, 16, 128 })
  local unit = m.fwd.unit
  if m.fwd.peak ~= m.formula.fwd or m.bwd.peak ~= m.formula.bwd then misses = misses + 1 end
  if r == 0 then
    print(string.format("  %-22s fwd %.2f / %.2f   bwd %.2f / %.2f", name, m.formula.fwd / unit - 3,
      m.fwd.peak / unit - 3, m.formula.bwd / unit - 3, m.bwd.peak / unit - 3))
  end
end
comm:free()
if misses > 0 then io.stderr:write(string.format("f32_partials: %d peak formulas differ from what meta measured\n", misses)) end
h:check(misses)

h:finish()
print(string.format("f32_partials ok: rank %d", r))
