-- experiments/gemm/grouped_bench.lua — dl.gemm.grouped against torch's grouped GEMM paths
-- at the MoE block's shapes (DeepSeek-V3-like: hidden 7168, expert FFN 2048): E local
-- experts in {8, 32}; rows per expert uniform (128, 1024, 4096) or skewed (geometric
-- from 4096 down to 128, in a fixed shuffled order); the up GEMM (K = 7168, N = 2048)
-- and the down GEMM (K = 2048, N = 7168); forward (Y_e = X_e W_e), dgrad
-- (dX_e = dY_e W_e^T) and wgrad (dW_e = X_e^T dY_e), bf16 in and out, fp32 sums.
-- Issue 55's target: dl.gemm.grouped at least 0.95x torch's best grouped path.
--
--   ./distlab run -n 1 --device cuda experiments/gemm/grouped_bench.lua [options]
--     --experts LIST   E (default 8,32); --dists LIST (default u128,u1024,u4096,skew:
--                      uN = N rows each, skew = 4096 .. 128); --gemms up,down; --ops fwd,dgrad,wgrad
--     --hidden, --ffn  K and N of the up GEMM (default 7168, 2048; down: the other way)
--     --backends LIST  what is timed (default auto,cublas,loop,loop4,auto_dev): auto, cublas,
--                      loop (one cuBLASLt GEMM per expert; uniform counts: one strided-batched
--                      call), loop4 (the same over 4 side streams, the largest GEMM first),
--                      auto_dev (auto with the counts in an int32 tensor on the
--                      device, as ep:dispatch leaves them: the call reads them back and waits)
--     --iters N, --warm-ms, --min-ms   timed calls per row at least, warm-up and timed work
--                      per row (default 10, 50, 150)
--     --torch CSVS     grouped_torch.py's CSVs of the same device call (before and after
--                      this: the anchor is their mean, or their fastest, marked *, where they
--                      are more than 5% apart), comma separated
--     --measured CSV   dl.gemm.grouped's figures from this bench's own CSV of the same call
--                      (grouped_ref.sh: torch, this, torch, this --measured)
--     --cases-out FILE write the cases (one CSV row per case: its counts) and exit:
--                      what grouped_torch.py --cases reads, so both time the same counts
--     --out DIR        default experiments/results/gemm; --tag NAME (default: the GPU, h200)
--     --quick          E = 2, 3, a small K and N, every op and backend once: a check that it
--                      runs and checks; --plant noop|scale=X puts an error into every timed
--                      call, which the data check must report (exit code 1)
-- Writes DIR/grouped-TAG.md (the results file) and DIR/grouped-TAG.csv.
--
-- Method: x expert-major [E, R, K] with R the largest count (ep:dispatch's receive
-- layout), w [E, K, N], out given; counts a Lua list (no device read) except auto_dev.
-- Each call between two device events (bench.timing.events), the median, after warm-up
-- calls filling --warm-ms and at least --iters calls filling --min-ms; TFLOP/s =
-- 2 sum(counts) K N / time. torch's paths (grouped_torch.py, timed the same way):
-- torch._grouped_mm on the packed rows with offsets, a loop of torch.matmul per expert
-- on the expert-major buffer, torch.bmm over the padded buffer (all R rows of every
-- expert: more FLOPs, the same TFLOP/s denominator); its best is the fastest that ran.
-- Data checked after timing, per row and backend: the inputs drawn again (new seeds)
-- and scaled by a power of two of the backend's own (exact: no earlier output is right),
-- out poisoned (NaN), the timed call once more; for 3 experts (the largest, the
-- smallest, one between) 3 rows each against the fp64 product on the host
-- (verify.matmul_rows), within the bounds of one rounding to bf16 (distlab.bench.gemm_check.tol:
-- each element within 2u |ref| + 2u rms(ref), normwise 1.5u, u = 2^-8, bias 2^-10; #wrong:
-- any makes the exit code non-zero).
local dl = require "distlab"
local bench = dl.bench
local verify = require "distlab.bench.verify"
local gemm_check = require "distlab.bench.gemm_check"

