-- experiments/overlap/ag_gemm_bench.lua — all-gather + GEMM (seed 003): C =
-- all_gather(A) @ B with A [m, k] sharded by rows over the d ranks, B [k, n]
-- on every rank; m in {8k, 16k, 32k}, k = 16k, n = 8k, bf16 by default.
-- --op gemm_rs times the mirror, GEMM + reduce-scatter: C = reduce_scatter(A
-- @ B) with A [m, k] sharded by columns and B [k, n] by rows over the ranks,
-- C [m/d, n] on each (rows: the local GEMM alone, gemm_then_nccl, every
-- dl.overlap.gemm_rs variant; anchors: fused_matmul_reduce_scatter, matmul
-- then NCCL reduce_scatter; TFLOP/s per GPU = 2 m n k / d / time).
-- Rows: the GEMM alone on the full (gathered) A, the nccl_then_gemm baseline,
-- every dl.overlap.ag_gemm variant (p2p and ring x get and put x ce and sm x
-- the stream counts, and p2p with merge), the GEMMs of the p2p and merge
-- chunks alone ("gemm parts": back to back on one stream, no communication), and PyTorch's anchors from the same run (--torch, the
-- CSV of experiments/overlap/ag_gemm_torch.py: torch.ops.symm_mem.
-- fused_all_gather_matmul without multicast, NCCL all_gather_into_tensor then
-- torch.matmul, and torch.matmul alone).
--
--   ./distlab run -n 8 --device cuda experiments/overlap/ag_gemm_bench.lua [options]
--     --m LIST --k K --n N     sizes (default 8K,16K,32K, 16K, 8K; m a multiple of d)
--     --streams LIST           stream counts of the variants (default 1,2,3)
--     --algos, --transports, --copies   which variants (default all)
--     --copy-blocks B          the sm copy's grid (default 16)
--     --merge LIST             ag p2p rows with merge (off: none; auto: the default head; a number: the
--                              head's rows, no row where the shard has fewer; default off,auto,5632):
--                              dl.overlap.ag_gemm's merge option, our shard's GEMM split into a head and
--                              a part merged with the neighbour's (overlap/ag_p2p_merge.lua)
--     --merge-copies LIST      the copies of the merge rows (default ce: sm lost at every size on H200);
--                              merge rows at the --streams counts of 2 and more (at 1 the transfer waits
--                              for the head)
--     --iters N                timed runs per row (default 10)
--     --warm-ms MS             warm-up runs per row filling MS (default 300: the same count on
--                              every rank, from the slowest rank's estimate)
--     --torch CSV              ag_gemm_torch.py's CSV from the same run (missing: a note, no anchors)
--     --interleave N           the fastest N pipelines of each m timed again, run by run alternating
--                              with the GEMM alone, their ratio the median of the pairs' (default 3; 0: not):
--                              "of GEMM alone" from the same seconds' clocks (2 H100s at their power
--                              limit moved 7-15% between rows minutes apart)
--     --gemm-ref CSV           gemm_bench.lua's CSV from the same device call, on the GEMM alone's shape
--                              (ag: m x k x n; gemm_rs: m x k/d x n): dl.gemm and torch.matmul timed
--                              there with torch.matmul before and after dl.gemm (the anchor their mean),
--                              DISTLAB_GEMM_TUNE set for both runs. "of the best GEMM alone" = "of GEMM
--                              alone" x min(1, torch.matmul / dl.gemm time there): the pairs above give
--                              the pipeline against dl.gemm in the same seconds, gemm_bench gives dl.gemm
--                              against torch.matmul interleaved the same way (experiments/overlap/ag_gemm_ref.sh
--                              runs both in one device call)
--     --quick                  m = 4d, k = 64, n = 32, 2 timed runs, no warm-up (a check that every
--                              row runs and checks); --plant noop|scale=X puts an error into every
--                              timed callable (each row's), which the data check must report
--     --out DIR, --tag NAME    default experiments/results/overlap, the GPU model and d (h100x8)
-- DISTLAB_GEMM_TUNE=N in the environment (core/ops/gemm/cublaslt.c) times cuBLASLt's first N
-- candidates of each GEMM shape at its first call and keeps the fastest: the GEMM alone is
-- tuned in its row, every chunk of the p2p and merge pipelines in the "gemm parts" rows,
-- which run before the pipelines for that reason (the GPU otherwise idle).
-- Writes DIR/ag-gemm-TAG.{md,csv} and DIR/ag-gemm-TAG.png (gnuplot, where it exists);
-- gemm-rs-TAG.* with --op gemm_rs.
-- With ranks sharing a GPU it runs as a smoke test (the harness says so and
-- writes into experiments/results/ only with --shared-results).
--
-- Method: per timed run a barrier (every rank's host arrives), an event, the
-- run, an event, a wait; per run the slowest rank's time, then the median
-- over runs: TFLOP/s = 2 m n k / time.
--
-- Data after every row's timing (#wrong, summed over ranks; any makes the
-- exit code non-zero): the row's timed callable once more into its output
-- poisoned, on inputs none of its timed runs saw, against the fp64 product
-- on the host at rows spread over C; distlab.bench.gemm_check says how and
-- within which bounds (--plant scale=0.01 breaks them at every d; --plant
-- noop leaves the poison).
local dl = require "distlab"
local bench = dl.bench
local gemm_check = require "distlab.bench.gemm_check"

local w = dl.comm.world()
local d, me = w.size, w.rank
local h = bench.harness {
  name = "ag_gemm_bench", family = "overlap", comm = w, tag = true,
  usage = "./distlab run -n 8 --device cuda experiments/overlap/ag_gemm_bench.lua [options]",
  about = "all-gather + GEMM TFLOP/s: GEMM alone, nccl_then_gemm, every dl.overlap.ag_gemm variant, PyTorch; "
    .. "see the file's header",
  options = {
    { "op", "choice", "ag_gemm", "all-gather + GEMM, or its mirror GEMM + reduce-scatter",
      values = { "ag_gemm", "gemm_rs" } },
    { "m", "sizes", "8K,16K,32K", "rows of the gathered A (gemm_rs: of A and of the GEMM's result)", meta = "LIST" },
    { "k", "size", "16K", "columns of A, rows of B" },
    { "n", "size", "8K", "columns of B" },
    { "dtype", "choice", "bf16", "A, B and C", values = { "bf16", "f16" } },
    { "streams", "list", "1,2,3", "stream counts of the variants", meta = "LIST" },
    { "algos", "list", "p2p,ring", "schedules", values = { "p2p", "ring" } },
    { "transports", "list", "get,put", "transports", values = { "get", "put" } },
    { "copies", "list", "ce,sm", "copies", values = { "ce", "sm" } },
    { "copy-blocks", "int", 16, "blocks of the sm copy kernel" },
    { "merge", "list", "off,auto,5632", "ag p2p with merge: off, auto, or the head's rows", meta = "LIST" },
    { "merge-copies", "list", "ce", "copies of the merge rows", values = { "ce", "sm" } },
    { "iters", "int", 10, "timed runs per row" },
    { "warm-ms", "number", 300, "warm-up work per row (ms), after 2 runs that estimate it" },
    { "torch", "string", nil, "ag_gemm_torch.py's CSV from the same run", meta = "CSV" },
    { "interleave", "int", 3, "the fastest N pipelines of each m timed again, run by run alternating with the " ..
      "GEMM alone (0: not)", meta = "N" },
    { "gemm-ref", "string", nil, "gemm_bench.lua's CSV of the same device call (dl.gemm and torch.matmul on the " ..
      "GEMM alone's shape): \"of the best GEMM alone\" beside \"of GEMM alone\"", meta = "CSV" },
  },
}
local A = h.opt
if h.quick then -- the smallest case, unless the line says otherwise
  for key, v in pairs { m = { 4 * d }, k = 64, n = 32, iters = 2, warm_ms = 0, interleave = 1 } do
    if not h.given[key] then A[key] = v end
  end
end
local dev = w.device
local gpu = dev:match("^cuda") and dl.cuda_device_name(tonumber(dev:match("%d+")) or 0) or dev
h.device_desc = string.format("%s x %d (%s communicator%s)", gpu, d, w.backend,
  (w.share or 1) > 1 and (", " .. w.share .. " ranks a GPU: a smoke run") or "")

-- per timed run the slowest rank's ms, the median over runs; before them, runs filling
-- --warm-ms (a count every rank agrees on: the slowest rank's estimate from 2 runs), so
-- that 2 warm-up runs of a 3 ms GEMM do not leave the clocks where the last row put them
local function time_ms(fn)
  local est = 0
  for _ = 1, 2 do
    est = math.max(est, bench.timing.loop_once(fn, 1, { before = function() w:barrier() end, timeout = 600 }) / 1e3)
  end
  for _ = 1, math.ceil(A.warm_ms / math.max(h:max(est), 1e-3)) do fn() end
  local per = {}
  for i = 1, A.iters do per[i] = bench.timing.loop_once(fn, 1, { before = function() w:barrier() end,
    timeout = 600 }) / 1e3 end
  return bench.stats(h:max(per)).median
end

-- fa and fb alternating, run by run (each after a barrier; warm-up pairs filling
-- --warm-ms first): the medians of each one's per-run slowest-rank times and the
-- median of the per-pair ratios b / a, so both see the clocks of the same seconds
local function time_pair(fa, fb)
  local once = function(fn)
    return bench.timing.loop_once(fn, 1, { before = function() w:barrier() end, timeout = 600 }) / 1e3
  end
  local est = h:max(once(fa) + once(fb))
  for _ = 1, math.ceil(A.warm_ms / math.max(est, 1e-3)) do
    fa()
    fb()
  end
  local ta, tb = {}, {}
  for i = 1, A.iters do
    ta[i], tb[i] = once(fa), once(fb)
  end
  ta, tb = h:max(ta), h:max(tb)
  local ratio = {}
  for i = 1, A.iters do ratio[i] = tb[i] / ta[i] end
  return bench.stats(ta).median, bench.stats(tb).median, bench.stats(ratio).median
end

-- PyTorch's rows: a CSV that is missing or empty (its run failed) leaves them out, and the
-- output says so; one of another kind is an error
local torch, torch_note = {}, nil
if A.torch then
  local head, recs = bench.csv.read(A.torch)
  if not head then
    torch_note = string.format("no PyTorch anchors: cannot read %s (%s)", A.torch, tostring(recs))
    h:print("ag_gemm_bench: %s; the other rows run", torch_note)
  elseif head[1] ~= "impl" then
    dl.fail("ag_gemm_bench: %s is not ag_gemm_torch.py's CSV", A.torch)
  else
    for _, r in ipairs(recs) do torch[r.impl .. "/" .. r.m] = r end
  end
end
local RS = A.op == "gemm_rs"

-- The GEMM alone's reference (--gemm-ref): gref[m] = {dl =, torch = ms} from gemm_bench's CSV, rows of
-- the GEMM alone's shape (k/d columns for gemm_rs), whose torch.matmul ran before and after dl.gemm
local gref, gref_note = {}, nil
if A.gemm_ref then
  local head, recs = bench.csv.read(A.gemm_ref)
  if not head or head[1] ~= "m" or not head[7] or head[7] ~= "torch_ms" then
    dl.fail("ag_gemm_bench: --gemm-ref %s is not gemm_bench.lua's CSV (%s)", A.gemm_ref, tostring(recs))
  end
  local k = RS and A.k / d or A.k
  for _, r in ipairs(recs) do
    local dms, tms = bench.csv.number(r.ms), bench.csv.number(r.torch_ms)
    if tonumber(r.k) == k and tonumber(r.n) == A.n and r.dtype == A.dtype and dms and tms then
      gref[tonumber(r.m)] = { dl = dms, torch = tms }
    end
  end
  gref_note = string.format("the faster of dl.gemm and torch.matmul on m x %d x %d, from %s (gemm_bench.lua's CSV of "
    .. "the same device call: torch.matmul the mean of a run before and one after dl.gemm)", k, A.n, A.gemm_ref)
end
local anchors = RS and { { "torch_matmul", "torch.matmul alone (local)" },
  { "torch_matmul_nccl", "torch: matmul + NCCL reduce_scatter" }, { "torch_fused", "torch: fused_matmul_reduce_scatter" } }
  or { { "torch_matmul", "torch.matmul alone" }, { "torch_nccl_matmul", "torch: NCCL all_gather + matmul" },
    { "torch_fused", "torch: fused_all_gather_matmul" } }
local BASELINE = RS and "gemm_then_nccl" or "nccl_then_gemm"

-- --merge: nil (off), true (auto) or the head's rows
local merges = {}
for _, x in ipairs(A.merge) do
  if x == "off" then merges[#merges + 1] = false
  elseif x == "auto" then merges[#merges + 1] = true
  elseif tonumber(x) and tonumber(x) >= 0 and tonumber(x) == math.floor(tonumber(x)) then merges[#merges + 1] = tonumber(x)
  else dl.fail("ag_gemm_bench: --merge takes off, auto or row counts, got %q", x) end
end
local variants = { { algo = BASELINE } }
for _, algo in ipairs(A.algos) do
  for _, merge in ipairs((algo == "p2p" and not RS) and merges or { false }) do
    for _, transport in ipairs(A.transports) do
      for _, copy in ipairs(merge and A.merge_copies or A.copies) do
        for _, s in ipairs(A.streams) do
          if not merge or tonumber(s) > 1 then
            variants[#variants + 1] = { algo = algo, transport = transport, copy = copy, streams = tonumber(s),
              merge = merge or nil }
          end
        end
      end
    end
  end
end

local tbl = h:table({ { "m", "%6d" }, { "row", "%-36s" }, { "ms", "%9.3f" }, { "TFLOP/s", "%8.1f" },
  { "vs nccl", "%7.2f" }, { "#wrong", "%6d" } })
tbl:header(string.format("%s, %s, k = %d, n = %d, %s", RS and "GEMM + reduce-scatter" or "all-gather + GEMM",
  h.device_desc, A.k, A.n, A.dtype))
if RS and A.k % d ~= 0 then dl.fail("ag_gemm_bench: k = %d does not split over %d ranks", A.k, d) end
-- the dl.overlap op of variant v (the main pass and the interleaved pairs)
-- planned for (a, b) at once, as a first run would: an op a planted noop never runs is set up too
local function make_op(v, a, b)
  local op = (RS and dl.overlap.gemm_rs or dl.overlap.ag_gemm) { comm = w, algo = v.algo, transport = v.transport,
    copy = v.copy, streams = v.streams, copy_blocks = A.copy_blocks, merge = v.merge }
  op:plan(a, b)
  return op
end

local results, inter = {}, {}
for _, m in ipairs(A.m) do
  if m % d ~= 0 then dl.fail("ag_gemm_bench: m = %d does not split over %d ranks", m, d) end
  local rows, kd = m / d, A.k / d
  -- every rank's work: ag the whole m x n x k GEMM; rs its k/d share of it
  local flops = 2 * m * A.n * A.k / (RS and d or 1)
  local bfull = dl.randn({ A.k, A.n }, { dtype = A.dtype, device = dev, seed = m * 64 + 63 })
  local full = dl.empty({ m, A.k }, { dtype = A.dtype, device = dev })
  for p = 0, d - 1 do full:narrow(1, p * rows + 1, rows):normal_(0, 1, m * 64 + p) end
  -- c_alone: the GEMM alone's result (ag: of the gathered A, [m, n]; rs: this rank's partial product)
  local c_alone = dl.empty({ m, A.n }, { dtype = A.dtype, device = dev })
  local a, b, c
  if RS then -- rank me's columns of A and rows of B
    a = full:narrow(2, me * kd + 1, kd):contiguous()
    b = bfull:narrow(1, me * kd + 1, kd):contiguous()
    c = dl.empty({ rows, A.n }, { dtype = A.dtype, device = dev })
  else
    a = full:narrow(1, me * rows + 1, rows):clone()
    b = bfull
    c = dl.empty({ m, A.n }, { dtype = A.dtype, device = dev })
  end
  -- the checks of this m: check(what, run, out, kind) (distlab.bench.gemm_check)
  local check = gemm_check.checker(h, { m = m, d = d, me = me, k = A.k, n = A.n, dtype = A.dtype, rs = RS,
    full = full, bfull = bfull, a = a, b = b })
  local ALONE, PIPE = RS and "local" or "ag", RS and "rs" or "ag"
  local base
  local function row(name, ms, wrong)
    local r = { m = m, row = name, ms = ms, tflops = ms and flops / (ms * 1e-3) / 1e12, wrong = wrong }
    if name == BASELINE then base = r.tflops end
    r.vs = base and r.tflops and r.tflops / base
    results[#results + 1] = r
    tbl:row({ m, name, ms, r.tflops, r.vs, wrong })
  end
  -- the GEMM alone: ag, on the gathered A; rs, this rank's partial product, the work each
  -- rank does without the communication (b is bfull for ag); timed first, again after the
  -- pipelines, and in the interleaved pairs
  local alone = h:planted(RS and function() dl.gemm(a, b, c_alone) end or function() dl.gemm(full, b, c_alone) end,
    { writes = { c_alone } })
  local ms = time_ms(alone)
  row(RS and "gemm (alone, local A B)" or "gemm (alone, gathered A)", ms, check("gemm alone", alone, c_alone, ALONE))
  -- where a pipeline's time goes: the GEMMs of its chunks alone, back to back on one stream,
  -- no communication (p2p: d GEMMs of m/d rows; merge: the head, the merged GEMM, d - 2 of
  -- m/d), into c; the pipeline's time over this row's is what the transfers cost it. Before
  -- the pipelines: with DISTLAB_GEMM_TUNE set, each chunk's GEMM is tuned here, the GPU
  -- otherwise idle, not at a pipeline's first run among its other GEMMs.
  if not RS and d > 1 then
    local function parts(list)
      local at, names, views = 0, {}, {}
      for _, n_rows in ipairs(list) do
        if n_rows > 0 then
          views[#views + 1] = { full:narrow(1, at + 1, n_rows), c:narrow(1, at + 1, n_rows) }
          names[#names + 1] = tostring(n_rows)
        end
        at = at + n_rows
      end
      local fn = h:planted(function() for _, x in ipairs(views) do dl.gemm(x[1], b, x[2]) end end,
        { writes = { c } })
      local ms = time_ms(fn)
      return ms, check("gemm parts " .. table.concat(names, "+"), fn, c, "ag"), names
    end
    local each = {}
    for p = 1, d do each[p] = rows end
    local ms2, bad, names = parts(each)
    row("gemm parts, p2p: " .. (d == 2 and names[1] .. " + " .. names[2] or d .. " x " .. rows), ms2, bad)
    -- the heads of the merge rows: an op set up (buffers, no run) says its head
    local seen = {}
    for _, mg in ipairs(merges) do
      if mg and not (type(mg) == "number" and mg > rows) then
        local op = dl.overlap.ag_gemm { comm = w, algo = "p2p", merge = mg }
        op:plan(a, b)
        local hd = op:info().head
        op:free()
        if hd < rows and not seen[hd] then
          seen[hd] = true
          local list = { hd, 2 * rows - hd }
          for _ = 3, d do list[#list + 1] = rows end
          ms2, bad, names = parts(list)
          row("gemm parts, merge: " .. table.concat(names, " + ", 1, math.min(#names, 2)) ..
            (d > 2 and (" + " .. (d - 2) .. " x " .. rows) or ""), ms2, bad)
        end
      end
    end
  end
  for _, v in ipairs(variants) do
    if type(v.merge) == "number" and v.merge > rows then
      if v.transport == "get" and v.streams == tonumber(A.streams[#A.streams]) then
        h:print("ag_gemm_bench: m = %d: no rows for merge %d (more than the shard's %d rows)", m, v.merge, rows)
      end
      goto next_variant
    end
    local op = make_op(v, a, b)
    local fn = h:planted(function() op:run(a, b, c) end, { writes = { c } })
    fn()
    fn()
    op:check()
    local t = time_ms(fn)
    op:check()
    local bad = check(op:label(), fn, c, PIPE)
    op:check()
    row(op:label(), t, bad)
    results[#results].variant = v
    op:free()
    collectgarbage("collect")
    ::next_variant::
  end
  -- the GEMM alone once more, after the pipelines: minutes of GEMMs at full power may have
  -- moved the clocks since the first row (PyTorch's anchors ran before this process)
  ms = time_ms(alone)
  row("gemm (alone, again at the end)", ms, check("gemm alone again", alone, c_alone, ALONE))
  -- the fastest --interleave pipelines again, each alternating run by run with the GEMM
  -- alone: "of GEMM alone" from seconds of the same clocks (the rows above are minutes
  -- apart, and a GPU at its power limit moves several percent in that time)
  local ranked = {}
  for _, r in ipairs(results) do
    if r.m == m and r.variant and r.variant.algo ~= BASELINE and r.tflops then ranked[#ranked + 1] = r end
  end
  table.sort(ranked, function(x, y) return x.tflops > y.tflops end)
  for i = 1, math.min(A.interleave, #ranked) do
    local op = make_op(ranked[i].variant, a, b)
    local fb = h:planted(function() op:run(a, b, c) end, { writes = { c } })
    fb()
    op:check()
    local ga, pb, ratio = time_pair(alone, fb)
    op:check()
    local bad = check("interleaved: " .. op:label(), fb, c, PIPE)
    op:check()
    bad = bad + check("interleaved: gemm alone", alone, c_alone, ALONE)
    local g = gref[m]
    inter[#inter + 1] = { m = m, row = op:label(), gemm_ms = ga, ms = pb, of_gemm = 1 / ratio,
      gemm_tflops = flops / (ga * 1e-3) / 1e12, tflops = flops / (pb * 1e-3) / 1e12, wrong = bad,
      t_over_dl = g and g.torch / g.dl, of_best = g and math.min(1, g.torch / g.dl) / ratio }
    tbl:row({ m, "interleaved: " .. op:label(), pb, flops / (pb * 1e-3) / 1e12, nil, bad })
    h:print("%6d   ... with the GEMM alone at %.3f ms (%.1f TFLOP/s): %.1f%% of it, run by run", m, ga,
      flops / (ga * 1e-3) / 1e12, 100 / ratio)
    op:free()
    collectgarbage("collect")
  end
  for _, an in ipairs(anchors) do
    local t = torch[an[1] .. "/" .. m]
    if t then
      local tms = bench.csv.number(t.ms)
      local r = { m = m, row = an[2], ms = tms, tflops = bench.csv.number(t.tflops), wrong = 0, status = t.status }
      r.vs = base and r.tflops and r.tflops / base
      results[#results + 1] = r
      tbl:row({ m, an[2], tms, r.tflops, r.vs, t.status == "ok" and 0 or nil })
    end
  end
  a, b, bfull, full, c, c_alone, check = nil, nil, nil, nil, nil, nil, nil
  collectgarbage("collect")
end

-- ---- results ----------------------------------------------------------------------------

local function f(fmt, x) return x and string.format(fmt, x) or "—" end
local what = RS and string.format("C = reduce_scatter(A @ B), A [m, %d] sharded by columns over %d ranks, B [%d, %d] " ..
  "by rows, C [m/%d, %d] on each; TFLOP/s per GPU = 2 m n k / %d / time", A.k, d, A.k, A.n, d, A.n, d)
  or string.format("C = all_gather(A) @ B, A [m, %d] sharded by rows over %d ranks, B [%d, %d]; TFLOP/s = 2 m n k / time",
    A.k, d, A.k, A.n)
local md = { string.format("%s, time = the median over %d timed runs of the slowest rank's time (each run after a " ..
  "barrier, after warm-up runs filling %g ms); \"vs nccl\": TFLOP/s over %s's. Variants: algo transport copy x " ..
  "streams (dl.overlap.%s)%s.", what, A.iters, A.warm_ms, BASELINE, A.op, RS and "" or
  ("; \"merge [H]\": p2p with the merge option, a head of H rows (none: the default head) multiplied first, the " ..
  "rest of the shard with the neighbour's in one GEMM; \"gemm parts\": the GEMMs of a pipeline's chunks alone, " ..
  "back to back on one stream, no communication (what the transfers cost a pipeline: its time over this)")), "" }
local csv_rows = {}
for _, m in ipairs(A.m) do
  local cells = {}
  local best
  for _, r in ipairs(results) do
    if r.m == m then
      cells[#cells + 1] = { r.row, f("%.3f", r.ms), f("%.1f", r.tflops), f("%.2f", r.vs), r.status or r.wrong }
      csv_rows[#csv_rows + 1] = { m, A.k, A.n, d, r.row, f("%.4f", r.ms), f("%.2f", r.tflops), r.status or r.wrong }
      if r.row:match("^p2p") or r.row:match("^ring") then
        if r.tflops and (not best or r.tflops > best.tflops) then best = r end
      end
    end
  end
  md[#md + 1] = string.format("## m = %d%s", m, best and string.format(" (best: %s, %.1f TFLOP/s)", best.row,
    best.tflops) or "")
  md[#md + 1] = ""
  for _, l in ipairs(bench.markdown.table({ "row", "ms", "TFLOP/s", "vs nccl", "#wrong / status" }, cells)) do
    md[#md + 1] = l
  end
  md[#md + 1] = ""
  local ic = {}
  for _, r in ipairs(inter) do
    if r.m == m then
      ic[#ic + 1] = { r.row, f("%.3f", r.ms), f("%.1f", r.tflops), f("%.3f", r.gemm_ms), f("%.1f", r.gemm_tflops),
        f("%.1f%%", 100 * r.of_gemm), f("%.3f", r.t_over_dl), f("%.1f%%", r.of_best and 100 * r.of_best), r.wrong }
      csv_rows[#csv_rows + 1] = { m, A.k, A.n, d, "interleaved: " .. r.row, f("%.4f", r.ms), f("%.2f", r.tflops), r.wrong }
      csv_rows[#csv_rows + 1] = { m, A.k, A.n, d, "interleaved: gemm alone, with " .. r.row, f("%.4f", r.gemm_ms),
        f("%.2f", r.gemm_tflops), r.wrong }
      if r.of_best then -- the best GEMM alone's time in the same seconds: dl.gemm's x min(1, torch / dl.gemm)
        local best_ms = r.gemm_ms * math.min(1, r.t_over_dl)
        csv_rows[#csv_rows + 1] = { m, A.k, A.n, d, "interleaved: best gemm alone, with " .. r.row, f("%.4f", best_ms),
          f("%.2f", r.gemm_tflops * r.gemm_ms / best_ms), r.wrong }
      end
    end
  end
  if #ic > 0 then
    md[#md + 1] = string.format("The fastest %d pipelines again, each run alternating with a run of the GEMM alone " ..
      "(%d pairs after warm-up pairs filling %g ms; \"of GEMM alone\": the median of the pairs' ratios):", #ic,
      A.iters, A.warm_ms)
    md[#md + 1] = ""
    if gref_note then
      md[#md + 1] = "\"torch / dl.gemm\": torch.matmul's time over dl.gemm's on the GEMM alone's shape (--gemm-ref); " ..
        "\"of the best GEMM alone\": \"of GEMM alone\" x min(1, that), the pipeline against the faster of the two."
      md[#md + 1] = ""
    end
    for _, l in ipairs(bench.markdown.table({ "pipeline", "ms", "TFLOP/s", "GEMM alone ms", "GEMM alone TFLOP/s",
      "of GEMM alone", "torch / dl.gemm", "of the best GEMM alone", "#wrong" }, ic)) do
      md[#md + 1] = l
    end
    md[#md + 1] = ""
  end
end

-- the plot: TFLOP/s against m for the GEMM alone, the baseline, the best p2p
-- and ring variants and the PyTorch anchors
local series = RS and { { "gemm (alone", "GEMM alone" }, { "gemm_then_nccl", "GEMM then nccl" },
  { "p2p", "best p2p" }, { "ring", "best ring" }, { "torch: fused", "torch fused" },
  { "torch: matmul", "torch matmul + NCCL" } } or { { "gemm (alone", "GEMM alone" }, { "nccl_then_gemm", "nccl then GEMM" },
  { "p2p", "best p2p" }, { "ring", "best ring" }, { "torch: fused", "torch fused" }, { "torch: NCCL", "torch NCCL + matmul" } }
local FILE = RS and "gemm-rs-" or "ag-gemm-"
local dat = { "# m " .. table.concat((function()
  local t = {}
  for i, s in ipairs(series) do t[i] = s[2]:gsub(" ", "_") end
  return t
end)(), " ") }
for _, m in ipairs(A.m) do
  local line = { tostring(m) }
  for i, s in ipairs(series) do
    local best
    for _, r in ipairs(results) do
      if r.m == m and r.row:sub(1, #s[1]) == s[1] and r.tflops and (not best or r.tflops > best) then best = r.tflops end
    end
    line[i + 1] = best and string.format("%.2f", best) or "NaN"
  end
  dat[#dat + 1] = table.concat(line, " ")
end
local png
if h.rank0 then
  local dat_path = h:path(FILE .. h.tag .. ".dat")
  bench.markdown.write(dat_path, dat)
  png = h:path(FILE .. h.tag .. ".png")
  local plots = {}
  for i, s in ipairs(series) do plots[i] = string.format("'%s' using 1:%d with linespoints title '%s'", dat_path, i + 1, s[2]) end
  local ok, note = bench.plot.gnuplot(table.concat({ "set terminal pngcairo size 900,560",
    "set output '" .. png .. "'", "set logscale x 2", "set xlabel 'm'", "set ylabel 'TFLOP/s'", "set key bottom right",
    string.format("set title '%s, %s, k=%d n=%d %s'", RS and "GEMM + reduce-scatter" or "all-gather + GEMM",
      h.device_desc:gsub("'", ""), A.k, A.n, A.dtype),
    "plot " .. table.concat(plots, ", ") }, "\n"), png)
  md[#md + 1] = ok and ("![TFLOP/s against m](" .. png:match("[^/]*$") .. ")") or ("(" .. note .. ")")
  if not ok then png = nil end
end
local extra = { "build: " .. dl.build_info(), string.format("data checked after every row's timing (#wrong): its timed " ..
  "callable once more into its output poisoned, on fresh inputs (new seeds a m, a power of two a check), rows " ..
  "spread over C (every rank's block) against the fp64 product on the host: elements within 2u |ref| + 2u rms, " ..
  "normwise %.2g%s, bias 2^-10 (u = 2^-%d)", RS and gemm_check.tol_rs(A.dtype, d).norm or
  gemm_check.tol(A.dtype).norm, RS and
  " and each element within its reduce-scatter bound (the file's header)" or "", A.dtype == "bf16" and 8 or 11),
  "cuBLASLt tuning: " .. ((tonumber(os.getenv("DISTLAB_GEMM_TUNE") or "0") or 0) > 1
  and ("DISTLAB_GEMM_TUNE=" .. os.getenv("DISTLAB_GEMM_TUNE") .. " (each shape's fastest of that many candidates)")
  or "off (each shape's first heuristic candidate)"), "torch: " .. (torch_note or (A.torch and ((next(torch) and
  select(2, next(torch)).torch) or "its CSV had no rows") or "not run (no --torch)")),
  "GEMM alone's reference: " .. (gref_note or "dl.gemm alone (no --gemm-ref)") }
if h.rank0 then
  local path = h:markdown(FILE .. h.tag .. ".md", RS and "GEMM + reduce-scatter (dl.overlap.gemm_rs)" or
    "All-gather + GEMM (dl.overlap.ag_gemm)", md, extra)
  h:csv(FILE .. h.tag .. ".csv", { "m", "k", "n", "ranks", "row", "ms", "tflops", "wrong_or_status" }, csv_rows)
  print("wrote " .. path .. ", .csv, .dat" .. (png and " and .png" or " (no plot: no gnuplot here)"))
end
h:finish()
