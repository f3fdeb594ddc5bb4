-- experiments/cp/cp_bench.lua — forward and forward+backward time of every
-- context-parallel strategy (distlab.cp.presets) at CP = world size (2
-- GPUs), against the attention of the same total work on one GPU, as
-- overlap efficiency:
--   efficiency = T(1 GPU, whole sequence) / (C x T(CP))
-- 1.0 means the communication hides completely behind the attention and
-- the causal work is split evenly. B=1, H=16, D=128, bf16, causal, bshd;
-- S_total in {16k, 64k, 128k}. Each time is the median of
-- dl.bench.timing.events (2 warm-up calls, device events) and the max over
-- ranks; the outputs and gradients are checked after timing against the
-- one-GPU attention, shard by shard (#wrong: elements not close, over all
-- ranks; any makes the exit code non-zero). --backends ours,cudnn times
-- every strategy on each attention backend against one GPU on the same
-- backend; the fused correction lives in our kernel's epilogue, so with
-- cudnn those strategies are left out (the table says so).
--
--   ./distlab run -n 2 --device cuda experiments/cp/cp_bench.lua [options]
--       table on stdout; DIR/cp-bench-<gpu>x<n>.md and .csv (--out DIR,
--       default experiments/results/cp); --s 16384,65536 picks lengths,
--       --layout thd the layout (strategies that do not take it are left
--       out), --iters the repeats, --plot draws the PNG (gnuplot).
--   ./distlab run -n 2 --device cpu experiments/cp/cp_bench.lua   tiny lengths, a smoke test
local dl = require "distlab"
local bench = dl.bench
local presets = require "distlab.cp.presets"

local world = dl.comm.world()
local C = world.size
local gpu = world.device:match("^cuda") ~= nil
local B, H, D = 1, 16, 128

local h = bench.harness {
  name = "cp_bench", family = "cp", comm = world, tag = true,
  usage = "./distlab run -n 2 --device cuda experiments/cp/cp_bench.lua [options]",
  about = "time and overlap efficiency of every CP strategy against one GPU; see the file's header",
  options = {
    { "s", "sizes", gpu and "16384,65536,131072" or "64,128", "total sequence lengths (16K,64K or 16K..128K)",
      meta = "LENGTHS" },
    { "layout", "choice", "bshd", "layout of q, k, v", values = { "bshd", "sbhd", "thd" } },
    { "iters", "int", gpu and 10 or 2, "timed calls per case" },
    { "backends", "list", "ours", "attention backends of the steps", values = { "ours", "cudnn" } },
    { "plot", "flag", nil, "draw cp-bench-TAG.png with experiments/cp/cp_bench_plot.sh (needs gnuplot)" },
  },
}
local layout, lengths, iters = h.opt.layout, h.opt.s, h.opt.iters
local nh = gpu and H or 4

