-- experiments/cp/cp_bench.lua — forward and forward+backward time of every
-- context-parallel strategy (distlab.cp.presets) at CP = world size (2
-- GPUs), against the attention of the same total work on one GPU, as
-- overlap efficiency:
--   efficiency = T(1 GPU, whole sequence) / (C x T(CP))
-- 1.0 means the communication hides completely behind the attention and
-- the causal work is split evenly. B=1, H=16, D=128, bf16, causal, bshd;
-- S_total in {16k, 64k, 128k}. Each time is the median of
-- dl.bench.timing.events (2 warm-up calls, device events) and the max over
-- ranks. Data checked after timing, every timed callable (the strategies'
-- forward and forward+backward, and the one-GPU attention's): once more on
-- fresh inputs (new seeds, the same for every strategy of a length), against
-- fp64 single-rank attention on the host at sampled rows
-- (distlab.bench.attn_rows, prepared once per length): out, lse and dq at
-- query rows spread over every (sequence, head) of the whole sequence, so
-- over every rank's shard (--check-elements / D rows: >= 1e5 elements of out
-- and of dq), dk and dv at a quarter as many key rows in a few (sequence,
-- head) slices (each summed over every query, from the out and lse the
-- schedule kept), the results gathered to
-- whole sequences (dl.cp.unshard) and the rows split among the ranks.
-- TransformerEngine's bf16 tolerance element-wise, normwise 8e-3 (lse 1e-5),
-- bias within 2^-10, so a result 1% off fails. #wrong: wrong elements over all ranks (any makes
-- the exit code non-zero, each rank's message on stderr); max err: the
-- largest |got - ref|, rel err: the largest normwise error of out, dq, dk,
-- dv. --quick: S = 64 (the plant spec's run, 2 cpu ranks); --plant noop |
-- scale=X puts an error into every timed call. --backends ours,cudnn times
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
local cpc = require "distlab.bench.cp_check"

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
    { "check-elements", "int", 100000, "output elements of out (and of dq) the fp64 check covers per length " ..
      "(query rows: this / D; key rows for dk, dv: a quarter as many)", meta = "N" },
  },
}
local layout, lengths, iters = h.opt.layout, h.opt.s, h.opt.iters
if h.quick then
  if not h.given.s then lengths = { 64 } end
  if not h.given.iters then iters = 1 end
end
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

-- The whole sequence's inputs (seeds base + 1..4) and options.
local function full_inputs(S, base) return cpc.inputs { layout = layout, B = B, S = S, H = nh, D = D, seed = base } end

local tbl = h:table({ { "backend", "%-6s" }, { "S_total", "%8d" }, { "strategy", "%-20s" }, { "fwd", "%10.3f", unit = "(ms)" },
  { "eff", "%6.1f", unit = "(%)" }, { "fwd+bwd", "%10.3f", unit = "(ms)" }, { "eff", "%6.1f", unit = "(%)" },
  { "1 GPU fwd", "%10.3f", unit = "(ms)" }, { "1 GPU f+b", "%10.3f", unit = "(ms)" }, { "rel err", "%8.1e" },
  { "#wrong", "%6d" } })
local dev = gpu and dl.cuda_device_name(0) or world.device
local title = string.format("CP attention time, %s x %d, B=%d H=%d D=%d bf16 causal %s, median of %d (max over ranks)",
  dev, C, B, nh, D, layout, iters)
tbl:header(title)

local rows = {}
local skipped = {}
local checks = {} -- S -> the data check of that length (distlab.bench.cp_check)
local check_s, check_desc = 0, nil

-- The data check of one length, made once: fresh whole-sequence inputs (seeds no
-- timed call used) and the fp64 reference at the sampled rows this rank checks.
local function check_of(S)
  if checks[S] then return checks[S] end
  local t0 = dl.now_us()
  local c = cpc.new { inputs = full_inputs(S, 100 + S), comm = world, elements = h.opt.check_elements, seed = S }
  check_desc = c:describe()
  check_s = check_s + (dl.now_us() - t0) / 1e6
  checks[S] = c
  return c