local h = bench.harness {
  name = "grouped_bench", family = "gemm", tag = true,
  usage = "./distlab run -n 1 --device cuda experiments/gemm/grouped_bench.lua [options]",
  about = "dl.gemm.grouped vs torch's grouped GEMM paths at DeepSeek-V3-like expert shapes; see the file's header",
  options = {
    { "experts", "counts", "8,32", "local experts E", meta = "LIST" },
    { "dists", "list", "u128,u1024,u4096,skew", "rows per expert: uN (N each) or skew (4096 .. 128)", meta = "LIST" },
    { "gemms", "list", "up,down", "up (K = hidden, N = ffn), down (K = ffn, N = hidden)", values = { "up", "down" } },
    { "ops", "list", "fwd,dgrad,wgrad", "the GEMMs", values = { "fwd", "dgrad", "wgrad" } },
    { "hidden", "int", 7168, "the model's hidden size" },
    { "ffn", "int", 2048, "the expert FFN's inner size" },
    { "backends", "list", "auto,cublas,loop,loop4,auto_dev", "what is timed",
      values = { "auto", "cublas", "loop", "loop4", "auto_dev" } },
    { "iters", "int", 10, "timed calls per row, at least" },
    { "warm-ms", "number", 50, "warm-up work per row (ms)" },
    { "min-ms", "number", 150, "timed work per row (ms)" },
    { "torch", "string", nil, "grouped_torch.py's CSVs from the same device call, comma separated", meta = "CSVS" },
    { "measured", "string", nil, "dl.gemm.grouped's figures from this bench's CSV of the same call", meta = "CSV" },
    { "cases-out", "string", nil, "write the cases as CSV and exit", meta = "FILE" },
  },
}
local A = h.opt
if h.quick then -- the smallest case, unless the line says otherwise
  for key, v in pairs { experts = { 2, 3 }, dists = { "u24", "skew" }, hidden = 256, ffn = 128, iters = 1, warm_ms = 0,
    min_ms = 0 } do
    if not h.given[key] then A[key] = v end
  end
end
local TARGET = 0.95

-- ---- the cases ---------------------------------------------------------------------------

-- counts of dist over E experts: uN, or skew: geometric from hi down to lo, shuffled
-- (the same order every run: a fixed LCG)
local function counts_of(dist, E)
  local hi, lo = 4096, 128
  if h.quick then hi, lo = 40, 3 end
  local n = tonumber(dist:match("^u(%d+)$"))
  local c = {}
  if n then
    for e = 1, E do c[e] = n end
    return c
  end
  if dist ~= "skew" then dl.fail("grouped_bench: --dists: %s is neither uN nor skew", dist) end
  for i = 0, E - 1 do c[i + 1] = math.floor(hi * (lo / hi) ^ (E > 1 and i / (E - 1) or 0) + 0.5) end
  local s = 12345
  for i = E, 2, -1 do
    s = (s * 48271) % 2147483647
    local j = s % i + 1
    c[i], c[j] = c[j], c[i]
  end
  return c
end

local cases = {}
for _, E in ipairs(A.experts) do
  for _, dist in ipairs(A.dists) do
    for _, gemm in ipairs(A.gemms) do
      for _, op in ipairs(A.ops) do
        local K, N = A.hidden, A.ffn
        if gemm == "down" then K, N = N, K end
        local counts = counts_of(dist, E)
        local rows, rmax = 0, 0
        for _, c in ipairs(counts) do rows, rmax = rows + c, math.max(rmax, c) end
        cases[#cases + 1] = { id = string.format("E%d %s %s %s", E, dist, gemm, op), E = E, dist = dist, gemm = gemm,
          op = op, K = K, N = N, counts = counts, rows = rows, rmax = rmax, flops = 2 * rows * K * N }
      end
    end
  end
end

