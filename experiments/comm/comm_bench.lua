-- experiments/comm/comm_bench.lua — nccl-tests style benchmark of distlab's
-- communicators: all_reduce, all_gather, reduce_scatter, all_to_all and
-- sendrecv from 8 B up (f32, out of place), plus the point-to-point copy
-- bandwidth into a neighbour's symmetric buffer (symm_put).
--
--   ./distlab run -n 2 --device cuda experiments/comm/comm_bench.lua [options]
--     -b BYTES  -e BYTES  -f F  sizes from -b to -e, times F (default 8 .. 1G on cuda,
--                            8 .. 16M on cpu, doubling); --sizes LIST instead (8K,1M or 8..1G)
--     --ops a,b,...          subset of all_reduce,all_gather,reduce_scatter,all_to_all,sendrecv,symm_put
--     --tag NAME             results file name: DIR/comm-NAME.{csv,md}
--                            (default: GPU model and rank count, e.g. h200x2)
--     --compare A.csv[,B.csv] the CSV(s) of experiments/lab/nccl_loop.c from the same
--                            call: the markdown then compares the two, size by size
--                            (several loop runs: the fastest of them per op and size)
--     --merge C.csv[,...]    this benchmark's own CSV(s) from earlier runs in the same
--                            call: each op and size keeps its fastest run, as for the
--                            loop, so run-to-run drift (clocks, placement) treats the
--                            two sides alike
--     --out DIR              where results go (default experiments/results/comm)
--     --raw                  (nccl) also time the same ops as raw NCCL calls through the
--                            FFI on this communicator's own ncclComm_t, same buffers,
--                            same stream, alternating with distlab's repetition by
--                            repetition: what distlab adds, with the host's drift shared
--     --report-only RUN.csv  measure nothing: write the CSV and markdown from this
--                            benchmark's CSV of an earlier run (with --merge and
--                            --compare), e.g. after two runs of each side in ABBA
--                            order; --device-name NAME and --ranks N name the machine
--                            it ran on (any device works for this step)
--     --command TEXT         the command to record (default: this one); --help lists all
--     --quick                the smallest case (1 KiB and 64 KiB, few repetitions, checks of 4K
--                            elements: a check that it runs and checks); --plant noop|scale=X puts
--                            an error into every timed op, which the data check must report (exit
--                            code 1)
--
-- Method (the same as nccl_loop.c, so the two are comparable; the harness's
-- dl.bench.timing.loop_once): per size, 5 warm-up ops, then 5 repetitions of
-- [barrier, event, `iters` back-to-back ops, event] with iters = clamp(2^28 /
-- bytes, 10, 1000); time = elapsed / iters; the max over ranks of each
-- repetition, the median over repetitions. algbw = bytes / time; busbw =
-- algbw x nccl-tests' factor (dl.bench.busbw): all_reduce 2(n-1)/n,
-- all_gather, reduce_scatter and all_to_all (n-1)/n, sendrecv and symm_put 1.
-- Data are checked after timing, op by op and size by size: every rank
-- draws a fresh input (normal, a new seed each check: Philox(seed, i)), its
-- output is poisoned (NaN), the timed callable runs once more, and what it
-- wrote is compared with an fp64 reference made on the host from every
-- rank's seed (not by the op under test): the whole output up to 128K
-- elements, else 128 windows of 1024 spread over it (every rank's block).
-- Copies (all_gather, all_to_all, sendrecv, symm_put) must be exact; sums
-- (all_reduce, reduce_scatter: n f32 terms) within (n - 1) 2^-24 7n
-- absolute (|x| < 7 for these draws) + 2^-23 relative, and normwise within
-- 2^-18. #wrong counts the wrong elements over all ranks, and any makes the
-- exit code non-zero; --raw's NCCL calls are checked the same way.
local ffi = require "ffi"
local dl = require "distlab"
local bench = dl.bench
local verify = require "distlab.bench.verify"

local w = dl.comm.world()
local N, me = w.size, w.rank
local on_gpu = w.device:match("^cuda") ~= nil
local OPS = { "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv", "symm_put" }
-- each op's nccl-tests collective, for the busbw factor (symm_put: a point-to-point copy)
local KIND = { all_reduce = "all_reduce", all_gather = "all_gather", reduce_scatter = "reduce_scatter",
  all_to_all = "all_to_all", sendrecv = "sendrecv", symm_put = "send" }

local h = bench.harness {
  name = "comm_bench", family = "comm", comm = w, tag = true,
  usage = "./distlab run -n 2 --device cuda experiments/comm/comm_bench.lua [options]",
  about = "nccl-tests style benchmark of distlab's communicators (f32, out of place); see the file's header",
  options = {
    { "b", "size", 8, "smallest size, bytes", meta = "BYTES" },
    { "e", "size", on_gpu and "1G" or "16M", "largest size, bytes", meta = "BYTES" },
    { "f", "int", 2, "size factor from -b to -e", meta = "F" },
    { "sizes", "sizes", nil, "sizes instead of -b/-e/-f (8K,1M or 8..1G or 8K..1M:4)" },
    { "ops", "list", table.concat(OPS, ","), "ops to run", values = OPS },
    { "compare", "list", nil, "nccl_loop.c CSV(s) from the same call", meta = "A.csv,B.csv" },
    { "merge", "list", nil, "this benchmark's CSV(s) from earlier runs in the same call", meta = "C.csv,..." },
    { "raw", "flag", nil, "(nccl) also time raw NCCL calls on the same communicator" },
    { "report-only", "string", nil, "measure nothing: report an earlier run's CSV", meta = "RUN.csv" },
    { "device-name", "string", nil, "with --report-only: the device it ran on", meta = "NAME" },
    { "ranks", "int", nil, "with --report-only: the rank count it ran with", meta = "N" },
  },
}
local opt = h.opt

local device_name = on_gpu and dl.cuda_device_name(tonumber(w.device:match("%d+"))) or w.device
local backend = w.backend
if opt.report_only then -- the figures come from a run on another machine or device
  device_name, backend, on_gpu = opt.device_name or "unknown device", "nccl", true
  N = opt.ranks or N
  if not h.given.tag then h.tag = (device_name:match("([AHBL]%d+)") or "gpu"):lower() .. "x" .. N end
end
h.device_desc = string.format("%s x %d (%s backend)", device_name, N, backend)

-- ---- ops -------------------------------------------------------------------------

local REPS, WARMUP = 5, 5
if h.quick then REPS, WARMUP = 2, 1 end
local function iters_for(bytes)
  return math.max(10, math.min(h.quick and 10 or 1000, math.floor(2 ^ 28 / bytes)))
end
local function round_bytes(s) return math.max(4 * N, math.floor(s / (4 * N)) * 4 * N) end

local sizes = opt.sizes or (h.quick and { 1024, 65536 }) or bench.sizes.range(opt.b, opt.e, opt.f)
local nxt, prv = (me + 1) % N, (me - 1 + N) % N
local maxb = round_bytes(math.max(unpack(sizes)))
local send, recv, symm
if not opt.report_only then
  send = dl.empty({ maxb / 4 }):fill_(me + 1)
  recv = dl.empty({ maxb / 4 }):fill_(0)
end

-- op -> function(bytes) returning (issue one op, this rank's output, its source, the
-- tensor the issuing rank writes). The source says where output element i
-- (0-based) comes from: output blocks of `block` elements (nil: one block),
-- block j made of input elements [off(j), off(j) + block) of the ranks
-- ranks(j) (summed where there are several).
local make = {}
local ALL = {}
for r = 0, N - 1 do ALL[r + 1] = r end
function make.all_reduce(b)
  local s, r = send:narrow(1, 1, b / 4), recv:narrow(1, 1, b / 4)
  return function() w:all_reduce(s, "sum", r) end, r, { ranks = function() return ALL end, off = function() return 0 end }, r
end
function make.all_gather(b)
  local cnt = b / 4 / N
  local s, r = send:narrow(1, 1, cnt), recv:narrow(1, 1, b / 4)
  return function() w:all_gather(r, s) end, r, { block = cnt, ranks = function(j) return { j } end,
    off = function() return 0 end }, r
end
function make.reduce_scatter(b)
  local cnt = b / 4 / N
  local s, r = send:narrow(1, 1, b / 4), recv:narrow(1, 1, cnt)
  return function() w:reduce_scatter(r, s, "sum") end, r, { ranks = function() return ALL end,
    off = function() return me * cnt end }, r
end
function make.all_to_all(b)
  local cnt = b / 4 / N
  local s, r = send:narrow(1, 1, b / 4), recv:narrow(1, 1, b / 4)
  return function() w:all_to_all(r, s) end, r, { block = cnt, ranks = function(j) return { j } end,
    off = function() return me * cnt end }, r
end
function make.sendrecv(b)
  local s, r = send:narrow(1, 1, b / 4), recv:narrow(1, 1, b / 4)
  local function pair()
    w:send(s, nxt)
    w:recv(r, prv)
  end
  return function() dl.comm.group(pair) end, r, { ranks = function() return { prv } end, off = function() return 0 end }, r
end
function make.symm_put(b)
  symm = symm or dl.symm.alloc(w, { maxb / 4 }, "f32")
  local s, dst = send:narrow(1, 1, b / 4), symm:view(nxt, 0, { b / 4 })
  -- the put lands in the next rank's buffer: each rank checks its own, the
  -- previous rank's put (the harness's barrier after the run makes it land)
  local mine = symm:view(me, 0, { b / 4 })
  return function() dst:copy_(s) end, mine, { ranks = function() return { prv } end, off = function() return 0 end },
    dst, function() symm:barrier() end
