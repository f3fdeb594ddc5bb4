-- experiments/overlap/gemm_bench.lua — dl.gemm against torch.matmul on the
-- GEMM that every all-gather + GEMM pipeline step runs: m in {1k, 2k, 4k,
-- 8k, 16k, 32k}, k = 16k, n = 8k, bf16 (issue 17's target: dl.gemm at least
-- 98% of torch.matmul's TFLOP/s at every m).
--
--   ./distlab run -n 1 --device cuda experiments/overlap/gemm_bench.lua [options]
--     --m LIST        rows (default 1K,2K,4K,8K,16K,32K); --k, --n (default 16K, 8K)
--     --iters N       timed calls per case, at least (default 20; more to fill --min-ms)
--     --warm-ms, --min-ms  warm-up and timed work per case in ms (default 500 and 1000)
--     --torch CSVS    experiments/overlap/gemm_bench_torch.py's CSVs from the same run, comma
--                     separated (overlap.sh runs it before and after this: the anchor is the
--                     mean of the runs, so a drift of the card's clocks cancels; their fastest,
--                     marked *, where they are more than 5% apart: an erratic run); its columns
--                     beside ours, the ratio and the target
--     --measured CSV  take dl.gemm's figures from this bench's own CSV of the same run
--                     instead of timing again (overlap.sh: torch, this, torch, this
--                     --measured, so that the results file holds both torch runs)
--     --out DIR       default experiments/results/overlap; --tag NAME (default: the GPU, h100)
--     --quick         m = 64, k = 256, n = 128, a few calls (a check that it runs and checks);
--                     --plant noop|scale=X puts an error into the timed GEMM, which the data
--                     check must report (exit code 1)
-- Writes DIR/gemm-TAG.md (the results file) and DIR/gemm-TAG.csv.
--
-- Method: dl.bench.timing.events (each call between two device events, the
-- median), as the torch script times torch.matmul; TFLOP/s = 2 m n k / time.
-- Warm-up and timed calls are counted from a first estimate so that each
-- case warms the card for --warm-ms and times --min-ms of work: 20 calls of
-- a 3 ms GEMM (60 ms) left the clocks wherever the last case put them, and
-- the same GEMM differed by 10% between two runs (H200, m = 8k).
-- Inputs randn (Philox), out given (a's dtype); dl.gemm's workspace comes
-- from the allocator per call (its cache: no device time). After timing, per
-- m: the timed callable once more on fresh inputs (new seeds) into out
-- poisoned (NaN), and max(4, ceil(1e5 / n)) rows spread over out (all of
-- them where m is smaller) against the fp64 product on the host
-- (verify.matmul_rows, not dl.gemm), within distlab.bench.gemm_check's
-- bounds of one rounding: each element within 2u |ref| + 2u rms(ref),
-- normwise within 1.5u (u = 2^-8 for bf16, 2^-11 for f16), the bias
-- <got - ref, ref> / <ref, ref> within 2^-10 (#wrong; any makes the exit
-- code non-zero).
local dl = require "distlab"
local bench = dl.bench
local verify = require "distlab.bench.verify"
local gemm_check = require "distlab.bench.gemm_check"

local h = bench.harness {
  name = "gemm_bench", family = "overlap", tag = true,
  usage = "./distlab run -n 1 --device cuda experiments/overlap/gemm_bench.lua [options]",
  about = "dl.gemm vs torch.matmul TFLOP/s (bf16, k = 16k, n = 8k); see the file's header",
  options = {
    { "m", "sizes", "1K,2K,4K,8K,16K,32K", "rows of a", meta = "LIST" },
    { "k", "size", "16K", "columns of a, rows of b" },
    { "n", "size", "8K", "columns of b" },
    { "dtype", "choice", "bf16", "inputs and output", values = { "bf16", "f16" } },
    { "iters", "int", 20, "timed calls per case, at least" },
    { "warm-ms", "number", 500, "warm-up work per case (ms)" },
    { "min-ms", "number", 1000, "timed work per case (ms)" },
    { "torch", "string", nil, "gemm_bench_torch.py's CSVs from the same run, comma separated", meta = "CSVS" },
    { "measured", "string", nil, "dl.gemm's figures from this bench's CSV of the same run", meta = "CSV" },
  },
}
local A = h.opt
if h.quick then -- the smallest case, unless the line says otherwise
  for key, v in pairs { m = { 64 }, k = 256, n = 128, iters = 2, warm_ms = 0, min_ms = 0 } do
    if not h.given[key] then A[key] = v end
  end
end
local dev = dl.default_device()
local gpu = dev:match("^cuda") and dl.cuda_device_name(tonumber(dev:match("%d+")) or 0) or dev
if not h.given.tag then h.tag = dev:match("^cuda") and (gpu:match("([AHBL]%d+)") or "gpu"):lower() or dev end

-- after timing: call once more on fresh inputs (a and b drawn again from new seeds), out
-- poisoned, rows spread over out against the fp64 product on the host (see the header)
local function check(m, call, a, b, out)
  local n = A.n
  local rows = verify.spread(m, math.max(4, math.ceil(1e5 / n)), m)
  local wins = {}
  for i, r in ipairs(rows) do
    wins[i] = { r * n, n }
    rows[i] = r + 1
  end
  return h:verify { what = string.format("m = %d", m),
    fresh = function()
      a:normal_(0, 1, 1000003 + 2 * m)
      b:normal_(0, 1, 1000004 + 2 * m)
    end,
    poison = { out }, run = call,
    check = function()
      local ref = verify.matmul_rows(a, b, rows)
      return verify.close(verify.take(out, wins), ref:reshape(ref:numel()), gemm_check.tol(A.dtype))
    end }
end

-- torch[m] = {ms, tflops (bench.anchor's over the CSVs: the mean, or the fastest run where the runs are far apart:
-- wide), runs = "a / b" TFLOP/s, status, torch}
local torch, nruns = {}, 0
for file in (A.torch or ""):gmatch("[^,]+") do
  local head, recs = bench.csv.read(file)
  if not head then dl.fail("gemm_bench: cannot read %s: %s", file, tostring(recs)) end
  if head[1] ~= "impl" then dl.fail("gemm_bench: %s is not gemm_bench_torch.py's CSV", file) end
  nruns = nruns + 1
  for _, r in ipairs(recs) do
    local m, t = tonumber(r.m), torch[tonumber(r.m)]
    local tf = bench.csv.number(r.tflops)
    if not t then
      t = { status = r.status, torch = r.torch, all_ms = {}, all_tf = {}, runs = {} }
      torch[m] = t
    end
    if r.status ~= "ok" then t.status = r.status end
    t.runs[#t.runs + 1] = tf and string.format("%.1f", tf) or "-"
    if tf and r.status == "ok" then t.all_ms[#t.all_ms + 1], t.all_tf[#t.all_tf + 1] = bench.csv.number(r.ms), tf end
  end
end
for _, t in pairs(torch) do
  local w1, w2
  t.ms, w1 = bench.anchor(t.all_ms, "low")
  t.tflops, w2 = bench.anchor(t.all_tf, "high")
  t.wide = w1 or w2
  t.runs = table.concat(t.runs, " / ")
end

local tbl = h:table({ { "m", "%6d" }, { "k", "%6d" }, { "n", "%6d" }, { "ms", "%9.3f" }, { "TFLOP/s", "%8.1f" },
  { "torch ms", "%9.3f" }, { "torch TF/s", "%10.1f" }, { "ratio", "%6.3f" }, { "target", "%-6s" },
  { "#wrong", "%6d" } })
tbl:header(string.format("dl.gemm vs torch.matmul, %s, %s, %s", gpu, A.dtype, dl.build_info()))
-- measured[m] = this bench's earlier CSV row (--measured)
local measured
if A.measured then
  local head, recs = bench.csv.read(A.measured)
  if not head then dl.fail("gemm_bench: cannot read %s: %s", A.measured, tostring(recs)) end
  if head[1] ~= "m" or head[5] ~= "ms" then dl.fail("gemm_bench: %s is not gemm_bench's CSV", A.measured) end
  measured = {}
  for _, r in ipairs(recs) do measured[tonumber(r.m)] = r end
end

-- dl.gemm at m rows: ms per call, wrong elements
local function measure(m)
  if measured then
    local r = measured[m] or dl.fail("gemm_bench: %s has no row for m = %d", A.measured, m)
    return bench.csv.number(r.ms), h:check(tonumber(r.wrong))
  end
  local a = dl.randn({ m, A.k }, { dtype = A.dtype, device = dev, seed = m })
  local b = dl.randn({ A.k, A.n }, { dtype = A.dtype, device = dev, seed = m + 1 })
  local out = dl.empty({ m, A.n }, { dtype = A.dtype, device = dev })
  local call = h:planted(function() dl.gemm(a, b, out) end, { writes = { out } })
  local ms = bench.timing.events(call, { warmup = 0, iters = A.iters, warm_ms = A.warm_ms, min_ms = A.min_ms }).median
  local wrong = check(m, call, a, b, out)
  a, b, out = nil, nil, nil
  collectgarbage("collect")
  return ms, wrong
end

local rows = {}
for _, m in ipairs(A.m) do
  local ms, wrong = measure(m)
  local tf = 2 * m * A.n * A.k / (ms * 1e-3) / 1e12
  local t = torch[m] or {}
  local tms, ttf = t.ms, t.tflops
  local ratio = ttf and tf / ttf
  local r = { m = m, ms = ms, tf = tf, tms = tms, ttf = ttf, ratio = ratio, wrong = wrong,
    target = ratio and (ratio >= 0.98 and "met" or "below") or "-", tstatus = t.status, truns = t.runs, twide = t.wide }
  rows[#rows + 1] = r
  tbl:row({ m, A.k, A.n, ms, tf, tms, ttf, ratio, r.target, wrong })
end

-- with --measured no GEMM ran here: one small one loads cuBLASLt, so the file names its version
if measured and dev:match("^cuda") then
  dl.gemm(dl.randn({ 16, 16 }, { dtype = A.dtype, device = dev }), dl.randn({ 16, 16 }, { dtype = A.dtype, device = dev }))
end
local stats = dl.gemm.stats()
local v = stats.version
local function f(fmt, x) return x and string.format(fmt, x) or "—" end
local md_rows, csv_rows = {}, {}
for _, r in ipairs(rows) do
  local star = r.twide and "*" or ""
  md_rows[#md_rows + 1] = { r.m, A.k, A.n, f("%.3f", r.ms), f("%.1f", r.tf), f("%.3f", r.tms) .. star,
    f("%.1f", r.ttf) .. star, r.truns or "—", f("%.3f", r.ratio), r.target, r.wrong }
  csv_rows[#csv_rows + 1] = { r.m, A.k, A.n, A.dtype, f("%.4f", r.ms), f("%.2f", r.tf), f("%.4f", r.tms),
    f("%.2f", r.ttf), f("%.4f", r.ratio), r.wrong }
end
local lines = { string.format("TFLOP/s = 2 m n k / time; time: the median of at least %d calls and %g ms of work, " ..
  "each call between two device events, after %g ms of warm-up calls (torch.matmul timed the same way by " ..
  "`experiments/overlap/gemm_bench_torch.py`, in the same run, %d time(s): before and after dl.gemm, its " ..
  "figure the mean of the runs, or their fastest where they are more than %.0f%% apart (*), each run's TFLOP/s " ..
  "listed). Target (issue 17): dl.gemm >= 0.98 x torch.matmul at every m.", A.iters, A.min_ms, A.warm_ms, nruns,
  (bench.timing.ANCHOR_WIDE - 1) * 100), "" }
for _, l in ipairs(bench.markdown.table({ "m", "k", "n", "dl.gemm ms", "dl.gemm TFLOP/s", "torch ms",
  "torch TFLOP/s", "torch runs", "ratio", "target", "#wrong" }, md_rows)) do lines[#lines + 1] = l end
local notes = {}
for _, r in ipairs(rows) do
  if r.tstatus and r.tstatus ~= "ok" then notes[#notes + 1] = string.format("- torch at m = %d: %s", r.m, r.tstatus) end
end
if #notes > 0 then
  lines[#lines + 1] = ""
  for _, l in ipairs(notes) do lines[#lines + 1] = l end
end
local extra = { "build: " .. dl.build_info(),
  (v > 0 and string.format("cuBLASLt %d.%d.%d", math.floor(v / 10000), math.floor(v / 100) % 100, v % 100) or
    "cuBLASLt not loaded (not a GPU run)") .. " (dl.gemm: cublasLtMatmul with the heuristic's first algorithm " ..
    "for the configuration, asked once and cached; a 32 MiB workspace; fp32 accumulation)",
  "torch: " .. ((rows[1] and torch[rows[1].m] and torch[rows[1].m].torch) or "not run (no --torch)"),
  "data checked after timing: fresh inputs, out poisoned, max(4, 1e5 / n) rows spread over it against the fp64 " ..
    "product on the host: elements within 2u |ref| + 2u rms, normwise 1.5u, bias 2^-10 (#wrong)" }
local path = h:markdown("gemm-" .. h.tag .. ".md", "dl.gemm vs torch.matmul (" .. A.dtype .. ")", lines, extra)
h:csv("gemm-" .. h.tag .. ".csv", { "m", "k", "n", "dtype", "ms", "tflops", "torch_ms", "torch_tflops", "ratio",
  "wrong" }, csv_rows)
print("wrote " .. path .. " and .csv")
local met, judged = 0, 0
for _, r in ipairs(rows) do
  if r.ratio then judged, met = judged + 1, met + (r.ratio >= 0.98 and 1 or 0) end
end
if judged > 0 then print(string.format("target (>= 0.98 x torch.matmul): met at %d of %d sizes", met, judged)) end
h:finish()