local CASE_COLS = { "case", "E", "dist", "gemm", "op", "K", "N", "rows", "rmax", "counts" }
if A.cases_out then
  local recs = {}
  for i, c in ipairs(cases) do
    recs[i] = { c.id, c.E, c.dist, c.gemm, c.op, c.K, c.N, c.rows, c.rmax, table.concat(c.counts, " ") }
  end
  bench.csv.write(A.cases_out, CASE_COLS, recs)
  print(string.format("wrote %d cases to %s", #cases, A.cases_out))
  os.exit(0)
end

local dev = dl.default_device()
local gpu = dev:match("^cuda") and dl.cuda_device_name(tonumber(dev:match("%d+")) or 0) or dev
if not h.given.tag then h.tag = dev:match("^cuda") and (gpu:match("([AHBL]%d+)") or "gpu"):lower() or dev end
local cuda = dev:match("^cuda") ~= nil
local BACKENDS = {}
for _, b in ipairs(A.backends) do
  -- cpu: the twin alone, but --measured reports what the timed run's CSV has, on any host
  if cuda or A.measured or b == "auto" or b == "auto_dev" then BACKENDS[#BACKENDS + 1] = b end
end

-- ---- torch's figures (--torch) --------------------------------------------------------

local PATHS = { "grouped_mm", "matmul_loop", "bmm_padded" }
-- torch[case][path] = {ms (bench.anchor's over the CSVs: the mean, or the fastest run where the runs are far apart:
-- wide), runs = "a / b", status}
local torch, nruns, torch_about = {}, 0, nil
for file in (A.torch or ""):gmatch("[^,]+") do
  local head, recs = bench.csv.read(file)
  if not head then dl.fail("grouped_bench: cannot read %s: %s", file, tostring(recs)) end
  if head[1] ~= "case" or head[10] ~= "path" then dl.fail("grouped_bench: %s is not grouped_torch.py's CSV", file) end
  nruns = nruns + 1
  for _, r in ipairs(recs) do
    torch[r.case] = torch[r.case] or {}
    local t = torch[r.case][r.path]
    if not t then
      t = { all_ms = {}, runs = {}, status = r.status }
      torch[r.case][r.path] = t
    end
    torch_about = torch_about or r.torch
    local ms = bench.csv.number(r.ms)
    if r.status ~= "ok" then t.status = r.status end
    t.runs[#t.runs + 1] = ms and string.format("%.3f", ms) or "-"
    if ms and r.status == "ok" then t.all_ms[#t.all_ms + 1] = ms end
  end
end
for _, paths in pairs(torch) do
  for _, t in pairs(paths) do
    t.ms, t.wide = bench.anchor(t.all_ms, "low")
    t.runs = table.concat(t.runs, " / ")
  end
end

-- ---- dl.gemm.grouped ----------------------------------------------------------------------

local measured
if A.measured then
  local head, recs = bench.csv.read(A.measured)
  if not head then dl.fail("grouped_bench: cannot read %s: %s", A.measured, tostring(recs)) end
  if head[1] ~= "case" or head[10] ~= "backend" then dl.fail("grouped_bench: %s is not grouped_bench's CSV", A.measured) end
  measured = {}
  for _, r in ipairs(recs) do measured[r.case .. "|" .. r.backend] = r end
end

local FACTORS = { 0.5, 2, 0.25, 4, 0.125, 8 } -- a power of two per backend's check

-- the operands of a case: a (x or dy), b (w or dy), out; and a's scalable copy for the checks
local function buffers(c)
  local E, R, K, N = c.E, c.rmax, c.K, c.N
  local o = { dtype = "bf16", device = dev }
  local b = {}
  if c.op == "fwd" then
    b.a, b.b, b.out = dl.empty({ E, R, K }, o), dl.empty({ E, K, N }, o), dl.empty({ E, R, N }, o)
  elseif c.op == "dgrad" then
    b.a, b.b, b.out = dl.empty({ E, R, N }, o), dl.empty({ E, K, N }, o), dl.empty({ E, R, K }, o)
  else
    b.a, b.b, b.out = dl.empty({ E, R, K }, o), dl.empty({ E, R, N }, o), dl.empty({ E, K, N }, o)
  end
  b.a:normal_(0, 1, 11)
  b.b:normal_(0, 1, 12)
  b.counts_dev = dl.from_table(c.counts, { dtype = "i32", device = dev })
  return b
end

local FN = { fwd = dl.gemm.grouped, dgrad = dl.gemm.grouped_dx, wgrad = dl.gemm.grouped_dw }

local function call_of(c, bufs, be)
  local o = be == "loop4" and { backend = "loop", streams = 4 } or { backend = (be == "auto_dev") and "auto" or be }
  local counts = be == "auto_dev" and bufs.counts_dev or c.counts
  local fn = FN[c.op]
  local picked
  local run = function() picked = select(2, fn(bufs.a, bufs.b, counts, bufs.out, o)) end
  return h:planted(run, { writes = { bufs.out } }), function() return picked end
end

-- the experts checked: the largest, the smallest with rows, one between (by index)
local function checked_experts(c)
  local big, small
  for e, n in ipairs(c.counts) do
    if n > 0 and (not big or n > c.counts[big]) then big = e end
    if n > 0 and (not small or n < c.counts[small]) then small = e end
  end
  local list, seen = {}, {}
  for _, e in ipairs { big, small, math.floor(#c.counts / 2) + 1 } do
    if e and not seen[e] then
      seen[e] = true
      list[#list + 1] = e
    end
  end
  return list
end

-- The reference of the checks of one case: fresh inputs (new seeds), then for each
-- checked expert a few rows of its result in fp64 on the host; `wins` of out (flat).
local function reference(c, bufs, seed)
  bufs.a:normal_(0, 1, seed)
  bufs.b:normal_(0, 1, seed + 1)
  bufs.a0 = bufs.a:clone()
  local refs, picks = {}, {}
  local n_out = c.op == "wgrad" and c.N or (c.op == "fwd" and c.N or c.K)
  for _, e in ipairs(checked_experts(c)) do
    local m = c.counts[e]
    local x, y, nrows
    if c.op == "fwd" then
      x, y, nrows = bufs.a:select(1, e), bufs.b:select(1, e), m
    elseif c.op == "dgrad" then
      x, y, nrows = bufs.a:select(1, e), bufs.b:select(1, e):transpose(1, 2):contiguous(), m
    else
      x = bufs.a:select(1, e):narrow(1, 1, m):transpose(1, 2):contiguous()
      y, nrows = bufs.b:select(1, e):narrow(1, 1, m), c.K
    end
    local rows = verify.spread(nrows, 3, seed + e)
    for i, r in ipairs(rows) do rows[i] = r + 1 end
    refs[#refs + 1] = verify.matmul_rows(x, y, rows)
    picks[#picks + 1] = { e = e, rows = rows }
  end
  local total = 0
  for _, r in ipairs(refs) do total = total + r:numel() end
  local ref = dl.empty({ total }, { dtype = "f64", device = "cpu" })
  local at = 0
  for _, r in ipairs(refs) do
    ref:narrow(1, at + 1, r:numel()):copy_(r:reshape(r:numel()))
    at = at + r:numel()
  end
  return ref, picks, n_out
end

local function got_rows(bufs, picks, n_out)
  local parts, total = {}, 0
  for _, p in ipairs(picks) do
    local wins = {}
    for i, r in ipairs(p.rows) do wins[i] = { (r - 1) * n_out, n_out } end
    parts[#parts + 1] = verify.take(bufs.out:select(1, p.e), wins)
    total = total + parts[#parts]:numel()
  end
  local got = dl.empty({ total }, { dtype = "f64", device = "cpu" })
  local at = 0
  for _, g in ipairs(parts) do
    got:narrow(1, at + 1, g:numel()):copy_(g)
    at = at + g:numel()
  end
  return got
end

-- results[case.id][backend] = {ms, tflops, wrong, picked}
local results = {}
local CSV_COLS = { "case", "E", "dist", "gemm", "op", "K", "N", "rows", "rmax", "backend", "ran", "ms", "tflops",
  "wrong" }
local function f(fmt, x) return x and string.format(fmt, x) or "—" end
local function csv_row(c, be, r)
  return { c.id, c.E, c.dist, c.gemm, c.op, c.K, c.N, c.rows, c.rmax, be, r.picked or "-", f("%.4f", r.ms),
    f("%.2f", r.tflops), r.wrong }
end
-- the CSV row by row as the cases are measured (a run cut short keeps what it measured)
local live = not measured and bench.csv.writer(h:path("grouped-" .. h.tag .. ".csv"), CSV_COLS)
local tbl = h:table({ { "case", "%-22s" }, { "rows", "%6d" }, { "backend", "%-8s" }, { "ran", "%-6s" },
  { "ms", "%9.3f" }, { "TFLOP/s", "%8.1f" }, { "#wrong", "%6d" } })
tbl:header(string.format("dl.gemm.grouped, %s, bf16, %s", gpu, dl.build_info()))
for ci, c in ipairs(cases) do
  results[c.id] = {}
  local bufs = not measured and buffers(c)
  local timed = {}
  for _, be in ipairs(BACKENDS) do
    local r
    if measured then
      local m = measured[c.id .. "|" .. be] -- none: the measuring run was cut short before it
      r = m and { ms = bench.csv.number(m.ms), wrong = h:check(tonumber(m.wrong)), picked = m.ran }
        or { wrong = 0, picked = "not measured" }
    else
      local call, picked = call_of(c, bufs, be)
      local ms = bench.timing.events(call, { warmup = 0, iters = A.iters, warm_ms = A.warm_ms, min_ms = A.min_ms }).median
      r = { ms = ms, call = call, picked = picked() or "-" }
      timed[#timed + 1] = be
    end
    r.tflops = r.ms and c.flops / (r.ms * 1e-3) / 1e12
    results[c.id][be] = r
  end
  -- after timing: one reference per case, each backend's check on its own power of two
  if not measured then
    local ref, picks, n_out = reference(c, bufs, 1000003 + 16 * ci)
    for j, be in ipairs(timed) do
      local r, f = results[c.id][be], FACTORS[(j - 1) % #FACTORS + 1]
      r.wrong = h:verify { what = c.id .. " " .. be,
        fresh = function() bufs.a:copy_(bufs.a0):mul_(f) end,
        poison = { bufs.out }, run = r.call,
        check = function()
          return verify.close(got_rows(bufs, picks, n_out), ref:clone():mul_(f), gemm_check.tol("bf16"))
        end }
    end
    bufs = nil
    collectgarbage("collect")
  end
  for _, be in ipairs(BACKENDS) do
    local r = results[c.id][be]
    tbl:row({ c.id, c.rows, be, r.picked or "-", r.ms, r.tflops, r.wrong })
    if live then live:row(csv_row(c, be, r)) end
  end
end
if live then live:close() end

-- ---- the results file -------------------------------------------------------------------

local csv_rows, md_rows, met, judged = {}, {}, 0, 0
for _, c in ipairs(cases) do
  local res = results[c.id]
  for _, be in ipairs(BACKENDS) do csv_rows[#csv_rows + 1] = csv_row(c, be, res[be]) end
  -- torch's best path that ran, and ours: auto, and the best backend
  local tbest, tpath
  for _, p in ipairs(PATHS) do
    local t = torch[c.id] and torch[c.id][p]
    if t and t.ms and (not tbest or t.ms < tbest) then tbest, tpath = t.ms, p end
  end
  local auto = res.auto
  local best, bname
  for _, be in ipairs(BACKENDS) do
    local r = res[be]
    if be ~= "auto_dev" and r.ms and (not best or r.ms < best) then best, bname = r.ms, be end
  end
  local ratio = tbest and auto and auto.ms and tbest / auto.ms
  local bratio = tbest and best and tbest / best
  if ratio then judged, met = judged + 1, met + (ratio >= TARGET and 1 or 0) end
  local cells = { c.E, c.dist, c.gemm, c.op, c.rows }
  for _, be in ipairs(BACKENDS) do
    local r = res[be]
    cells[#cells + 1] = f("%.1f", r.tflops) .. ((be == "auto" or be == "auto_dev") and r.picked and r.picked ~= "-"
      and (" (" .. r.picked .. ")") or "")
  end
  for _, p in ipairs(PATHS) do
    local t = torch[c.id] and torch[c.id][p]
    cells[#cells + 1] = t and t.ms and (f("%.1f", c.flops / (t.ms * 1e-3) / 1e12) .. (t.wide and "*" or ""))
      or (t and t.status and "failed" or "—")
  end
  cells[#cells + 1] = f("%.3f", ratio)
  cells[#cells + 1] = bratio and string.format("%.3f (%s)", bratio, bname) or "—"
  cells[#cells + 1] = ratio and (ratio >= TARGET and "met" or "below") or "—"
  local wrong = 0
  for _, be in ipairs(BACKENDS) do wrong = wrong + (res[be].wrong or 0) end
  cells[#cells + 1] = wrong
  md_rows[#md_rows + 1] = cells
end
local head = { "E", "rows/expert", "GEMM", "op", "rows" }
for _, be in ipairs(BACKENDS) do head[#head + 1] = be .. " TF/s" end
for _, p in ipairs(PATHS) do head[#head + 1] = "torch " .. p .. " TF/s" end
for _, x in ipairs { "auto / torch best", "best backend / torch best", "target", "#wrong" } do head[#head + 1] = x end
local lines = { string.format("TFLOP/s = 2 (rows) K N / time, rows = the sum of the counts; time: the median of at least "
  .. "%d calls and %g ms of work, each call between two device events, after %g ms of warm-up calls; torch's paths "
  .. "timed the same way by `experiments/gemm/grouped_torch.py` in the same device call, %d time(s) (before and after "
  .. "dl.gemm.grouped; the mean, or the fastest run where they are more than %.0f%% apart: *). up: K = %d, N = %d; down: K = %d, N = %d. Ratios: torch's best path's time over "
  .. "ours (>= %.2f: the target of issue 55). auto / auto_dev: in brackets the backend auto ran.", A.iters, A.min_ms,
  A.warm_ms, nruns, (bench.timing.ANCHOR_WIDE - 1) * 100, A.hidden, A.ffn, A.ffn, A.hidden, TARGET), "" }
for _, l in ipairs(bench.markdown.table(head, md_rows)) do lines[#lines + 1] = l end
local notes = {}
for _, c in ipairs(cases) do
  for _, p in ipairs(PATHS) do
    local t = torch[c.id] and torch[c.id][p]
    if t and t.status and t.status ~= "ok" then notes[#notes + 1] = string.format("- torch %s, %s: %s", p, c.id, t.status) end
  end
end
if #notes > 0 then
  lines[#lines + 1] = ""
  for _, l in ipairs(notes) do lines[#lines + 1] = l end
end
local st = dl.gemm.stats()
local function ver(v) return string.format("%d.%d.%d", math.floor(v / 10000), math.floor(v / 100) % 100, v % 100) end
-- the build and the libraries: this run's, or with --measured (this process timed nothing) the timed
-- run's lines from its results file, and who timed and who assembled
local head = { "build: " .. dl.build_info(),
  (st.version > 0 and ("cuBLASLt " .. ver(st.version)) or "cuBLASLt not loaded") .. ", " ..
    (st.cublas_version > 0 and ("cuBLAS " .. ver(st.cublas_version)) or "cuBLAS not loaded") ..
    " (cublas: cublasGemmGroupedBatchedEx, one problem per expert, experts of one shape one group; loop: "
    .. "cublasLtMatmul per expert, the heuristic's first fp32-partials algorithm, cached; experts of one shape and "
    .. "evenly spaced one strided-batched call, the fastest of the heuristic's first 8 that agrees with its first, "
    .. "timed at the shape's first call; loop4: over 4 side streams, the largest first; auto: "
    .. "core/ops/gemm/grouped.c's rule)" }
if A.measured then
  local timed, adopted = h:adopt_timed(A.measured, { "^%- build: ", "^%- cuBLASLt " })
  if timed then head = adopted end
end
local extra = { "counts: Lua lists (no device read), but auto_dev: an int32 tensor on the device (read back, a wait per call)",
  "torch: " .. (torch_about or "not run (no --torch)"),
  "data checked after timing: per row and backend, fresh inputs scaled by a power of two of its own, out poisoned, "
    .. "3 rows of 3 experts against the fp64 product on the host: elements within 2u |ref| + 2u rms, normwise 1.5u, "
    .. "bias 2^-10 (#wrong, summed over the backends)" }
for i, l in ipairs(head) do table.insert(extra, i, l) end
local path = h:markdown("grouped-" .. h.tag .. ".md", "dl.gemm.grouped vs torch's grouped GEMM (bf16)", lines, extra)
h:csv("grouped-" .. h.tag .. ".csv", CSV_COLS, csv_rows)
print("wrote " .. path .. " and .csv")
if judged > 0 then
  print(string.format("target (auto >= %.2f x torch's best): met at %d of %d rows", TARGET, met, judged))
end
h:finish()