local strategies = {}
for _, st in ipairs(presets.list) do
  if presets.applies(st, layout) then strategies[#strategies + 1] = st end
end

-- The median over iterations, max over ranks, in ms.
local function timed(fn)
  return h:max(bench.timing.events(fn, { warmup = 2, iters = iters }).median)
end

-- The kernels the attention steps took between two dl.attn.runs() readings: "fwd hopper, bwd hopper"
-- (a strategy that falls back to a slower kernel shows it here, not only in its time)
local function kernels_between(r0, r1)
  local parts = {}
  for _, dir in ipairs({ "fwd", "bwd" }) do
    local ks = {}
    for _, k in ipairs({ "cpu", "portable", "hopper", "cudnn" }) do
      if r1[dir][k] > r0[dir][k] then ks[#ks + 1] = k end
    end
    parts[#parts + 1] = dir .. " " .. (#ks > 0 and table.concat(ks, "+") or "none")
  end
  return table.concat(parts, ", ")
end

local function full_inputs(S)
  local shape = layout == "thd" and { B * S, nh, D } or layout == "sbhd" and { S, B, nh, D } or { B, S, nh, D }
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

local tbl = h:table({ { "backend", "%-6s" }, { "S_total", "%8d" }, { "strategy", "%-20s" }, { "fwd", "%10.3f", unit = "(ms)" },
  { "eff", "%6.1f", unit = "(%)" }, { "fwd+bwd", "%10.3f", unit = "(ms)" }, { "eff", "%6.1f", unit = "(%)" },
  { "1 GPU fwd", "%10.3f", unit = "(ms)" }, { "1 GPU f+b", "%10.3f", unit = "(ms)" }, { "#wrong", "%6d" } })
local dev = gpu and dl.cuda_device_name(0) or world.device
local title = string.format("CP attention time, %s x %d, B=%d H=%d D=%d bf16 causal %s, median of %d (max over ranks)",
  dev, C, B, nh, D, layout, iters)
tbl:header(title)

local rows = {}
local skipped = {}
for _, backend in ipairs(h.opt.backends) do
for _, S in ipairs(lengths) do
  local x = full_inputs(S)
  x.o.backend = backend
  -- One GPU, the whole sequence: the work CP splits C ways.
  local ref = {}
  local t1f = timed(function() ref.out, ref.lse = dl.attn.fwd(x.q, x.k, x.v, x.o) end)
  local r0 = dl.attn.runs()
  local t1b = timed(function()
    local out, lse = dl.attn.fwd(x.q, x.k, x.v, x.o)
    dl.attn.bwd(x.dout, x.q, x.k, x.v, out, lse, x.o)
  end)
  ref.dq, ref.dk, ref.dv = dl.attn.bwd(x.dout, x.q, x.k, x.v, ref.out, ref.lse, x.o)
  local kernels1 = kernels_between(r0, dl.attn.runs())
  local so = { comm = world, layout = layout, cu_seqlens_padded = x.seq and x.seq.cu_seqlens_q_padded }
  local q, k, v, dout = dl.cp.shard(x.q, so), dl.cp.shard(x.k, so), dl.cp.shard(x.v, so), dl.cp.shard(x.dout, so)
  local flops = 4 * B * nh * D * S * S / 2 -- causal forward; the backward is 2.5 times that
  rows[#rows + 1] = { backend = backend, S = S, name = "1 GPU, whole sequence", fwd = t1f, fb = t1b,
    tflops = flops / t1f / 1e9, kernels = kernels1 }
  for _, st in ipairs(strategies) do
    local o = presets.options(st)
    o.comm, o.layout, o.mask, o.backend = world, layout, "causal", backend
    local made, cp = pcall(dl.cp.attention, o)
    if not made then
      -- a strategy whose merge lives in our kernel's epilogue (fused correction, all_gather
      -- overlap) cannot run on cudnn: left out, with cp.attention's reason
      if backend ~= "cudnn" then error(cp, 0) end
      skipped[st.name] = tostring(cp):match("cp%.attention: ([^\n]*)") or tostring(cp)
      goto next_strategy
    end
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
    -- Data, after timing: this rank's shard of the one-GPU results (and the kernels its steps took).
    local r1 = dl.attn.runs()
    local out = cp:forward(q, k, v, x.seq)
    local dq, dk, dv = cp:backward(dout)
    local kernels = kernels_between(r1, dl.attn.runs())
    local worst = 0
    local wrong = h:check(function()
      local bad = 0
      for name, pair in pairs({ out = { ref.out, out }, dq = { ref.dq, dq }, dk = { ref.dk, dk }, dv = { ref.dv, dv } }) do
        local cmp = dl.compare(pair[2], dl.cp.shard(pair[1], so), 2.5e-2, 2.5e-2)
        worst = math.max(worst, cmp.max_abs_diff)
        if cmp.n_not_close > 0 then
          io.stderr:write(string.format("cp_bench: %s S=%d: %s differs from the one-GPU attention in %d elements " ..
            "on rank %d (max %g)\n", st.name, S, name, tonumber(cmp.n_not_close), world.rank, cmp.max_abs_diff))
          bad = bad + tonumber(cmp.n_not_close)
        end
      end
      return bad
    end)
    worst = h:max(worst)
    rows[#rows + 1] = { backend = backend, S = S, name = st.name, fwd = tf, fb = tb, err = worst, wrong = wrong,
      eff_f = t1f / (C * tf), eff_fb = t1b / (C * tb), tflops = flops / C / tf / 1e9, kernels = kernels }
    tbl:row({ backend, S, st.name, tf, 100 * t1f / (C * tf), tb, 100 * t1b / (C * tb), t1f, t1b, wrong })
    collectgarbage()
    ::next_strategy::
  end
  collectgarbage()
end
end

-- ---- report ---------------------------------------------------------------------------------

local main = {}
for _, row in ipairs(rows) do if row.name == "main" then main[row.backend .. "/" .. row.S] = row end end
local lines = {}
local function p(fmt, ...) lines[#lines + 1] = string.format(fmt, ...) end
p("| backend | S_total | strategy | fwd ms | fwd eff | fwd TFLOP/s/GPU | fwd+bwd ms | fwd+bwd eff | fwd+bwd vs main | max err | #wrong | kernels (rank 0) |")
p("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for _, row in ipairs(rows) do
  local m = main[row.backend .. "/" .. row.S]
  p("| %s | %d | %s | %.3f | %s | %.1f | %.3f | %s | %s | %s | %s | %s |", row.backend, row.S, row.name, row.fwd,
    row.eff_f and string.format("%.1f%%", 100 * row.eff_f) or "—", row.tflops, row.fb,
    row.eff_fb and string.format("%.1f%%", 100 * row.eff_fb) or "—",
    row.eff_fb and m and string.format("%+.1f%%", 100 * (row.fb / m.fb - 1)) or "—",
    row.err and string.format("%.2g", row.err) or "—", row.wrong and tostring(row.wrong) or "—", row.kernels or "—")
end
if h.rank0 then
  print("")
  print(table.concat(lines, "\n"))
  local base = "cp-bench-" .. h.tag
  local csv_rows = {}
  for _, row in ipairs(rows) do
    local function str(v) return v and tostring(v) end -- 14 significant digits, as before
    csv_rows[#csv_rows + 1] = { row.S, row.name, string.format("%.4f", row.fwd), str(row.eff_f),
      string.format("%.4f", row.fb), str(row.eff_fb), str(row.err), row.wrong, row.backend, row.kernels }
  end
  local csv = h:csv(base .. ".csv", { "S_total", "strategy", "fwd_ms", "fwd_eff", "fwd_bwd_ms", "fwd_bwd_eff", "max_err",
    "wrong", "backend", "kernels" }, csv_rows)
  local body = { "Efficiency = T(1 GPU, whole sequence) / (C x T(CP)): the share of the ideal C-fold",
    "speed-up that the schedule keeps (communication hidden, causal work balanced).",
    "`vs main` compares forward+backward with main (p2p, per-step buffers, post-loop merge).",
    "Produced by `experiments/cp/cp_bench.lua`; the strategies are `distlab.cp.presets`.", "" }
  local left = {}
  for name, why in pairs(skipped) do left[#left + 1] = "`" .. name .. "` (" .. why .. ")" end
  table.sort(left)
  if #left > 0 then
    body[#body] = "Left out with backend cudnn (their merge lives in our kernel's epilogue): " ..
      table.concat(left, "; ") .. ". Each backend's efficiency is against one GPU on the same backend."
    body[#body + 1] = ""
  end
  for _, l in ipairs(lines) do body[#body + 1] = l end
  body[#body + 1] = ""
  body[#body + 1] = "![overlap efficiency against S_total](" .. base .. ".png)"
  body[#body + 1] = ""
  body[#body + 1] = "(`experiments/cp/cp_bench_plot.sh " .. base .. ".csv` draws it from the CSV.)"
  -- which of our attention kernels the steps ran: dl.attn.backends names them
  local q = dl.empty({ 1, 128, 1, D }, { dtype = "bf16", device = world.device })
  local kb = dl.attn.backends(q, q, q, {})
  local function kernel(why) return why:match("kernel: (.*)$") or (gpu and why or "the fp64 cpu twin") end
  local md = h:markdown(base .. ".md", title, body, {
    "method: each time the median of " .. iters .. " calls between device events after 2 warm-up calls, the max " ..
      "over ranks; outputs and gradients checked after timing against the one-GPU attention (atol = rtol = 2.5e-2)",
    "backend ours: forward " .. kernel(kb.fwd_why) .. "; backward " .. kernel(kb.bwd_why) })
  print("wrote " .. csv .. " and " .. md)
  if h.opt.plot then
    local ok, note = bench.plot.script("experiments/cp/cp_bench_plot.sh", { csv }, base .. ".png")
    if not ok then print(note) end
  end
end
h:finish()