end

-- One check of a timed callable `run` (it returns out, lse[, dq, dk, dv] of the
-- inputs in `cur`, results of a schedule on `comm`, a whole sequence's where its
-- size is 1): fresh inputs put in `cur`, then the timed ones back. Returns the
-- wrong elements over all ranks, the largest normwise error and max |got - ref|
-- over the ranks.
local function verify(what, c, cur, fresh, run, comm)
  local timed_in, rel, mx = {}, 0, 0
  for k, v in pairs(cur) do timed_in[k] = v end
  local t0 = dl.now_us()
  local wrong = h:verify {
    what = what,
    fresh = function() for k, v in pairs(fresh) do cur[k] = v end end,
    run = run,
    check = function(...)
      local n, msg, r, m = c:check(comm, ...)
      rel, mx = r, m
      return n, msg
    end,
  }
  for k, v in pairs(timed_in) do cur[k] = v end
  check_s = check_s + (dl.now_us() - t0) / 1e6
  return wrong, h:max(rel), h:max(mx)
end

for _, backend in ipairs(h.opt.backends) do
for _, S in ipairs(lengths) do
  local x = full_inputs(S)
  x.o.backend = backend
  local so = { comm = world, layout = layout, cu_seqlens_padded = x.seq and x.seq.cu_seqlens_q_padded }
  -- One GPU, the whole sequence: the work CP splits C ways (the timed calls, planted).
  local one = { q = x.q, k = x.k, v = x.v, dout = x.dout }
  local one_f = h:planted(function() return dl.attn.fwd(one.q, one.k, one.v, x.o) end, { returns = true })
  local one_fb = h:planted(function()
    local out, lse = dl.attn.fwd(one.q, one.k, one.v, x.o)
    local dq, dk, dv = dl.attn.bwd(one.dout, one.q, one.k, one.v, out, lse, x.o)
    return out, lse, dq, dk, dv
  end, { returns = true })
  local t1f = timed(function() one_f() end)
  local r0 = dl.attn.runs()
  local t1b = timed(function() one_fb() end)
  local kernels1 = kernels_between(r0, dl.attn.runs())
  local c = check_of(S)
  local fx, one_comm = { q = c.x.q, k = c.x.k, v = c.x.v, dout = c.x.dout }, { size = 1 }
  local w1f, e1f, m1f = verify(string.format("backend %s S=%d 1 GPU forward", backend, S), c, one, fx, one_f, one_comm)
  local w1b, e1b, m1b = verify(string.format("backend %s S=%d 1 GPU forward+backward", backend, S), c, one, fx, one_fb,
    one_comm)
  local q, k, v, dout = dl.cp.shard(x.q, so), dl.cp.shard(x.k, so), dl.cp.shard(x.v, so), dl.cp.shard(x.dout, so)
  local flops = 4 * B * nh * D * S * S / 2 -- causal forward; the backward is 2.5 times that
  rows[#rows + 1] = { backend = backend, S = S, name = "1 GPU, whole sequence", fwd = t1f, fb = t1b,
    tflops = flops / t1f / 1e9, kernels = kernels1, wrong = w1f + w1b, err = math.max(m1f, m1b),
    rel = math.max(e1f, e1b) }
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
    do
      -- the timed calls (planted), on this rank's shards in `cur`
      local cur = { q = q, k = k, v = v, dout = dout }
      local fwd = h:planted(function()
        local out, lse = cp:forward(cur.q, cur.k, cur.v, x.seq)
        cp:release()
        return out, lse
      end, { returns = true })
      local fwdbwd = h:planted(function()
        local out, lse = cp:forward(cur.q, cur.k, cur.v, x.seq)
        local dq, dk, dv = cp:backward(cur.dout)
        return out, lse, dq, dk, dv
      end, { returns = true })
      local tf = timed(function() fwd() end)
      local tb = timed(function() fwdbwd() end)
      -- Data, after timing: each timed call on the fresh inputs (and the kernels its steps took).
      local wf, ef, mf = verify(string.format("backend %s S=%d %s forward", backend, S, st.name), c, cur,
        c:shards(world), fwd, world)
      local r1 = dl.attn.runs()
      local wb, eb, mb = verify(string.format("backend %s S=%d %s forward+backward", backend, S, st.name), c, cur,
        c:shards(world), fwdbwd, world)
      local kernels = kernels_between(r1, dl.attn.runs())
      local wrong, rel = wf + wb, math.max(ef, eb)
      rows[#rows + 1] = { backend = backend, S = S, name = st.name, fwd = tf, fb = tb, err = math.max(mf, mb),
        rel = rel, wrong = wrong, eff_f = t1f / (C * tf), eff_fb = t1b / (C * tb), tflops = flops / C / tf / 1e9,
        kernels = kernels }
      tbl:row({ backend, S, st.name, tf, 100 * t1f / (C * tf), tb, 100 * t1b / (C * tb), t1f, t1b, rel, wrong })
      collectgarbage()
    end
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
p("| backend | S_total | strategy | fwd ms | fwd eff | fwd TFLOP/s/GPU | fwd+bwd ms | fwd+bwd eff | fwd+bwd vs main | max err | #wrong | kernels (rank 0) | rel err |")
p("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
for _, row in ipairs(rows) do
  local m = main[row.backend .. "/" .. row.S]
  p("| %s | %d | %s | %.3f | %s | %.1f | %.3f | %s | %s | %s | %s | %s | %s |", row.backend, row.S, row.name, row.fwd,
    row.eff_f and string.format("%.1f%%", 100 * row.eff_f) or "—", row.tflops, row.fb,
    row.eff_fb and string.format("%.1f%%", 100 * row.eff_fb) or "—",
    row.eff_fb and m and string.format("%+.1f%%", 100 * (row.fb / m.fb - 1)) or "—",
    row.err and string.format("%.2g", row.err) or "—", row.wrong and tostring(row.wrong) or "—", row.kernels or "—",
    row.rel and string.format("%.1e", row.rel) or "—")
end
if h.rank0 then
  print("")
  print(table.concat(lines, "\n"))
  local base = "cp-bench-" .. h.tag
  local csv_rows = {}
  for _, row in ipairs(rows) do
    local function str(v) return v and tostring(v) end -- 14 significant digits, as before
    csv_rows[#csv_rows + 1] = { row.S, row.name, string.format("%.4f", row.fwd), str(row.eff_f),
      string.format("%.4f", row.fb), str(row.eff_fb), str(row.err), row.wrong, row.backend, row.kernels,
      row.rel and string.format("%.3e", row.rel) }
  end
  local csv = h:csv(base .. ".csv", { "S_total", "strategy", "fwd_ms", "fwd_eff", "fwd_bwd_ms", "fwd_bwd_eff", "max_err",
    "wrong", "backend", "kernels", "rel_err" }, csv_rows)
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
      "over ranks; every timed call (the strategies' and the one-GPU attention's, forward and forward+backward) " ..
      "checked after timing: once more on fresh inputs, against fp64 single-rank attention on the host at sampled " ..
      "rows (distlab.bench.attn_rows: " .. (check_desc or "-") .. " at the last length, split among the ranks; " ..
      "element-wise atol = rtol = 2.5e-2, normwise 8e-3, lse 1e-5, bias 2^-10; max err the largest |got - ref|, rel err " ..
      string.format("the largest normwise error of out, dq, dk, dv); %.0f s of host time in the checks on rank 0",
        check_s),
    "backend ours: forward " .. kernel(kb.fwd_why) .. "; backward " .. kernel(kb.bwd_why) })
  print("wrote " .. csv .. " and " .. md)
  if h.opt.plot then
    local ok, note = bench.plot.script("experiments/cp/cp_bench_plot.sh", { csv }, base .. ".png")
    if not ok then print(note) end
  end
end
h:finish()
