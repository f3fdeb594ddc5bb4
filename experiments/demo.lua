-- The main job in one run: `./distlab demo` (4 ranks on the cpu device, 2
-- ranks sharing a host's one GPU, or a rank a GPU: demo_plan in
-- scripts/distlab). Three results, each with its time and memory:
--   1. seed 000's table: peak forward memory of every context-parallel
--      strategy at C = 2..64, counted on the meta device from the same
--      schedule code the ranks run, beside the formulas of the schedule files
--      and the seed's own figures;
--   2. one CP forward + backward across the ranks, checked against
--      attention on the whole sequence on one rank;
--   3. one all-reduce with algo = "auto", checked exactly.
-- It ends by naming the pages of docs/ that go further.
local dl = require "distlab"

local w = dl.comm.world()
local N, me = w.size, w.rank
local dev = dl.default_device()
local t_start = dl.now_us()

-- Rank 0 prints; every rank runs the collective parts.
local function say(fmt, ...)
  if me == 0 then
    io.write(string.format(fmt, ...), "\n")
    io.flush()
  end
end
local function mib(b) return b / 2 ^ 20 end

say("distlab demo: %d rank%s on %s (%s)", N, N > 1 and "s" or "", dev, dl.build_info())
if dev:match("^cuda") then say("  GPU: %s", dl.cuda_device_name(tonumber(dev:match("%d+")))) end
if w.share > 1 then
  say("  %d ranks share each GPU through the %s communicator: a correctness mode, whose times mean nothing", w.share, w.backend)
end

-- ---- 1. seed 000's table: peak forward memory per CP strategy, C = 2..64 -------------

