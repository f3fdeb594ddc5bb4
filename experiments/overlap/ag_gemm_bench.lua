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
--     --plant F                a test of the data check: scale every variant's C by 1 + F after
--                              timing (default 0; 0.02 must make the run fail)
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
-- over runs: TFLOP/s = 2 m n k / time. Data after timing (#wrong, summed
-- over ranks; any makes the exit code non-zero): C_ref, the GEMM of the
-- gathered A (each rank draws every rank's shard: Philox), checked on two
-- rows against the fp64 CPU twin. All-gather: every variant's first and
-- last rows of each rank's block against C_ref, 2^-7 relative + 2^-7 rms
-- absolute (both are fp32 sums of the same products rounded once: they
-- differ by at most 2u |C| = 2^-7 |C| and fp32 order terms).
-- Reduce-scatter: each rank's first and last rows against want = sum_p P_p,
-- P_p = A[row, slice p] @ B[slice p, :] the d partial rows (slice p: the k/d
-- columns of A and rows of B that rank p owns), summed in fp32 on the device
-- (1 x k/d x n GEMMs), in fp64 on the host; S = sum_p |P_p|. An element is
-- wrong beyond
--   |got - want| <= (2d - 1) u S + u |want| + (k/d + 4) 2^-20 sum_p rms(P_p)
-- (u = 2^-8 for bf16, 2^-11 for f16; rms over the row). The result is d
-- partials rounded to C's dtype and summed by d - 1 additions, each rounded
-- to C's dtype too (NCCL's ring and ours; p2p rounds only the partials and
-- the final fp32 sum), every rounded value at most S to first order: d u S
-- (1 + u)^d in all. The bound allows twice that count, for a summation we
-- did not foresee, which also covers the fp32 epilogue and reduce additions
-- (<= d 2^-23 S). The last term: the kernel's fp32 partial and our P_p add
-- the same k/d exact products in different orders, each of k/d + 4
-- additions off by at most 2^-23 of its running sum; for these zero-mean
-- random inputs a running sum is a random walk whose mean size along the
-- way is about rms(P_p) / 2, and the term allows 4 rms(P_p) with the errors
-- of all additions aligned, twice (theirs and ours). The worst case of
-- spec/gemm_ref.lua, running sums as large as sum |a||b|, is not a useful
-- bound here: 2 (k/d + 4) 2^-23 sum |a||b| is about 10 for a typical
-- element at k = 16k, d = 4, twice the rounding terms. A row whose
-- normwise error ||got - want|| / ||want|| exceeds 4u (2^-6 for bf16) is
-- wrong as a whole (all n elements): roundings to nearest err
-- independently, each with rms at most u |x| / sqrt(3), and with
-- independent partials the j-partial sums have norm ||want|| sqrt(j / d),
-- so the model's normwise error is u sqrt((1 + (d + 2)(d - 1) / (2d)) / 3):
-- 0.82u, 1.04u, 1.34u at d = 2, 4, 8 (p2p: 0.82u at any d); 4u is three
-- times that at d = 8, and a 2% error (5.1u, adding in quadrature to the
-- rest) breaks it: --plant 0.02 (a test option: every variant's C scaled
-- by 1.02 after timing, before its check) must exit non-zero.
local dl = require "distlab"
local bench = dl.bench

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
    { "plant", "number", 0, "test of the data check: scale every variant's C by 1 + F after timing", meta = "F" },
  },
}
local A = h.opt
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

-- C's first and last row of every rank's block against ref: wrong elements
local function check_rows(c, ref, rows)
  local bad = 0
  for p = 0, d - 1 do
    for _, r in ipairs { p * rows + 1, (p + 1) * rows } do
      local got, want = c:narrow(1, r, 1):to("cpu"):f64(), ref:narrow(1, r, 1):to("cpu"):f64()
      local rms = math.sqrt(dl.compare(got, want).sum_sq_ref / want:numel())
      bad = bad + tonumber(dl.compare(got, want, 2 ^ -7 * rms, 2 ^ -7).n_not_close)
    end
  end
  return bad
end

-- C_ref against the CPU twin on two rows
local function check_ref(full, b, ref)
  local hb, bad = b:to("cpu"), 0
  for _, r in ipairs { 1, full:size(1) } do
    local want = dl.gemm(full:narrow(1, r, 1):to("cpu"), hb, { out_dtype = "f32" }):f64()
    local got = ref:narrow(1, r, 1):to("cpu"):f64()
    local rms = math.sqrt(dl.compare(got, want).sum_sq_ref / want:numel())
    bad = bad + tonumber(dl.compare(got, want, 2 ^ -7 * rms, 2 ^ -7).n_not_close)
  end
  return bad
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

