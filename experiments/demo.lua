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
-- It ends by naming the pages of docs/ that go further. Parts 2 and 3 time
-- their op and then check it as every bench does (distlab.bench.verify):
-- once more on fresh inputs, against a reference; --plant noop|scale=X puts
-- an error into the timed ops, which the checks must report (exit code 1),
-- --quick makes part 1 count C = 2 and 4 only and part 3 smaller.
local dl = require "distlab"
local verify = require "distlab.bench.verify"

local w = dl.comm.world()
local N, me = w.size, w.rank
-- --quick, --plant (the harness's options; the demo writes no files)
local h = dl.bench.harness { name = "demo", comm = w, writes = false,
  usage = "./distlab demo [options]  (or ./distlab run -n N --device D experiments/demo.lua [options])",
  about = "the main job in one run: CP memory per strategy, CP attention and an all-reduce, each checked" }
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
local Cs = h.quick and { 2, 4 } or { 2, 4, 8, 16, 32, 64 }

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

-- Ring attention with the fused merge, causal, on the whole world: timed on
-- one draw of q, k, v and dout (the same on every rank: fixed seeds), then
-- run once more on a fresh draw and checked against dl.attn on the
-- unsharded sequence on one rank: normwise within 1e-2 (bf16, unit roundoff
-- 2^-8 = 3.9e-3; attention adds a few roundings), each element within 2^-5
-- (|ref| + rms(ref)), the bias <got - ref, ref> / <ref, ref> within 2^-10
-- (rounding has none; a 1% scale error is 1e-2).
do
  local Bq, Sq, Hq, Dq = 1, 64 * N, 4, 64
  local dtype = "bf16"
  local function rnd(seed) return dl.randn(Bq, Sq, Hq, Dq, { dtype = "f32", seed = seed, device = dev }):to(dtype) end
  local opts = { layout = "bshd", mask = "causal" }
  local cp = dl.cp.attention { comm = w, algo = "p2p", comm_buffers = 2, correction = "fused",
    layout = "bshd", mask = "causal" }
  local function shard(x) return dl.cp.shard(x, { comm = w, layout = "bshd" }) end
  -- this rank's shards of q, k, v, dout (seeds first .. first + 3), and the one-rank reference's
  local cur = {}
  local function draw(first)
    local q, k, v, dout = rnd(first), rnd(first + 1), rnd(first + 2), rnd(first + 3)
    cur.q, cur.k, cur.v, cur.dout = shard(q), shard(k), shard(v), shard(dout)
    cur.full = { q = q, k = k, v = v, dout = dout }
  end
  local fwd = h:planted(function() return cp:forward(cur.q, cur.k, cur.v) end, { returns = true })
  local bwd = h:planted(function() return cp:backward(cur.dout) end, { returns = true })
  draw(11)
  dl.synchronize(dev)
  dl.mem.reset_peak(dev)
  local base = dl.mem.stats(dev).allocated
  local t0 = dl.now_us()
  fwd()
  bwd()
  dl.synchronize(dev)
  local ms = (dl.now_us() - t0) * 1e-3
  local peak = dl.mem.stats(dev).allocated_peak - base
  local tol = { norm = 1e-2, bias = 2 ^ -10, rtol = 2 ^ -5, atol_rms = 2 ^ -5 }
  local errs, biases = {}, {}
  h:verify { what = "ring attention",
    fresh = function() draw(21) end,
    run = function()
      local o = fwd()
      return o, bwd()
    end,
    check = function(o, gq, gk, gv)
      local f = cur.full
      local out, lse = dl.attn.fwd(f.q, f.k, f.v, opts)
      local dq, dk, dv = dl.attn.bwd(f.dout, f.q, f.k, f.v, out, lse, opts)
      local bad, msgs = 0, {}
      for i, pair in ipairs({ { "out", o, out }, { "dq", gq, dq }, { "dk", gk, dk }, { "dv", gv, dv } }) do
        local nb, mb, st = verify.close(pair[2], shard(pair[3]), tol)
        errs[i], biases[i] = st.norm, math.abs(st.bias)
        if nb > 0 and bad == 0 then msgs = {} end
        if nb > 0 or bad == 0 then msgs[#msgs + 1] = pair[1] .. ": " .. mb end
        bad = bad + nb
      end
      return bad, table.concat(msgs, "; ")
    end }
  -- the worst rank's errors, time and memory
  local worst = h:max({ errs[1], errs[2], errs[3], errs[4], ms, peak, biases[1], biases[2], biases[3], biases[4] })
  local ok = true
  for i = 1, 4 do ok = ok and worst[i] <= tol.norm and worst[6 + i] <= tol.bias end
  say("\n2. Ring attention across %d ranks (p2p, 2 comm buffers, fused merge), causal, bf16,", N)
  say("   B=%d S=%d H=%d D=%d, against attention on the whole sequence on one rank:", Bq, Sq, Hq, Dq)
  say("   normwise relative error (worst rank): out %.1e, dq %.1e, dk %.1e, dv %.1e (bound %.1e): %s",
    worst[1], worst[2], worst[3], worst[4], tol.norm, ok and "ok" or "WRONG")
  say("   bias (worst rank): out %.1e, dq %.1e, dk %.1e, dv %.1e (bound %.1e)", worst[7], worst[8], worst[9],
    worst[10], tol.bias)
  say("   forward + backward %.1f ms, peak %.2f MiB above the inputs (the worst rank; %s)",
    worst[5], mib(worst[6]), dev)
end

-- ---- 3. all-reduce, algo = "auto" ------------------------------------------------------------

do
  -- rank r contributes integers in [r, r + 8): every partial sum is a small
  -- integer, exact in bf16, so the result must equal the exact sum bit for
  -- bit. Timed on one draw, checked on a fresh one (a new seed).
  local n = h.quick and 16384 or 262144
  local function ints(seed, r)
    local t, s = {}, seed
    for i = 1, n do
      s = (s * 48271) % 2147483647
      t[i] = s % 8 + r
    end
    return t
  end
  local x
  local function draw(seed)
    x = dl.from_table(ints(seed + me, me), { dtype = "bf16" }):to(dev)
  end
  draw(1)
  local algo, blocks = dl.allreduce.choose(x:nbytes(), w)
  local run = h:planted(function() return dl.allreduce.run(x:clone(), { algo = "auto" }) end, { returns = true })
  dl.synchronize(dev)
  local r = dl.bench(run, { warmup = 2, iters = 5, device = dev })
  local wrong = h:verify { what = "all-reduce",
    fresh = function() draw(1000) end, run = run,
    check = function(y)
      local sum = {}
      for i = 1, n do sum[i] = 0 end
      for rk = 0, N - 1 do
        for i, v in ipairs(ints(1000 + rk, rk)) do sum[i] = sum[i] + v end
      end
      return verify.close(y, dl.from_table(sum, { dtype = "f64" }), { atol = 0, rtol = 0 })
    end }
  say("\n3. All-reduce of %d bf16 (%.0f KiB) a rank, algo = \"auto\": the table picks %s%s;",
    n, x:nbytes() / 1024, algo, blocks and blocks > 0 and string.format(" (%d blocks)", blocks) or "")
  say("   %d of %d elements differ from the exact sum (every rank's, summed); median %.3f ms a call (with a copy)",
    wrong, n, r.median)
end

say("\nDone in %.1f s. Further: README.md (one schedule script, the folders), docs/modules.md (every", (dl.now_us() - t_start) * 1e-6)
say("call), docs/benchmarks.md (the results: CP memory and time, all-reduce sweeps, attention speed),")
say("docs/launcher.md (distlab run), docs/repl.md (distlab repl), docs/gpu.md (GPU hosts without a registry).")
h:finish()