end

-- ---- raw NCCL calls (--raw) --------------------------------------------------------------

local raw = {}
if opt.raw and w.backend ~= "nccl" then
  io.stderr:write("comm_bench: --raw times raw NCCL calls: it needs the nccl backend (--device cuda)\n")
  os.exit(2)
end
if opt.raw and not opt.report_only then
  ffi.cdef [[
  typedef struct comm_bench_nccl *comm_bench_nccl_t;
  int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, comm_bench_nccl_t c, void *st);
  int ncclAllGather(const void *s, void *r, size_t n, int dt, comm_bench_nccl_t c, void *st);
  int ncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, comm_bench_nccl_t c, void *st);
  int ncclSend(const void *s, size_t n, int dt, int peer, comm_bench_nccl_t c, void *st);
  int ncclRecv(void *r, size_t n, int dt, int peer, comm_bench_nccl_t c, void *st);
  int ncclGroupStart(void);
  int ncclGroupEnd(void);
  const char *ncclGetErrorString(int r);
  ]]
  local nccl = ffi.load("libnccl.so.2") -- the library distlab already opened
  local comm = ffi.cast("comm_bench_nccl_t", w:info().native)
  local F32, SUM = 7, 0 -- ncclFloat32, ncclSum
  local function ck(r)
    if r ~= 0 then error("raw NCCL call: " .. ffi.string(nccl.ncclGetErrorString(r)), 0) end
  end
  local sp, rp = send:data_ptr(), recv:data_ptr()
  function raw.all_reduce(b) return function() ck(nccl.ncclAllReduce(sp, rp, b / 4, F32, SUM, comm, nil)) end end
  function raw.all_gather(b) return function() ck(nccl.ncclAllGather(sp, rp, b / 4 / N, F32, comm, nil)) end end
  function raw.reduce_scatter(b)
    return function() ck(nccl.ncclReduceScatter(sp, rp, b / 4 / N, F32, SUM, comm, nil)) end
  end
  function raw.all_to_all(b)
    local n = b / 4 / N
    local fs, fr = ffi.cast("float*", sp), ffi.cast("float*", rp)
    return function()
      ck(nccl.ncclGroupStart())
      for j = 0, N - 1 do
        ck(nccl.ncclSend(fs + j * n, n, F32, j, comm, nil))
        ck(nccl.ncclRecv(fr + j * n, n, F32, j, comm, nil))
      end
      ck(nccl.ncclGroupEnd())
    end
  end
  function raw.sendrecv(b)
    return function()
      ck(nccl.ncclGroupStart())
      ck(nccl.ncclSend(sp, b / 4, F32, nxt, comm, nil))
      ck(nccl.ncclRecv(rp, b / 4, F32, prv, comm, nil))
      ck(nccl.ncclGroupEnd())
    end
  end
