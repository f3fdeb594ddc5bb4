-- experiments/cp_bench.lua — forward and forward+backward time of every
-- context-parallel strategy at CP = world size (2 GPUs), against the
-- attention of the same total work on one GPU, as overlap efficiency:
--   efficiency = T(1 GPU, whole sequence) / (C x T(CP))
-- 1.0 means the communication hides completely behind the attention and
-- the causal work is split evenly. B=1, H=16, D=128, bf16, causal, bshd;
-- S_total in {16k, 64k, 128k}. Each time is the median of dl.bench
-- (device events) and the max over ranks; the outputs are checked after
-- timing against the one-GPU attention, shard by shard.
--
--   ./distlab run -n 2 --device cuda experiments/cp_bench.lua [out_dir]
--       table on stdout; out_dir/cp-bench-<gpu>x<n>.md and .csv
--       (default experiments/results). CP_BENCH_S="16384 65536" picks
--       lengths, CP_BENCH_LAYOUT=thd the layout, CP_BENCH_ITERS the repeats.
--   ./distlab run -n 2 --device cpu experiments/cp_bench.lua   tiny lengths, a smoke test
local dl = require "distlab"

local world = dl.comm.world()
local C, r = world.size, world.rank
local gpu = world.backend == "nccl"
local B, H, D = 1, 16, 128
local layout = os.getenv("CP_BENCH_LAYOUT") or "bshd"
local lengths = {}
for s in (os.getenv("CP_BENCH_S") or (gpu and "16384 65536 131072" or "64 128")):gmatch("%d+") do
  lengths[#lengths + 1] = tonumber(s)
end
local iters = tonumber(os.getenv("CP_BENCH_ITERS") or (gpu and "10" or "2"))
local h = gpu and H or 4

local strategies = {
  { name = "main", algo = "p2p", comm_buffers = "per_step", correction = "post_loop" },
  { name = "double", algo = "p2p", comm_buffers = 2, correction = "post_loop" },
  { name = "double+incremental", algo = "p2p", comm_buffers = 2, correction = "incremental" },
  { name = "fused", algo = "p2p", comm_buffers = 2, correction = "fused" },
  { name = "fused, dkv local", algo = "p2p", comm_buffers = 2, correction = "fused", dkv = "local" },
  { name = "all_gather", algo = "all_gather" },
  { name = "all_gather, overlap", algo = "all_gather", overlap = true },
  { name = "a2a", algo = "a2a" },
  { name = "a2a, overlap", algo = "a2a", overlap = true },
}
if layout == "thd" then -- all_gather's overlap takes bshd/sbhd
  for i = #strategies, 1, -1 do if strategies[i].overlap then table.remove(strategies, i) end end
end

-- The median over iterations, max over ranks, in ms.
local function timed(fn)
  local st = dl.bench(fn, { warmup = 2, iters = iters })
  local t = dl.from_table({ st.median }, { dtype = "f64", device = gpu and nil or "cpu" })
  if gpu then t = t:to(world.device) end
  world:all_reduce(t, "max")
  return t:item()
end

local function full_inputs(S)
  local shape = layout == "thd" and { B * S, h, D } or { B, S, h, D }
  local function rnd(seed) return dl.randn(shape, { dtype = "f32", seed = seed }):to("bf16") end
  local x = { q = rnd(1), k = rnd(2), v = rnd(3), dout = rnd(4) }
  if layout == "thd" then
    local cu = {}
    for b = 0, B do cu[b + 1] = b * S end
    x.seq = { cu_seqlens_q = cu, cu_seqlens_q_padded = cu }
    local t = dl.from_table(cu, { dtype = "i32" })
    x.o = { layout = "thd", mask = "causal", cu_seqlens_q = t, cu_seqlens_kv = t, max_seqlen_q = S, max_seqlen_kv = S }
  else
    x.o = { layout = layout, mask = "causal" }
  end
  return x
end

local rows = {}
for _, S in ipairs(lengths) do
  local x = full_inputs(S)
  -- One GPU, the whole sequence: the work CP splits C ways.
  local ref = {}
  local t1f = timed(function() ref.out, ref.lse = dl.attn.fwd(x.q, x.k, x.v, x.o) end)
  local t1b = timed(function()
    local out, lse = dl.attn.fwd(x.q, x.k, x.v, x.o)
    dl.attn.bwd(x.dout, x.q, x.k, x.v, out, lse, x.o)
  end)
  ref.dq, ref.dk, ref.dv = dl.attn.bwd(x.dout, x.q, x.k, x.v, ref.out, ref.lse, x.o)
  local so = { comm = world, layout = layout, cu_seqlens_padded = x.seq and x.seq.cu_seqlens_q_padded }
  local q, k, v, dout = dl.cp.shard(x.q, so), dl.cp.shard(x.k, so), dl.cp.shard(x.v, so), dl.cp.shard(x.dout, so)
  local flops = 4 * B * h * D * S * S / 2 -- causal forward; the backward is 2.5 times that
  rows[#rows + 1] = { S = S, name = "1 GPU, whole sequence", fwd = t1f, fb = t1b, tflops = flops / t1f / 1e9 }
  for _, st in ipairs(strategies) do
    local cp = dl.cp.attention { comm = world, algo = st.algo, comm_buffers = st.comm_buffers,
      correction = st.correction, dkv = st.dkv, overlap = st.overlap, layout = layout, mask = "causal" }
    local function fwd()
      local out, lse = cp:forward(q, k, v, x.seq)
      cp:release()
      return out, lse
    end
    local tf = timed(function() fwd() end)
    local tb = timed(function()
      cp:forward(q, k, v, x.seq)
      cp:backward(dout)
    end)
    -- Data, after timing: this rank's shard of the one-GPU results.
    local out = cp:forward(q, k, v, x.seq)
    local dq, dk, dv = cp:backward(dout)
    local worst = 0
    for name, pair in pairs({ out = { ref.out, out }, dq = { ref.dq, dq }, dk = { ref.dk, dk }, dv = { ref.dv, dv } }) do
      local cmp = dl.compare(pair[2], dl.cp.shard(pair[1], so), 2.5e-2, 2.5e-2)
      worst = math.max(worst, cmp.max_abs_diff)
      if cmp.n_not_close > 0 then
        dl.fail("%s S=%d: %s differs from the one-GPU attention in %d elements (max %g)", st.name, S, name,
          tonumber(cmp.n_not_close), cmp.max_abs_diff)
      end
    end
    rows[#rows + 1] = { S = S, name = st.name, fwd = tf, fb = tb, err = worst,
      eff_f = t1f / (C * tf), eff_fb = t1b / (C * tb), tflops = flops / C / tf / 1e9 }
    if r == 0 then -- as it goes, for a run cut short
      print(string.format("S=%d %-18s fwd %9.3f ms (%5.1f%%)  fwd+bwd %9.3f ms (%5.1f%%)  one GPU %9.3f / %9.3f ms",
        S, st.name, tf, 100 * t1f / (C * tf), tb, 100 * t1b / (C * tb), t1f, t1b))
      io.stdout:flush()
    end
    collectgarbage()
  end
  collectgarbage()
end

-- ---- report ---------------------------------------------------------------------------------

local main = {}
for _, row in ipairs(rows) do if row.name == "main" then main[row.S] = row end end
local lines = {}
local function p(fmt, ...) lines[#lines + 1] = string.format(fmt, ...) end
local dev = gpu and dl.cuda_device_name(0) or "cpu"
p("CP attention time, %s x %d, B=%d H=%d D=%d bf16 causal %s, median of %d (max over ranks)", dev, C, B, h, D, layout, iters)
p("")
p("| S_total | strategy | fwd ms | fwd eff | fwd TFLOP/s/GPU | fwd+bwd ms | fwd+bwd eff | fwd+bwd vs main | max err |")
p("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for _, row in ipairs(rows) do
  local m = main[row.S]
  p("| %d | %s | %.3f | %s | %.1f | %.3f | %s | %s | %s |", row.S, row.name, row.fwd,
    row.eff_f and string.format("%.1f%%", 100 * row.eff_f) or "—", row.tflops, row.fb,
    row.eff_fb and string.format("%.1f%%", 100 * row.eff_fb) or "—",
    row.eff_fb and string.format("%+.1f%%", 100 * (row.fb / m.fb - 1)) or "—",
    row.err and string.format("%.2g", row.err) or "—")
end
if r == 0 then
  local report = table.concat(lines, "\n")
  print(report)
  local dir = arg[1] or (dl.root .. "/experiments/results")
  local tag = (dev:match("([HhAaBb]%d%d%d)") or dev):lower() .. "x" .. C
  local f = assert(io.open(string.format("%s/cp-bench-%s.md", dir, tag), "w"))
  f:write("# ", lines[1], "\n\n",
    "Efficiency = T(1 GPU, whole sequence) / (C x T(CP)): the share of the ideal C-fold\n",
    "speed-up that the schedule keeps (communication hidden, causal work balanced).\n",
    "`vs main` compares forward+backward with main (p2p, per-step buffers, post-loop merge).\n",
    "Produced by `experiments/cp_bench.lua`.\n\n", table.concat(lines, "\n", 3), "\n\n",
    "![overlap efficiency against S_total](cp-bench-", tag, ".png)\n\n",
    "(`experiments/cp_bench_plot.sh cp-bench-", tag, ".csv` draws it from the CSV.)\n")
  f:close()
  local c = assert(io.open(string.format("%s/cp-bench-%s.csv", dir, tag), "w"))
  c:write("S_total,strategy,fwd_ms,fwd_eff,fwd_bwd_ms,fwd_bwd_eff,max_err\n")
  for _, row in ipairs(rows) do
    c:write(string.format("%d,%q,%.4f,%s,%.4f,%s,%s\n", row.S, row.name, row.fwd, row.eff_f or "",
      row.fb, row.eff_fb or "", row.err or ""))
  end
  c:close()
end
world:barrier()
