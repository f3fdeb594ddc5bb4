-- experiments/allreduce/allreduce_sweep.lua — the all-reduce table of seed 002
-- (vLLM's benchmark), on our machines: bf16, rows (32..4096) x 8192 (0.5 MB ..
-- 64 MB) plus 8 KB .. 256 KB and 128 MB .. 1 GB; columns one_shot, two_shot,
-- nccl, auto and "best (speedup vs nccl)", and more: the push variants, the
-- zero-copy variants (input already in the all-reduce's symmetric buffer),
-- auto_zc (auto on such an input: the table's zc_rows where it has them),
-- and the PyTorch anchors measured in the same run (--torch, the CSV of
-- experiments/allreduce/allreduce_torch.py).
--
--   ./distlab run -n 2 --device cuda experiments/allreduce/allreduce_sweep.lua [options]
--     --out DIR          results go to DIR/allreduce-TAG.{md,csv} (default experiments/results/allreduce)
--     --tag NAME         default: GPU model and rank count, e.g. h200x2
--     --torch FILE.csv   PyTorch anchors from the same run
--     --sizes LIST       bytes, e.g. 8K,64K,1M or 8K..64M (default: the table's sizes)
--     --replays N        timed replays per case (default 50; fewer above 64 MB)
--     --command TEXT     the command line to record (default: this one)
--     --tune FILE        first run dl.allreduce.tune at the same sizes, write its table to
--                        FILE and let auto use it (set DISTLAB_AR_TABLE=FILE too, so that
--                        nothing else shadows it)
--     --plot             draw allreduce-TAG.png (experiments/allreduce/allreduce_plot.sh, gnuplot)
--     --columns LIST     only these columns (nccl and auto always), e.g. for an A/B of one knob:
--                        DISTLAB_AR_LAMPORT_MB=32 ... --columns one_shot_lamport,two_shot_lamport
--     --quick            8 KB and 64 KB, every column, a graph of 2 calls replayed twice, checks of
--                        8K elements (16 windows of 512 at 64 KB: a check that it runs and checks);
--                        --plant noop|scale=X puts an error into every timed all-reduce, which the
--                        data check must report (exit code 1)
--
-- Method (vLLM's; dl.bench.timing.graph): per case a CUDA graph of 10
-- back-to-back all-reduces on the same tensor, 3 warm-up replays, a barrier,
-- then each replay between two device events; time per all-reduce = replay /
-- 10, the median over replays, the max over ranks. algbw = bytes / time,
-- busbw = algbw x 2(n-1)/n (nccl-tests, dl.bench.busbw). Inputs are zeros
-- while timing. After timing every case runs once more, as it was timed (a
-- graph of the timed callable, replayed once), on fresh inputs (normal, a new
-- seed each case and rank) with an out-of-place output poisoned (NaN; an
-- in-place result overwrites its input, which alone differs from the sum),
-- and the result is compared with the fp64 sum of every rank's input drawn
-- again on the host: all of it up to 128K elements, else 128 windows of
-- 1024 spread over it. Bounds: each element within 1e-2 n + 2^-7 |ref|;
-- normwise within 1.5 u sqrt((1 + (n + 2)(n - 1) / (2n)) / 3) (u = 2^-8:
-- the error of n - 1 partial sums each rounded to bf16, as a ring's are,
-- 1.5 times over; 4.8e-3 at n = 2, 7.8e-3 at n = 8); and the bias
-- <got - ref, ref> / <ref, ref> within 2^-10 (rounding to nearest has none,
-- a 1% scale error is 1e-2). #wrong, over all ranks; any makes the exit code
-- non-zero. "auto" runs whatever the
-- dispatch table in use picks (its file is named in the results); the
-- "best" column is the fastest of the algorithms on an ordinary tensor
-- (every column but auto, the zero-copy ones and PyTorch's), the zero-copy
-- columns are reported apart.
local dl = require "distlab"
local bench = dl.bench
local verify = require "distlab.bench.verify"

-- ---- options ------------------------------------------------------------------------

local w = dl.comm.world()
local N, me = w.size, w.rank
local on_gpu = w.device:match("^cuda") ~= nil
local h = bench.harness {
  name = "allreduce_sweep", family = "allreduce", comm = w, tag = true,
  usage = "./distlab run -n 2 --device cuda experiments/allreduce/allreduce_sweep.lua [options]",
  about = "the all-reduce table of seed 002 (vLLM's benchmark) and more columns; see the file's header",
  options = {
    { "torch", "string", nil, "PyTorch anchors from the same run (allreduce_torch.py's CSV)", meta = "FILE.csv" },
    { "sizes", "sizes", nil, "sizes in bytes (default: the table's sizes)" },
    { "replays", "int", 50, "timed replays per case (fewer above 64 MB)", meta = "N" },
    { "tune", "string", nil, "run dl.allreduce.tune first, write its table to FILE and let auto use it",
      meta = "FILE" },
    { "plot", "flag", nil, "draw allreduce-TAG.png from the wide CSV (needs gnuplot)" },
    { "columns", "list", nil, "only these columns (nccl and auto are always measured)", meta = "LIST" },
  },
}
local opt = h.opt

local device_name = on_gpu and dl.cuda_device_name(tonumber(w.device:match("%d+"))) or w.device
h.device_desc = device_name .. " x " .. N .. " (" .. w.backend .. " communicator" ..
  (on_gpu and ", NVLink, no multicast)" or ")")

local sizes = {}
if h.quick and not opt.sizes then opt.sizes = { 8192, 65536 } end
if opt.sizes then
  for _, b in ipairs(opt.sizes) do sizes[#sizes + 1] = { bytes = b } end
else
  for _, kb in ipairs { 8, 16, 32, 64, 128, 256 } do sizes[#sizes + 1] = { bytes = kb * 1024 } end
  for _, rows in ipairs { 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 3062, 4096 } do
    sizes[#sizes + 1] = { bytes = rows * 8192 * 2, shape = string.format("(%d, 8192)", rows) }
  end
  for _, mb in ipairs { 128, 256, 512, 1024 } do
    sizes[#sizes + 1] = { bytes = mb * 2 ^ 20, shape = string.format("(%d, 8192)", mb * 2 ^ 20 / 16384) }
  end
end

local ar = dl.allreduce.get(w)
-- Every algorithm (dl.allreduce.algos, the list the C core exports), seed
-- 002's three columns first; auto after them; then the zero-copy runs of the
-- algorithms that read an input in place (one_shot, two_shot; two_shot_push
-- too, its reduce-scatter reads like two_shot's).
local regular = { "one_shot", "two_shot", "nccl" }
for _, a in ipairs(dl.allreduce.algos) do
  if a ~= "one_shot" and a ~= "two_shot" and a ~= "nccl" then regular[#regular + 1] = a end
end
-- auto_zc: auto on an input in the region, in place (the table's zc_rows).
local columns = { "one_shot", "two_shot", "nccl", "auto" }
for i = 4, #regular do columns[#columns + 1] = regular[i] end
for _, zc in ipairs { "one_shot_zc", "two_shot_zc", "two_shot_push_zc", "auto_zc" } do columns[#columns + 1] = zc end
if opt.columns then
  local want = { nccl = true, auto = true }
  for _, c in ipairs(opt.columns) do
    local known = false
    for _, k in ipairs(columns) do known = known or k == c end
    if not known then dl.fail("allreduce_sweep: --columns: no column %s (%s)", c, table.concat(columns, ", ")) end
    want[c] = true
  end
  local keep, keep_regular = {}, {}
  for _, c in ipairs(columns) do if want[c] then keep[#keep + 1] = c end end
  for _, c in ipairs(regular) do if want[c] then keep_regular[#keep_regular + 1] = c end end
  columns, regular = keep, keep_regular
end

-- ---- checking ---------------------------------------------------------------------------

-- rank r's input of check number c: normal(0, 1) in bf16, element i from Philox(seed(c, r), i)
local checks = 0
local function seed_of(c, r) return 4242 + 7919 * c * N + r end
local CHECKED, WINDOW = 131072, 1024 -- at least 1e5 elements spread over the result, or all of it
if h.quick then CHECKED, WINDOW = 8192, 512 end -- the windows' path at 64 KB, cheaply
local U = 2 ^ -8
local TOL = { atol = 1e-2 * N, rtol = 2 ^ -7, norm = 1.5 * U * math.sqrt((1 + (N + 2) * (N - 1) / (2 * N)) / 3),
  bias = 2 ^ -10 }

-- The fp64 sum of every rank's input over the windows wins, drawn again on the host.
local function reference(wins)
  local seeds = {}
  for r = 0, N - 1 do seeds[r + 1] = seed_of(checks, r) end
  return verify.normal_sum("bf16", seeds, wins)
end

-- After timing: the timed callable as it was timed (a graph of it, replayed
-- once), its input fresh, an out-of-place output poisoned, against the fp64 sum.
local function check(what, issue, input, result)
  checks = checks + 1
  local wins = verify.windows(result:numel(), CHECKED, WINDOW, checks * N + me + 1)
  return h:verify { what = what,
    fresh = function() input:normal_(0, 1, seed_of(checks, me)) end,
    poison = result ~= input and { result } or nil,
    run = function()
      local g = dl.graph.capture(issue)
      g:replay()
      g:free()
    end,
    check = function() return verify.close(verify.take(result, wins), reference(wins), TOL) end }
end

-- ---- cases ---------------------------------------------------------------------------------

-- column -> function(n) returning (issue one all-reduce (planted), its input, its result)
local function make(col, n, x)
  local zc = col:match("^(.+)_zc$")
  if not zc then
    local algo = col
    return h:planted(function() ar:run(x, { algo = algo }) end, { writes = { x } }), x, x
  end
  if n * 2 > ar.max_bytes then return nil end
  local z = ar:buffer({ n }, "bf16")
  if zc == "one_shot" then
    local out = dl.empty({ n }, { dtype = "bf16" })
    return h:planted(function() ar:run(z, { algo = "one_shot", out = out }) end, { writes = { out } }), z, out
  end
  return h:planted(function() ar:run(z, { algo = zc }) end, { writes = { z } }), z, z
end

-- Median us of one call, max over ranks: a graph of 10 calls, 3 warm-up replays, a barrier, `replays` timed.
local OPS, WARMUP = 10, 3
if h.quick then OPS, WARMUP = 2, 1 end
local function time_call(issue, replays)
  local st = bench.timing.graph(issue, { ops = OPS, warmup = WARMUP, replays = replays,
    before = function() w:barrier() end })
  ar:check()
  return h:max(st.median * 1e3)
end

local function measure(col, size)
  local n = size.bytes / 2
  local x = size.x
  local issue, input, result = make(col, n, x)
  if not issue then return nil end
  x:zero_()
  if col:match("_zc$") then ar:buffer({ n }, "bf16"):zero_() end
  local replays = math.max(10, math.min(opt.replays, math.floor(opt.replays * 64 * 2 ^ 20 / size.bytes)))
  if h.quick then replays = 2 end
  local us = time_call(issue, replays)
  local wrong = check(string.format("%s %s", bench.sizes.human(size.bytes), col), issue, input, result)
  ar:check()
  local alg = bench.busbw.algbw(size.bytes, us)
  return { col = col, us = us, algbw = alg, busbw = bench.busbw.busbw("all_reduce", N, size.bytes, us), wrong = wrong,
    replays = replays }
end

-- ---- anchors ------------------------------------------------------------------------------

local torch_cols = { "nccl_torch", "torch_one_shot", "torch_two_shot" }
local torch = {} -- impl -> bytes -> {us, method}
local torch_note
if opt.torch then
  local head, recs = bench.csv.read(opt.torch)
  if not head then
    torch_note = "no PyTorch anchors: " .. opt.torch .. " is missing (the PyTorch run failed?)"
  else
    for _, r in ipairs(recs) do
      local impl = r.impl == "nccl" and "nccl_torch" or r.impl
      torch[impl] = torch[impl] or {}
      torch[impl][tonumber(r.bytes)] = { us = tonumber(r.time_us), method = r.method, wrong = tonumber(r.wrong) }
    end
  end
end

local function anchor(impl, bytes)
  local a = torch[impl] and torch[impl][bytes]
  if a and a.us and a.us == a.us then return a.us end
end

-- ---- run -------------------------------------------------------------------------------------

local fmt_size = bench.sizes.human

if opt.tune then
  local bytes = {}
  for k, s in ipairs(sizes) do bytes[k] = s.bytes end
  local entry = dl.allreduce.tune { comm = w, sizes = bytes, file = opt.tune }
  if me == 0 then -- every measurement, for the record
    local rows = {}
    for k, m in ipairs(entry.measured) do
      rows[k] = { m.bytes, m.algo, m.blocks, string.format("%.3f", m.us), m.timings, m.zc and 1 or 0 }
    end
    -- time_us: the fastest of `timings` (near-ties are timed again); zc 1: the
    -- input in the zero-copy region, in place (what zc_rows come from)
    h:csv("allreduce-" .. h.tag .. "-tune.csv", { "bytes", "algo", "blocks", "time_us", "timings", "zc" }, rows)
  end
end
local table_entry, table_file = dl.allreduce.table(w)
local tbl = h:table({ { "bytes", "%12d", unit = "(B)" }, { "column", "%-18s" }, { "time", "%10.2f", unit = "(us)" },
  { "algbw", "%9.2f", unit = "(GB/s)" }, { "busbw", "%9.2f", unit = "(GB/s)" }, { "#wrong", "%7d" } })
tbl:header(string.format("allreduce sweep: %s x %d, bf16, table %s (%s)", device_name, N, tostring(table_file),
  table_entry and (table_entry.provisional and "provisional" or table_entry.date or "") or "none: built-in rule"))
local results = {}
for si, size in ipairs(sizes) do
  h:progress(si, #sizes, bench.sizes.human(size.bytes))
  size.x = dl.empty({ size.bytes / 2 }, { dtype = "bf16" })
  size.auto_algo = dl.allreduce.choose(size.bytes, w)
  if size.bytes <= ar.max_bytes then size.auto_zc_algo = (ar:choose(ar:buffer({ size.bytes / 2 }, "bf16"))) end
  local row = { size = size }
  for _, col in ipairs(columns) do
    local r = measure(col, size)
    row[col] = r
    if r then tbl:row({ size.bytes, col, r.us, r.algbw, r.busbw, r.wrong }) end
  end
  size.x:free()
  size.x = nil
  results[#results + 1] = row
end
ar:check()

-- ---- report ------------------------------------------------------------------------------------

local function best_of(row)
  local best
  for _, col in ipairs(regular) do
    local r = row[col]
    if r and (not best or r.us < best.us) then best = r end
  end
  return best
end

local function us_cell(v) return v and string.format("%.1f", v) or "-" end
local function ms_cell(v) return v and string.format("%.3f", v / 1e3) or "-" end

local function write_results()
  local base = "allreduce-" .. h.tag
  -- long CSV: one row per size and column
  local csv = bench.csv.writer(h:path(base .. ".csv"),
    { "bytes", "shape", "impl", "time_us", "algbw_GBps", "busbw_GBps", "wrong", "note" })
  -- wide CSV for the plot: bytes, then every column's us
  local wcols = {}
  for _, c in ipairs(columns) do wcols[#wcols + 1] = c end
  for _, c in ipairs(torch_cols) do wcols[#wcols + 1] = c end
  local wide_header = { "bytes" }
  for _, c in ipairs(wcols) do wide_header[#wide_header + 1] = c end
  local wide = bench.csv.writer(h:path(base .. "-wide.csv"), wide_header)
  local function f(fmt, v) return string.format(fmt, v) end
  for _, row in ipairs(results) do
    local s = row.size
    for _, col in ipairs(columns) do
      local r = row[col]
      if r then
        csv:row({ s.bytes, s.shape or "", col, f("%.3f", r.us), f("%.2f", r.algbw), f("%.2f", r.busbw), r.wrong,
          col == "auto" and ("picked " .. s.auto_algo) or col == "auto_zc" and ("picked " .. s.auto_zc_algo) or "" })
      end
    end
    for _, col in ipairs(torch_cols) do
      local a = torch[col] and torch[col][s.bytes]
      if a and a.us and a.us == a.us then
        csv:row({ s.bytes, s.shape or "", col, f("%.3f", a.us), f("%.2f", bench.busbw.algbw(s.bytes, a.us)),
          f("%.2f", bench.busbw.busbw("all_reduce", N, s.bytes, a.us)), a.wrong or -1, a.method or "" })
      end
    end
    local cells = { s.bytes }
    for _, c in ipairs(wcols) do
      local v = row[c] and row[c].us or anchor(c, s.bytes)
      cells[#cells + 1] = v and f("%.3f", v) or "NaN"
    end
    wide:row(cells)
  end
  csv:close()
  wide:close()

  local extra = {
    "dispatch table for auto: " .. tostring(table_file) .. (table_entry and table_entry.provisional and " (provisional)" or ""),
    "method: bf16, in place unless noted; " .. (on_gpu and "a CUDA graph of 10 back-to-back all-reduces"
      or "no graphs on " .. w.device .. ": a replay calls 10 back-to-back all-reduces (host time)") ..
      ", 3 warm-up replays, then each replay timed with device events; time per all-reduce = median replay / 10, max over ranks " ..
      "(vLLM's benchmark method); data checked after timing (fresh inputs, an out-of-place output poisoned, " ..
      string.format("the whole result up to 128K elements or 128 windows of 1024, against an fp64 sum on the host: " ..
      "each element within %g + 2^-7 |ref|, normwise within %.2g, bias within 2^-10).", TOL.atol, TOL.norm),
    "columns: one_shot (pull, copy into the symmetric buffer in the kernel), two_shot (reduce-scatter and " ..
      "all-gather by reading), nccl (the communicator's NCCL all_reduce), auto (what the table picks), " ..
      "one_shot_push / two_shot_push (writes instead of reads), two_shot_write (both phases write into the " ..
      "peers: no copy-in), one_shot_lamport (push into a region kept at a sentinel; the receiver polls the data, " ..
      "no flags or fences), one_shot_push_flat (push with every thread, then reduce, per round), two_shot_lamport (two-shot whose slices and sums are polled where they land, as one_shot_lamport's data), *_zc (zero copy: the input already in the " ..
      "all-reduce's symmetric buffer; one_shot_zc out of place; auto_zc: auto on such an input, in place, " ..
      "following the table's zc_rows where it has them), PyTorch anchors from the same run: " ..
      "nccl_torch (torch.distributed), torch_one_shot / torch_two_shot (torch.ops.symm_mem, input in symmetric memory).",
    "best: the fastest of " .. table.concat(regular, ", ") .. " on an ordinary tensor.",
  }
  local md = {}
  if torch_note then extra[#extra + 1] = torch_note end
  md[#md + 1] = "## The seed's table (ms per all-reduce)"
  md[#md + 1] = ""
  md[#md + 1] = "| Tensor Shape | Tensor Size | one_shot | two_shot | nccl | auto | Best (Speedup vs NCCL) |"
  md[#md + 1] = "|---|---:|---:|---:|---:|---:|---|"
  for _, row in ipairs(results) do
    local s, best = row.size, best_of(row)
    md[#md + 1] = string.format("| %s | %s | %s | %s | %s | %s | %s |", s.shape or string.format("(%d)", s.bytes / 2),
      fmt_size(s.bytes), ms_cell(row.one_shot and row.one_shot.us), ms_cell(row.two_shot and row.two_shot.us),
      ms_cell(row.nccl and row.nccl.us), ms_cell(row.auto and row.auto.us),
      best and string.format("%s (%.2fx)", best.col, row.nccl.us / best.us) or "-")
  end
  md[#md + 1] = ""
  md[#md + 1] = "## Every column (us per all-reduce; auto's pick; busbw of auto and nccl in GB/s)"
  md[#md + 1] = ""
  local head = "| size | " .. table.concat(columns, " | ") .. " | " .. table.concat(torch_cols, " | ") ..
    " | auto picks | auto_zc picks | busbw auto | busbw nccl | #wrong |"
  md[#md + 1] = head
  md[#md + 1] = "|---" .. string.rep("|---:", #columns + #torch_cols) .. "|---|---|---:|---:|---:|"
  for _, row in ipairs(results) do
    local s = row.size
    local cells, wrong = { fmt_size(s.bytes) }, 0
    for _, col in ipairs(columns) do
      cells[#cells + 1] = us_cell(row[col] and row[col].us)
      wrong = wrong + (row[col] and row[col].wrong or 0)
    end
    for _, col in ipairs(torch_cols) do cells[#cells + 1] = us_cell(anchor(col, s.bytes)) end
    cells[#cells + 1] = s.auto_algo
    cells[#cells + 1] = s.auto_zc_algo or "-"
    cells[#cells + 1] = string.format("%.1f", row.auto.busbw)
    cells[#cells + 1] = string.format("%.1f", row.nccl.busbw)
    cells[#cells + 1] = tostring(wrong)
    md[#md + 1] = "| " .. table.concat(cells, " | ") .. " |"
  end
  -- the issue's targets
  md[#md + 1] = ""
  md[#md + 1] = "## Targets"
  md[#md + 1] = ""
  local function verdict(ok) return ok and "PASS" or "FAIL" end
  local worst_auto, worst_at = 0, "-"
  local anchors_ok, anchors_bad, anchors_seen = true, {}, false
  local at2mb, big_ok, big_bad = nil, true, {}
  local small_ok, small_bad = true, {} -- the best custom algorithm vs NCCL up to 1 MB (issue 7)
  -- issue 26: col no slower than nccl and each PyTorch anchor from 8 KB to 64 MB
  local rivals = { auto = { ok = true, bad = {}, seen = false }, auto_zc = { ok = true, bad = {}, seen = false } }
  for _, row in ipairs(results) do
    local s, best = row.size, best_of(row)
    local ratio = row.auto.us / best.us
    if ratio > worst_auto then worst_auto, worst_at = ratio, fmt_size(s.bytes) end
    if s.bytes >= 8 * 1024 and s.bytes <= 64 * 2 ^ 20 then
      for _, a in ipairs(torch_cols) do
        local v = anchor(a, s.bytes)
        if v then
          anchors_seen = true
          if row.auto.us >= v then
            anchors_ok = false
            anchors_bad[#anchors_bad + 1] = string.format("%s %s %.1f vs %.1f us", fmt_size(s.bytes), a, row.auto.us, v)
          end
        end
      end
    end
    if s.bytes >= 8 * 1024 and s.bytes <= 64 * 2 ^ 20 then
      for col, v in pairs(rivals) do
        if row[col] then
          v.seen = true
          local others = { { "nccl", row.nccl.us } }
          for _, a in ipairs(torch_cols) do others[#others + 1] = { a, anchor(a, s.bytes) } end
          for _, o in ipairs(others) do
            if o[2] and row[col].us > o[2] then
              v.ok = false
              v.bad[#v.bad + 1] = string.format("%s %s %.1f vs %.1f us", fmt_size(s.bytes), o[1], row[col].us, o[2])
            end
          end
        end
      end
    end
    if s.bytes <= 2 ^ 20 then
      local bc = nil
      for _, c in ipairs({ "one_shot", "one_shot_push", "two_shot", "two_shot_push", "two_shot_write" }) do
        if row[c] and (not bc or row[c].us < bc.us) then bc = { col = c, us = row[c].us } end
      end
      if not bc or bc.us >= row.nccl.us then
        small_ok = false
        small_bad[#small_bad + 1] = string.format("%s %s %.1f vs nccl %.1f us", fmt_size(s.bytes), bc and bc.col or "-",
          bc and bc.us or 0, row.nccl.us)
      end
    end
    if s.bytes == 2 * 2 ^ 20 then at2mb = row.nccl.us / row.auto.us end
    -- where auto runs NCCL itself the two columns differ only by noise (1% allowed)
    local slack = s.auto_algo == "nccl" and 0.99 or 1
    if s.bytes >= 64 * 2 ^ 20 and row.auto.busbw < slack * row.nccl.busbw then
      big_ok = false
      big_bad[#big_bad + 1] = string.format("%s %.1f vs %.1f GB/s", fmt_size(s.bytes), row.auto.busbw, row.nccl.busbw)
    end
  end
  md[#md + 1] = string.format("- auto within 5%% of the best column at every size: %s (worst auto/best %.3f at %s)",
    verdict(worst_auto <= 1.05), worst_auto, worst_at)
  md[#md + 1] = string.format("- auto beats each PyTorch anchor from 8 KB to 64 MB: %s%s",
    anchors_seen and verdict(anchors_ok) or "not measured",
    #anchors_bad > 0 and (" (" .. table.concat(anchors_bad, "; ") .. ")") or "")
  for _, col in ipairs { "auto", "auto_zc" } do
    local v = rivals[col]
    md[#md + 1] = string.format("- %s no slower than nccl and each PyTorch anchor from 8 KB to 64 MB (issue 26%s): %s%s",
      col, col == "auto_zc" and "; the input in the region, as torch's symm_mem anchors have theirs" or "",
      v.seen and verdict(v.ok) or "not measured", #v.bad > 0 and (" (" .. table.concat(v.bad, "; ") .. ")") or "")
  end
  md[#md + 1] = string.format("- at 2 MB auto >= 2x faster than NCCL: %s (%.2fx)", at2mb and verdict(at2mb >= 2) or "not measured",
    at2mb or 0)
  md[#md + 1] = string.format("- at >= 64 MB auto's busbw >= NCCL's: %s%s", verdict(big_ok),
    #big_bad > 0 and (" (" .. table.concat(big_bad, "; ") .. ")") or "")
  md[#md + 1] = string.format("- the best custom algorithm beats NCCL at every size <= 1 MB: %s%s", verdict(small_ok),
    #small_bad > 0 and (" (" .. table.concat(small_bad, "; ") .. ")") or "")
  md[#md + 1] = string.format("- wrong elements after timing, all cases: %d", h.wrong)
  md[#md + 1] = ""
  md[#md + 1] = "![latency vs size](" .. base .. ".png)"
  md[#md + 1] = ""
  md[#md + 1] = "CSV: `" .. base .. ".csv` (every case), `" .. base ..
    "-wide.csv` (the plot's data; `experiments/allreduce/allreduce_plot.sh` draws it)."
  local md_path = h:markdown(base .. ".md", "All-reduce sweep: " .. device_name .. " x " .. N, md, extra)
  -- the short table, printed last
  print("")
  print(string.format("%-16s %10s %10s %10s %10s %10s %10s  %s", "size", "one_shot", "two_shot", "nccl", "auto", "auto_zc",
    "torch_2s", "best (speedup vs nccl)"))
  for _, row in ipairs(results) do
    local s, best = row.size, best_of(row)
    print(string.format("%-16s %10s %10s %10s %10s %10s %10s  %s (%.2fx)", fmt_size(s.bytes),
      us_cell(row.one_shot and row.one_shot.us), us_cell(row.two_shot and row.two_shot.us), us_cell(row.nccl.us),
      us_cell(row.auto.us), us_cell(row.auto_zc and row.auto_zc.us), us_cell(anchor("torch_two_shot", s.bytes)),
      best.col, row.nccl.us / best.us))
  end
  print("wrote " .. md_path .. ", .csv and -wide.csv")
  if opt.plot then
    local method = on_gpu and "CUDA graph of 10, median" or "host time, 10 calls a replay, median"
    local ok, note = bench.plot.script("experiments/allreduce/allreduce_plot.sh",
      { h:path(base .. "-wide.csv"), h:path(base .. ".png"), method }, base .. ".png")
    if not ok then print(note) end
  end
end

if h.rank0 then write_results() end
h:finish()