end

-- ---- measuring -----------------------------------------------------------------------

local function median(vals, first, count)
  local t = {}
  for k = 1, count do t[k] = vals[first + k - 1] end
  return bench.stats(t).median
end

-- ---- checking ------------------------------------------------------------------------

-- every rank's input of check number `check` is normal(0, 1) from Philox(seed(check, r), i)
local checks = 0
local function seed_of(check, r) return 7919 * check * N + r + 101 end
local CHECKED, WINDOW = 131072, 1024 -- at least 1e5 elements spread over the output, or all of it
if h.quick then CHECKED, WINDOW = 4096, 256 end -- the windows' path at 64 KiB, cheaply

-- the fp64 reference of output elements [start, start + len) (0-based) from src (make's)
local function reference(src, start, len)
  local ref = dl.zeros({ len }, { dtype = "f64", device = "cpu" })
  local block = src.block or math.huge
  local at = 0
  while at < len do -- one segment a block: [i, i + l) inside block j
    local i = start + at
    local j = block == math.huge and 0 or math.floor(i / block)
    local l = math.min(len - at, block == math.huge and len or (j + 1) * block - i)
    local o = src.off(j) + (block == math.huge and i or i - j * block)
    for _, r in ipairs(src.ranks(j)) do
      ref:narrow(1, at + 1, l):add_(verify.normal("f32", seed_of(checks, r), o, l))
    end
    at = at + l
  end
  return ref
end

-- f32 sums of N terms; copies exact (see the header)
local SUMS = { all_reduce = true, reduce_scatter = true }
local function tolerance(op)
  if not SUMS[op] then return { atol = 0, rtol = 0, norm = 0 } end
  return { atol = (N - 1) * 2 ^ -24 * 7 * N, rtol = 2 ^ -23, norm = 2 ^ -18 }
end

-- after timing: the callable `run` once more on fresh inputs, `out` poisoned, against the reference
local function check(op, b, run, s, out, src, label)
  checks = checks + 1
  local wins = verify.windows(out:numel(), CHECKED, WINDOW, checks * N + me + 1)
  return h:verify { what = string.format("%s %d B%s", op, b, label or ""),
    fresh = function() s:normal_(0, 1, seed_of(checks, me)) end,
    poison = { out }, run = run,
    check = function()
      local got = verify.take(out, wins)
      local ref = dl.empty({ got:numel() }, { dtype = "f64", device = "cpu" })
      local at = 0
      for _, win in ipairs(wins) do
        ref:narrow(1, at + 1, win[2]):copy_(reference(src, win[1], win[2]))
        at = at + win[2]
      end
      return verify.close(got, ref, tolerance(op))
    end }
end

local loop_opts = { before = function() w:barrier() end, timeout = w:info().timeout }

local function measure(op, s)
  local b = round_bytes(s)
  local issue, out, src, writes, settle = make[op](b)
  issue = h:planted(issue, { writes = { writes } })
  local iters = iters_for(b)
  local plain = raw[op] and raw[op](b)
  for _ = 1, WARMUP do issue() end
  if plain then for _ = 1, WARMUP do plain() end end
  -- per repetition: distlab's device and host us, then raw NCCL's (--raw; else 0)
  local vals = {}
  for k = 1, 4 * REPS do vals[k] = 0 end
  local function timed(fn, at, rep)
    vals[at + rep], vals[at + REPS + rep] = bench.timing.loop_once(fn, iters, loop_opts)
  end
  for rep = 1, REPS do -- with --raw, ABBA order repetition by repetition
    if plain and rep % 2 == 0 then timed(plain, 2 * REPS, rep) end
    timed(issue, 0, rep)
    if plain and rep % 2 == 1 then timed(plain, 2 * REPS, rep) end
  end
  w:synchronize()
  if settle then settle() end
  local all = h:max(vals)
  local input = op == "all_gather" and send:narrow(1, 1, b / 4 / N) or send:narrow(1, 1, b / 4)
  local wrong = check(op, b, issue, input, out, src)
  if plain then wrong = wrong + check(op, b, plain, input, recv:narrow(1, 1, out:numel()), src, " (raw NCCL)") end
  local us = median(all, 1, REPS)
  return { impl = "distlab", op = op, bytes = b, count = b / 4, dtype = "f32", iters = iters, time_us = us,
    algbw = bench.busbw.algbw(b, us), busbw = bench.busbw.busbw(KIND[op], N, b, us), wrong = wrong,
    host_us = median(all, REPS + 1, REPS), raw_us = plain and median(all, 2 * REPS + 1, REPS),
    raw_host_us = plain and median(all, 3 * REPS + 1, REPS) }
end

-- ---- reporting -------------------------------------------------------------------------

local COLUMNS = { "impl", "op", "bytes", "count", "dtype", "iters", "time_us", "algbw_GBps", "busbw_GBps", "wrong",
  "host_us", "raw_us", "raw_host_us" }
local nmerged = 1 -- how many runs (this one and --merge's) the written table takes its fastest from
local num = bench.csv.number

-- The records of a results CSV (this benchmark's or nccl_loop.c's), numbers as numbers.
local function csv_records(path)
  local head, recs = bench.csv.read(path)
  if not head then dl.fail("comm_bench: cannot read %s: %s", path, tostring(recs)) end
  for _, r in ipairs(recs) do
    for k, v in pairs(r) do r[k] = num(v) or v end
  end
  return recs
end

-- op:bytes -> the fastest record of path (and of what rows held already)
local function read_csv(path, rows)
  rows = rows or {}
  for _, r in ipairs(csv_records(path)) do
    local key, old = r.op .. ":" .. r.bytes, rows[r.op .. ":" .. r.bytes]
    if not old or r.time_us < old.time_us then rows[key] = r end
  end
  return rows
end

local function write_results(rows)
  local base = "comm-" .. h.tag
  local function f2(v) return v and string.format("%.2f", v) or nil end
  local out = {}
  for k, r in ipairs(rows) do
    out[k] = { r.impl, r.op, r.bytes, r.count, r.dtype, r.iters, f2(r.time_us), f2(r.algbw), f2(r.busbw), r.wrong,
      f2(r.host_us), f2(r.raw_us), f2(r.raw_host_us) }
  end
  local csv_path = h:csv(base .. ".csv", COLUMNS, out)
  local md = {}
  local ref, nref = nil, 0
  for _, path in ipairs(opt.compare or {}) do ref, nref = read_csv(path, ref), nref + 1 end
  if nmerged > 1 then
    md[#md + 1] = string.format("distlab: the fastest of %d runs of this benchmark in the same call, per op and size.", nmerged)
  end
  if ref then
    md[#md + 1] = nref > 1 and string.format("Compared with `experiments/lab/nccl_loop.c` (plain C over NCCL), " ..
      "the fastest of %d runs in the same call (interleaved with distlab's), per op and size.", nref) or
      "Compared with `experiments/lab/nccl_loop.c` (plain C over NCCL) from the same run."
    md[#md + 1] = ""
    md[#md + 1] = "| op | size (B) | distlab us | nccl us | distlab busbw GB/s | nccl busbw GB/s | busbw ratio | time diff us | host us: distlab | host us: nccl | #wrong |"
    md[#md + 1] = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  else
    md[#md + 1] = "| op | size (B) | count | time us | algbw GB/s | busbw GB/s | #wrong |"
    md[#md + 1] = "|---|---:|---:|---:|---:|---:|---:|"
  end
  local first = round_bytes(sizes[1])
  local worst_bw, worst_at, lat = 1e9, "-", {}
  for _, r in ipairs(rows) do
    local c = ref and ref[r.op .. ":" .. r.bytes]
    if c then
      local ratio = r.busbw / c.busbw_GBps
      if r.bytes >= 2 ^ 20 and ratio < worst_bw then worst_bw, worst_at = ratio, r.op .. " " .. r.bytes end
      if r.bytes == first then lat[#lat + 1] = string.format("%s %+.2f us", r.op, r.time_us - c.time_us) end
      local function hc(v) return tonumber(v) and string.format("%.2f", v) or "-" end
      md[#md + 1] = string.format("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.3f | %+.2f | %s | %s | %d |", r.op, r.bytes,
        r.time_us, c.time_us, r.busbw, c.busbw_GBps, ratio, r.time_us - c.time_us, hc(r.host_us), hc(c.host_us), r.wrong)
    else
      md[#md + 1] = string.format("| %s | %d | %d | %.2f | %.2f | %.2f | %d |", r.op, r.bytes, r.count, r.time_us,
        r.algbw, r.busbw, r.wrong)
    end
  end
  local with_raw = {}
  for _, r in ipairs(rows) do if r.raw_us then with_raw[#with_raw + 1] = r end end
  if #with_raw > 0 then -- distlab against raw NCCL calls in the same process, repetition by repetition
    md[#md + 1] = ""
    md[#md + 1] = "## distlab against raw NCCL calls in the same process"
    md[#md + 1] = ""
    md[#md + 1] = "The same ops as plain `ncclAllReduce`/... calls through the FFI on the communicator's own " ..
      "ncclComm_t, same buffers and stream, their repetitions alternating with distlab's (ABBA): what distlab " ..
      "adds, with the host's drift shared by both." .. (nmerged > 1 and
      string.format(" Each column is the fastest of the %d runs.", nmerged) or "")
    md[#md + 1] = ""
    md[#md + 1] = "| op | size (B) | distlab us | raw us | diff us | busbw ratio | host us: distlab | host us: raw |"
    md[#md + 1] = "|---|---:|---:|---:|---:|---:|---:|---:|"
    local worst, wat, small = 1e9, "-", {}
    for _, r in ipairs(with_raw) do
      local ratio = r.raw_us / r.time_us
      if r.bytes >= 2 ^ 20 and ratio < worst then worst, wat = ratio, r.op .. " " .. r.bytes end
      if r.bytes == first then small[#small + 1] = string.format("%s %+.2f us", r.op, r.time_us - r.raw_us) end
      md[#md + 1] = string.format("| %s | %d | %.2f | %.2f | %+.2f | %.3f | %.2f | %.2f |", r.op, r.bytes, r.time_us,
        r.raw_us, r.time_us - r.raw_us, ratio, r.host_us or 0, r.raw_host_us or 0)
    end
    md[#md + 1] = ""
    if wat ~= "-" then md[#md + 1] = string.format("Worst busbw ratio to raw NCCL at sizes >= 1 MiB: %.3f (%s).", worst, wat) end
    md[#md + 1] = string.format("At %d B, distlab minus raw NCCL: %s.", first, table.concat(small, ", "))
  end
  if ref then
    md[#md + 1] = ""
    if worst_at ~= "-" then
      md[#md + 1] = string.format("Worst busbw ratio at sizes >= 1 MiB: %.3f (%s); the bar is >= 0.97.", worst_bw, worst_at)
    end
    md[#md + 1] = string.format("Latency at %d B, distlab minus plain NCCL: %s; the bar is <= 2 us.",
      first, table.concat(lat, ", "))
  end
  local md_path = h:markdown(base .. ".md", "Communicator benchmark: " .. h.tag, md, {
    "NCCL watchdog: " .. (os.getenv("DISTLAB_NCCL_WATCHDOG") == "0" and "off" or "on"),
    "method: f32, out of place; 5 warm-up ops, " .. REPS .. " x [barrier, `iters` ops between events], max over " ..
      "ranks, median over repetitions; busbw factors of nccl-tests; host us = the host's time to issue one op " ..
      "(where it approaches the device time, the loop is host-bound); data checked after timing (fresh normal " ..
      "inputs, outputs poisoned, one more run against an fp64 reference from every rank's seed: the whole output " ..
      "up to 128K elements, else 128 windows of 1024 over it; copies exact, sums within their f32 rounding)",
  })
  print("wrote " .. csv_path .. " and " .. md_path)
end

-- ---- main ----------------------------------------------------------------------------

local tbl = h:table({ { "size", "%12d", unit = "(B)" }, { "count", "%12d", unit = "(elements)" }, { "type", "%6s" },
  { "op", "%-15s" }, { "time", "%10.2f", unit = "(us)" }, { "algbw", "%8.2f", unit = "(GB/s)" },
  { "busbw", "%8.2f", unit = "(GB/s)" }, { "#wrong", "%6d" } })

local rows = {}
-- --report-only: the rows of an earlier run's CSV, in its order
if opt.report_only then
  for _, r in ipairs(csv_records(opt.report_only)) do
    rows[#rows + 1] = { impl = r.impl, op = r.op, bytes = r.bytes, count = r.count, dtype = r.dtype, iters = r.iters,
      time_us = r.time_us, algbw = r.algbw_GBps, busbw = r.busbw_GBps, wrong = r.wrong, host_us = tonumber(r.host_us),
      raw_us = tonumber(r.raw_us), raw_host_us = tonumber(r.raw_host_us) }
    h.wrong = h.wrong + r.wrong -- checked when it ran
  end
else
  tbl:header(string.format("distlab comm_bench: %s x %d, %s backend, %d..%d bytes", device_name, N, backend,
    round_bytes(sizes[1]), maxb))
  for _, op in ipairs(opt.ops) do
    for _, s in ipairs(sizes) do
      local r = measure(op, s)
      rows[#rows + 1] = r
      tbl:row({ r.bytes, r.count, r.dtype, r.op, r.time_us, r.algbw, r.busbw, r.wrong })
    end
  end
end
if h.rank0 and opt.merge then
  -- this run's CSV is written from rows; rows take the fastest of the earlier runs
  for _, path in ipairs(opt.merge) do
    local prior = read_csv(path)
    nmerged = nmerged + 1
    for _, r in ipairs(rows) do
      local o = prior[r.op .. ":" .. r.bytes]
      local ru = o and tonumber(o.raw_us)
      if ru and (not r.raw_us or ru < r.raw_us) then r.raw_us, r.raw_host_us = ru, tonumber(o.raw_host_us) end
      if o and o.time_us < r.time_us then
        r.time_us, r.algbw, r.busbw, r.host_us = o.time_us, o.algbw_GBps, o.busbw_GBps, tonumber(o.host_us)
      end
      if o then
        r.wrong = r.wrong + o.wrong
        h.wrong = h.wrong + o.wrong
      end
    end
  end
end
if h.rank0 then write_results(rows) end
h:finish()