-- Seed 000's configuration: B=2, S=262144, H=16, D=128, bf16, causal, thd
-- (two sequences of S). One unit = one per-rank Q tensor; l = one per-rank
-- LSE (1/64 unit here). The seed's figures count a little more than the
-- schedule's own buffers (experiments/results/cp/cp-memory.md says what).
-- The named strategies (distlab.cp.presets) that take thd, with the seed's
-- own figure beside two of them.
local SEED = { main = "3C + 2 (TE main)", ["double+incremental"] = "~8 (the seed's PR)" }
local STRATEGIES = {}
for _, st in ipairs(dl.cp.presets.list) do
  if dl.cp.presets.applies(st, "thd") and not st.overlap and not st.dkv then STRATEGIES[#STRATEGIES + 1] = st end
end
local B, S, H, D = 2, 262144, 16, 128
local Cs = { 2, 4, 8, 16, 32, 64 }

if me == 0 then
  local t0 = dl.now_us()
  say("\n1. Peak forward memory per rank, units above the inputs (B=%d S=%d H=%d D=%d bf16 causal thd;", B, S, H, D)
  say("   meta device: every byte the schedule allocates, counted, nothing run; the highest of ranks 0, C/2, C-1)\n")
  local head = { string.format("%-19s", "strategy") }
  for _, C in ipairs(Cs) do head[#head + 1] = string.format("%7s", "C=" .. C) end
  say("%s   %-14s %s", table.concat(head, " "), "formula", "seed 000")
  local worst_fused = 0
  for _, st in ipairs(STRATEGIES) do
    local cells = { string.format("%-19s", st.name) }
    for _, C in ipairs(Cs) do
      local best
      if st.algo ~= "a2a" or H % C == 0 then
        for _, r in ipairs({ 0, C / 2, C - 1 }) do
          local comm = dl.comm.meta(C, r)
          local o = dl.cp.presets.options(st)
          o.comm, o.layout, o.mask = comm, "thd", "causal"
          local cp = dl.cp.attention(o)
          local shape = { B * S / C, H, D }
          local m = cp:memory(shape, shape, shape,
            { seq = { cu_seqlens_q = { 0, S, 2 * S }, cu_seqlens_q_padded = { 0, S, 2 * S } } })
          assert(m.fwd.peak == m.formula.fwd, "forward peak differs from the schedule's formula: " .. st.name)
          local inputs = 0
          for _, row in ipairs(m.fwd.rows) do if row.tag == "inputs" then inputs = row.at_peak end end
          local units = (m.fwd.peak - inputs) / m.fwd.unit
          best = math.max(best or 0, units)
          comm:free()
        end
      end
      if st.name == "fused" then worst_fused = math.max(worst_fused, best) end
      cells[#cells + 1] = best and string.format("%7.2f", best) or string.format("%7s", "-")
    end
    say("%s   %-14s %s", table.concat(cells, " "), st.units, SEED[st.name] or "")
  end
  say("\n   main grows by 3 units a rank; double+incremental (the seed's PR) and fused stay flat;")
  say("   fused (the merge in the attention kernel's epilogue) is the lowest: %.2f units at most.", worst_fused)
  say("   a2a needs H divisible by C. (%.1f s; experiments/cp/cp_memory.lua writes the full table)",
    (dl.now_us() - t0) * 1e-6)
end
w:barrier()

-- ---- 2. CP attention forward + backward across the ranks ------------------------------

-- Ring attention with the fused merge, causal, on the whole world, checked
-- against dl.attn on the unsharded sequence (same on every rank: fixed seeds).
do
  local Bq, Sq, Hq, Dq = 1, 64 * N, 4, 64
  local dtype = "bf16"
  local function rnd(seed) return dl.randn(Bq, Sq, Hq, Dq, { dtype = "f32", seed = seed, device = dev }):to(dtype) end
  local q, k, v, dout = rnd(11), rnd(12), rnd(13), rnd(14)
  local opts = { layout = "bshd", mask = "causal" }
  local out, lse = dl.attn.fwd(q, k, v, opts)
  local dq, dk, dv = dl.attn.bwd(dout, q, k, v, out, lse, opts)

  local cp = dl.cp.attention { comm = w, algo = "p2p", comm_buffers = 2, correction = "fused",
    layout = "bshd", mask = "causal" }
  local function shard(x) return dl.cp.shard(x, { comm = w, layout = "bshd" }) end
  local sq, sk, sv, sd = shard(q), shard(k), shard(v), shard(dout)
  dl.synchronize(dev)
  dl.mem.reset_peak(dev)
  local base = dl.mem.stats(dev).allocated
  local t0 = dl.now_us()
  local o = cp:forward(sq, sk, sv)
  local gq, gk, gv = cp:backward(sd)
  dl.synchronize(dev)
  local ms = (dl.now_us() - t0) * 1e-3
  local peak = dl.mem.stats(dev).allocated_peak - base
  local errs = {}
  for i, pair in ipairs({ { "out", o, shard(out) }, { "dq", gq, shard(dq) }, { "dk", gk, shard(dk) }, { "dv", gv, shard(dv) } }) do
    errs[i] = { pair[1], dl.rel_err(pair[2]:to("f32"), pair[3]:to("f32")) }
  end
  -- the worst rank's errors, time and memory
  local mine = dl.from_table({ errs[1][2], errs[2][2], errs[3][2], errs[4][2], ms, peak }, { dtype = "f64" }):to(dev)
  local all = dl.empty(N, 6, { dtype = "f64", device = dev })
  w:all_gather(all, mine)
  all = all:to("cpu"):tolist()
  local worst = { 0, 0, 0, 0, 0, 0 }
  for r = 1, N do
    for j = 1, 6 do worst[j] = math.max(worst[j], all[r][j]) end
  end
  local tol = 1e-2 -- normwise, bf16 (unit roundoff 2^-8 = 3.9e-3); attention adds a few roundings
  local ok = worst[1] < tol and worst[2] < tol and worst[3] < tol and worst[4] < tol
  say("\n2. Ring attention across %d ranks (p2p, 2 comm buffers, fused merge), causal, bf16,", N)
  say("   B=%d S=%d H=%d D=%d, against attention on the whole sequence on one rank:", Bq, Sq, Hq, Dq)
  say("   normwise relative error (worst rank): out %.1e, dq %.1e, dk %.1e, dv %.1e (bound %.1e): %s",
    worst[1], worst[2], worst[3], worst[4], tol, ok and "ok" or "WRONG")
  say("   forward + backward %.1f ms, peak %.2f MiB above the inputs (the worst rank; %s)",
    worst[5], mib(worst[6]), dev)
  if not ok then error("CP attention differs from the single-rank reference", 0) end
end

-- ---- 3. all-reduce, algo = "auto" ------------------------------------------------------------

do
  -- rank r contributes (i mod 7) + r: every partial sum is a small integer,
  -- exact in bf16, so the result must equal the formula bit for bit
  local n = 262144
  local mine, sum = {}, {}
  for i = 1, n do
    mine[i] = (i % 7) + me
    sum[i] = (i % 7) * N + N * (N - 1) / 2
  end
  local x = dl.from_table(mine, { dtype = "bf16" }):to(dev)
  local want = dl.from_table(sum, { dtype = "bf16" })
  local algo, blocks = dl.allreduce.choose(x:nbytes(), w)
  dl.synchronize(dev)
  local r = dl.bench(function() dl.allreduce.run(x:clone(), { algo = "auto" }) end,
    { warmup = 2, iters = 5, device = dev })
  local y = dl.allreduce.run(x, { algo = "auto" })
  local wrong = dl.compare(y:to("cpu"), want, 0, 0).n_not_close
  say("\n3. All-reduce of %d bf16 (%.0f KiB) a rank, algo = \"auto\": the table picks %s%s;",
    n, x:nbytes() / 1024, algo, blocks and blocks > 0 and string.format(" (%d blocks)", blocks) or "")
  say("   %d of %d elements differ from the exact sum (rank 0); median %.3f ms a call (with a copy)", wrong, n, r.median)
  if wrong > 0 then error("all-reduce result differs from the exact sum", 0) end
end

say("\nDone in %.1f s. Further: README.md (one schedule script, the folders), docs/modules.md (every", (dl.now_us() - t_start) * 1e-6)
say("call), docs/benchmarks.md (the results: CP memory and time, all-reduce sweeps, attention speed),")
say("docs/launcher.md (distlab run), docs/repl.md (distlab repl), docs/gpu.md (GPU hosts without a registry).")