-- gemm_rs: the reference of rank me's checked rows (1 and `rows` of its block): the d
-- partial rows P_p in fp32 on the device, summed on the host in fp64 (see the header)
local function rs_refs(full, bfull, rows, kd)
  local refs = {}
  for _, r in ipairs { 1, rows } do
    local arow = full:narrow(1, me * rows + r, 1)
    local ref = { r = r, want = {}, S = {}, rms = 0 }
    for p = 0, d - 1 do
      local P = dl.gemm(arow:narrow(2, p * kd + 1, kd), bfull:narrow(1, p * kd + 1, kd), { out_dtype = "f32" })
        :tolist()[1]
      local sq = 0
      for j, x in ipairs(P) do
        ref.want[j], ref.S[j] = (ref.want[j] or 0) + x, (ref.S[j] or 0) + math.abs(x)
        sq = sq + x * x
      end
      ref.rms = ref.rms + math.sqrt(sq / #P)
    end
    refs[#refs + 1] = ref
  end
  return refs
end

-- gemm_rs: this rank's checked rows of C against refs: elements beyond their bound, and
-- every element of a row beyond the normwise bound; a line per bad row on stderr
local U = { bf16 = 2 ^ -8, f16 = 2 ^ -11 }
local function check_rs(c, refs, kd, label)
  local u, bad = U[A.dtype], 0
  for _, ref in ipairs(refs) do
    local got = c:narrow(1, ref.r, 1):tolist()[1]
    local e32 = (kd + 4) * 2 ^ -20 * ref.rms
    local over, diff2, want2, first = 0, 0, 0, nil
    for j, g in ipairs(got) do
      local w, s = ref.want[j], ref.S[j]
      local e = g == g and math.abs(g - w) or math.huge
      local bound = (2 * d - 1) * u * s + u * math.abs(w) + e32
      diff2, want2 = diff2 + e * e, want2 + w * w
      if not (e <= bound) then
        over = over + 1
        first = first or string.format("[%d] got %.6g want %.6g (bound %.3g)", j, g, w, bound)
      end
    end
    local norm = want2 > 0 and math.sqrt(diff2 / want2) or math.sqrt(diff2)
    if not (norm <= 4 * u) then over = #got end
    if over > 0 then
      io.stderr:write(string.format("ag_gemm_bench: rank %d, %s, row %d of its block: normwise %.3g (bound %.3g), " ..
        "%d of %d elements wrong%s\n", me, label, ref.r, norm, 4 * u, over, #got, first and (", first " .. first) or ""))
    end
    bad = bad + over
  end
  return bad
end

local tbl = h:table({ { "m", "%6d" }, { "row", "%-36s" }, { "ms", "%9.3f" }, { "TFLOP/s", "%8.1f" },
  { "vs nccl", "%7.2f" }, { "#wrong", "%6d" } })
tbl:header(string.format("%s, %s, k = %d, n = %d, %s", RS and "GEMM + reduce-scatter" or "all-gather + GEMM",
  h.device_desc, A.k, A.n, A.dtype))
if RS and A.k % d ~= 0 then dl.fail("ag_gemm_bench: k = %d does not split over %d ranks", A.k, d) end
-- the dl.overlap op of variant v (the main pass and the interleaved pairs)
local function make_op(v)
  return (RS and dl.overlap.gemm_rs or dl.overlap.ag_gemm) { comm = w, algo = v.algo, transport = v.transport,
    copy = v.copy, streams = v.streams, copy_blocks = A.copy_blocks, merge = v.merge }
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
  local ref = dl.empty({ m, A.n }, { dtype = A.dtype, device = dev })
  dl.gemm(full, bfull, ref)
  local a, b, c, local_c, refs
  if RS then -- rank me's columns of A and rows of B
    a = full:narrow(2, me * kd + 1, kd):contiguous()
    b = bfull:narrow(1, me * kd + 1, kd):contiguous()
    c = dl.empty({ rows, A.n }, { dtype = A.dtype, device = dev })
    local_c = dl.empty({ m, A.n }, { dtype = A.dtype, device = dev })
    refs = rs_refs(full, bfull, rows, kd)
  else
    a = full:narrow(1, me * rows + 1, rows):clone()
    b = bfull
    c = dl.empty({ m, A.n }, { dtype = A.dtype, device = dev })
  end
  local base
  local function row(name, ms, wrong)
    local r = { m = m, row = name, ms = ms, tflops = ms and flops / (ms * 1e-3) / 1e12, wrong = wrong }
    if name == BASELINE then base = r.tflops end
    r.vs = base and r.tflops and r.tflops / base
    results[#results + 1] = r
    tbl:row({ m, name, ms, r.tflops, r.vs, wrong })
  end
  -- the GEMM alone: ag, on the gathered A (its result, ref, is every check's reference);
  -- rs, this rank's partial product, the work each rank does without the communication
  -- (b is bfull for ag); timed first, again after the pipelines, and in the interleaved pairs
  local alone = RS and function() dl.gemm(a, b, local_c) end or function() dl.gemm(full, b, ref) end
  row(RS and "gemm (alone, local A B)" or "gemm (alone, gathered A)", time_ms(alone), h:check(check_ref(full, bfull, ref)))
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
      local ms = time_ms(function() for _, x in ipairs(views) do dl.gemm(x[1], b, x[2]) end end)
      return ms, h:check(check_rows(c, ref, rows)), names
    end
    local each = {}
    for p = 1, d do each[p] = rows end
    local ms, bad, names = parts(each)
    row("gemm parts, p2p: " .. (d == 2 and names[1] .. " + " .. names[2] or d .. " x " .. rows), ms, bad)
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
          ms, bad, names = parts(list)
          row("gemm parts, merge: " .. table.concat(names, " + ", 1, math.min(#names, 2)) ..
            (d > 2 and (" + " .. (d - 2) .. " x " .. rows) or ""), ms, bad)
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
    local op = make_op(v)
    local fn = function() op:run(a, b, c) end
    fn()
    fn()
    op:check()
    local t = time_ms(fn)
    op:check()
    if A.plant ~= 0 then c:mul_(1 + A.plant) end
    row(op:label(), t, h:check(RS and check_rs(c, refs, kd, op:label()) or check_rows(c, ref, rows)))
    results[#results].variant = v
    op:free()
    collectgarbage("collect")
    ::next_variant::
  end
  -- the GEMM alone once more, after the pipelines: minutes of GEMMs at full power may have
  -- moved the clocks since the first row (PyTorch's anchors ran before this process)
  row("gemm (alone, again at the end)", time_ms(alone), h:check(check_ref(full, bfull, ref)))
  -- the fastest --interleave pipelines again, each alternating run by run with the GEMM
  -- alone: "of GEMM alone" from seconds of the same clocks (the rows above are minutes
  -- apart, and a GPU at its power limit moves several percent in that time)
  local ranked = {}
  for _, r in ipairs(results) do
    if r.m == m and r.variant and r.variant.algo ~= BASELINE and r.tflops then ranked[#ranked + 1] = r end
  end
  table.sort(ranked, function(x, y) return x.tflops > y.tflops end)
  for i = 1, math.min(A.interleave, #ranked) do
    local op = make_op(ranked[i].variant)
    local fb = function() op:run(a, b, c) end
    fb()
    op:check()
    local ga, pb, ratio = time_pair(alone, fb)
    op:check()
    if A.plant ~= 0 then c:mul_(1 + A.plant) end
    local bad = h:check(RS and check_rs(c, refs, kd, op:label()) or check_rows(c, ref, rows))
    if not RS then bad = bad + h:check(check_ref(full, bfull, ref)) end -- the GEMM alone wrote ref
    inter[#inter + 1] = { m = m, row = op:label(), gemm_ms = ga, ms = pb, of_gemm = 1 / ratio,
      gemm_tflops = flops / (ga * 1e-3) / 1e12, tflops = flops / (pb * 1e-3) / 1e12, wrong = bad }
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
  a, b, bfull, full, ref, c, local_c, refs = nil, nil, nil, nil, nil, nil, nil, nil
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
        f("%.1f%%", 100 * r.of_gemm), r.wrong }
      csv_rows[#csv_rows + 1] = { m, A.k, A.n, d, "interleaved: " .. r.row, f("%.4f", r.ms), f("%.2f", r.tflops), r.wrong }
      csv_rows[#csv_rows + 1] = { m, A.k, A.n, d, "interleaved: gemm alone, with " .. r.row, f("%.4f", r.gemm_ms),
        f("%.2f", r.gemm_tflops), r.wrong }
    end
  end
  if #ic > 0 then
    md[#md + 1] = string.format("The fastest %d pipelines again, each run alternating with a run of the GEMM alone " ..
      "(%d pairs after warm-up pairs filling %g ms; \"of GEMM alone\": the median of the pairs' ratios):", #ic,
      A.iters, A.warm_ms)
    md[#md + 1] = ""
    for _, l in ipairs(bench.markdown.table({ "pipeline", "ms", "TFLOP/s", "GEMM alone ms", "GEMM alone TFLOP/s",
      "of GEMM alone", "#wrong" }, ic)) do
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
local extra = { "build: " .. dl.build_info(), "cuBLASLt tuning: " .. ((tonumber(os.getenv("DISTLAB_GEMM_TUNE") or "0") or 0) > 1
  and ("DISTLAB_GEMM_TUNE=" .. os.getenv("DISTLAB_GEMM_TUNE") .. " (each shape's fastest of that many candidates)")
  or "off (each shape's first heuristic candidate)"), "torch: " .. (torch_note or (A.torch and ((next(torch) and
  select(2, next(torch)).torch) or "its CSV had no rows") or "not run (no --torch)")) }
if h.rank0 then
  local path = h:markdown(FILE .. h.tag .. ".md", RS and "GEMM + reduce-scatter (dl.overlap.gemm_rs)" or
    "All-gather + GEMM (dl.overlap.ag_gemm)", md, extra)
  h:csv(FILE .. h.tag .. ".csv", { "m", "k", "n", "ranks", "row", "ms", "tflops", "wrong_or_status" }, csv_rows)
  print("wrote " .. path .. ", .csv, .dat" .. (png and " and .png" or " (no plot: no gnuplot here)"))
end
h:finish()
