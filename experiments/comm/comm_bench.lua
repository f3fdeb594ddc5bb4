-- experiments/comm_bench.lua — nccl-tests style benchmark of distlab's
-- communicators: all_reduce, all_gather, reduce_scatter, all_to_all and
-- sendrecv from 8 B up (f32, out of place), plus the point-to-point copy
-- bandwidth into a neighbour's symmetric buffer (symm_put).
--
--   ./distlab run -n 2 --device cuda experiments/comm_bench.lua [options]
--     -b BYTES  -e BYTES     sizes, doubling (default 8 .. 1G on cuda, 8 .. 16M on cpu)
--     --ops a,b,...          subset of all_reduce,all_gather,reduce_scatter,all_to_all,sendrecv,symm_put
--     --tag NAME             results file name: experiments/results/comm-NAME.{csv,md}
--                            (default: GPU model and rank count, e.g. h200x2)
--     --compare A.csv[,B.csv] the CSV(s) of experiments/lab/nccl_loop.c from the same
--                            call: the markdown then compares the two, size by size
--                            (several loop runs: the fastest of them per op and size)
--     --merge C.csv[,...]    this benchmark's own CSV(s) from earlier runs in the same
--                            call: each op and size keeps its fastest run, as for the
--                            loop, so run-to-run drift (clocks, placement) treats the
--                            two sides alike
--     --out DIR              where results go (default experiments/results)
--     --raw                  (nccl) also time the same ops as raw NCCL calls through the
--                            FFI on this communicator's own ncclComm_t, same buffers,
--                            same stream, alternating with distlab's repetition by
--                            repetition: what distlab adds, with the host's drift shared
--     --report-only RUN.csv  measure nothing: write the CSV and markdown from this
--                            benchmark's CSV of an earlier run (with --merge and
--                            --compare), e.g. after two runs of each side in ABBA
--                            order; --device-name NAME and --ranks N name the machine
--                            it ran on (any device works for this step)
--
-- Method (the same as nccl_loop.c, so the two are comparable): per size,
-- 5 warm-up ops, then 5 repetitions of [barrier, event, `iters` back-to-back
-- ops, event] with iters = clamp(2^28 / bytes, 10, 1000); time = elapsed /
-- iters; the max over ranks of each repetition, the median over repetitions.
-- algbw = bytes / time; busbw = algbw x nccl-tests' factor: all_reduce
-- 2(n-1)/n, all_gather, reduce_scatter and all_to_all (n-1)/n, sendrecv and
-- symm_put 1. Data are checked after timing (first and last element of each
-- rank's block, like nccl_loop.c); #wrong counts misses over all ranks, and
-- any makes the exit code non-zero.
local ffi = require "ffi"
local dl = require "distlab"

-- ---- options -----------------------------------------------------------------

local function bytes_arg(s)
  local n, unit = tostring(s):match("^(%d+)([KkMmGg]?)$")
  if not n then error("bad size " .. tostring(s) .. " (e.g. 8, 64K, 16M, 1G)", 0) end
  return tonumber(n) * ({ [""] = 1, k = 2 ^ 10, m = 2 ^ 20, g = 2 ^ 30 })[unit:lower()]
end

local w = dl.comm.world()
local N, me = w.size, w.rank
local on_gpu = w.backend == "nccl"
local opt = { b = 8, e = on_gpu and 2 ^ 30 or 2 ^ 24, out = "experiments/results",
  ops = "all_reduce,all_gather,reduce_scatter,all_to_all,sendrecv,symm_put" }
local i = 1
while i <= #arg do
  local a, v = arg[i], arg[i + 1]
  if a == "-b" then opt.b = bytes_arg(v)
  elseif a == "-e" then opt.e = bytes_arg(v)
  elseif a == "--ops" then opt.ops = v
  elseif a == "--tag" then opt.tag = v
  elseif a == "--compare" then opt.compare = v
  elseif a == "--merge" then opt.merge = v
  elseif a == "--report-only" then opt.report_only = v
  elseif a == "--device-name" then opt.device_name = v
  elseif a == "--ranks" then opt.ranks = tonumber(v)
  elseif a == "--out" then opt.out = v
  elseif a == "--raw" then opt.raw, i = true, i - 1
  else error("unknown option " .. tostring(a), 0) end
  i = i + 2
end

local device_name = on_gpu and dl.cuda_device_name(tonumber(w.device:match("%d+"))) or w.device
local backend = w.backend
if opt.report_only then -- the figures come from a run on another machine or device
  device_name, backend, on_gpu = opt.device_name or "unknown device", "nccl", true
  N = opt.ranks or N
end
if not opt.tag then
  local model = on_gpu and (device_name:match("([AHBL]%d+)") or "gpu"):lower() or backend
  opt.tag = model .. "x" .. N
end

-- ---- ops -------------------------------------------------------------------------

local REPS, WARMUP = 5, 5
local function iters_for(bytes) return math.max(10, math.min(1000, math.floor(2 ^ 28 / bytes))) end
local function round_bytes(s) return math.max(4 * N, math.floor(s / (4 * N)) * 4 * N) end

local factor = { all_reduce = 2 * (N - 1) / N, all_gather = (N - 1) / N, reduce_scatter = (N - 1) / N,
  all_to_all = (N - 1) / N, sendrecv = 1, symm_put = 1 }
local nxt, prv = (me + 1) % N, (me - 1 + N) % N
local maxb = round_bytes(opt.e)
local send = dl.empty({ maxb / 4 }):fill_(me + 1)
local recv = dl.empty({ maxb / 4 }):fill_(0)
local symm

-- op -> function(bytes) returning (issue one op, recv tensor, expected value of element i)
local make = {}
function make.all_reduce(b)
  local s, r = send:narrow(1, 1, b / 4), recv:narrow(1, 1, b / 4)
  return function() w:all_reduce(s, "sum", r) end, r, function() return N * (N + 1) / 2 end
end
function make.all_gather(b)
  local s, r = send:narrow(1, 1, b / 4 / N), recv:narrow(1, 1, b / 4)
  return function() w:all_gather(r, s) end, r, function(i) return math.floor(i / (b / 4 / N)) + 1 end
end
function make.reduce_scatter(b)
  local s, r = send:narrow(1, 1, b / 4), recv:narrow(1, 1, b / 4 / N)
  return function() w:reduce_scatter(r, s, "sum") end, r, function() return N * (N + 1) / 2 end
end
function make.all_to_all(b)
  local s, r = send:narrow(1, 1, b / 4), recv:narrow(1, 1, b / 4)
  return function() w:all_to_all(r, s) end, r, function(i) return math.floor(i / (b / 4 / N)) + 1 end
end
function make.sendrecv(b)
  local s, r = send:narrow(1, 1, b / 4), recv:narrow(1, 1, b / 4)
  local function pair()
    w:send(s, nxt)
    w:recv(r, prv)
  end
  return function() dl.comm.group(pair) end, r, function() return prv + 1 end
end
function make.symm_put(b)
  symm = symm or dl.symm.alloc(w, { maxb / 4 }, "f32")
  local s, dst = send:narrow(1, 1, b / 4), symm:view(nxt, 0, { b / 4 })
  -- the put lands in the next rank's buffer: check ours after a barrier
  local mine = symm:view(me, 0, { b / 4 })
  return function() dst:copy_(s) end, mine, function() return prv + 1 end, function() symm:barrier() end
end

-- ---- measuring -----------------------------------------------------------------------

-- --raw: the same op as plain NCCL calls on this communicator's ncclComm_t
local raw = {}
if opt.raw and not on_gpu then error("--raw times raw NCCL calls: it needs the nccl backend (--device cuda)", 0) end
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

local e0, e1 = dl.event(), dl.event()
-- per repetition: distlab's device and host time, then raw NCCL's (--raw; else 0); then #wrong
local NV = 4 * REPS + 1
local red = dl.empty({ NV }, { dtype = "f64" })

local now_us = dl.now_us

-- every rank's numbers -> max of each (times), sum of the last (#wrong)
local function across_ranks(vals)
  local host = dl.empty({ NV }, { dtype = "f64", device = "cpu" })
  local p = ffi.cast("double*", host:data_ptr())
  for k = 1, NV do p[k - 1] = vals[k] end
  red:copy_(host)
  local wrong = red:narrow(1, NV, 1)
  w:all_reduce(red:narrow(1, 1, NV - 1), "max")
  w:all_reduce(wrong, "sum")
  host:copy_(red)
  local out = {}
  for k = 1, NV do out[k] = p[k - 1] end
  return out
end

local function median(vals, first, count)
  local t = {}
  for k = 1, count do t[k] = vals[first + k - 1] end
  table.sort(t)
  return t[math.floor(count / 2) + 1]
end

local function measure(op, s)
  local b = round_bytes(s)
  local issue, out, want, settle = make[op](b)
  local iters = iters_for(b)
  local plain = raw[op] and raw[op](b)
  for _ = 1, WARMUP do issue() end
  if plain then for _ = 1, WARMUP do plain() end end
  local vals = {}
  for k = 1, 4 * REPS do vals[k] = 0 end
  local function timed(fn, at, rep)
    w:barrier()
    e0:record()
    local h0 = now_us()
    for _ = 1, iters do fn() end
    vals[at + REPS + rep] = (now_us() - h0) / iters -- the host's time to issue one op
    e1:record()
    e1:synchronize(w:info().timeout)
    vals[at + rep] = e0:elapsed(e1) * 1e3 / iters
  end
  for rep = 1, REPS do -- with --raw, ABBA order repetition by repetition
    if plain and rep % 2 == 0 then timed(plain, 2 * REPS, rep) end
    timed(issue, 0, rep)
    if plain and rep % 2 == 1 then timed(plain, 2 * REPS, rep) end
  end
  w:synchronize()
  if settle then settle() end
  local n = out:numel()
  local blocks = (op == "all_gather" or op == "all_to_all") and N or 1
  local block, wrong = math.floor(n / blocks), 0
  local host = dl.empty({ n }, { device = "cpu" })
  host:copy_(out)
  local p = ffi.cast("float*", host:data_ptr())
  for j = 0, blocks - 1 do
    local first, last = j * block, (j + 1) * block - 1
    if p[first] ~= want(first) then wrong = wrong + 1 end
    if p[last] ~= want(last) then wrong = wrong + 1 end
  end
  host:free()
  vals[NV] = wrong
  local all = across_ranks(vals)
  local us = median(all, 1, REPS)
  local alg = b / us * 1e-3
  return { impl = "distlab", op = op, bytes = b, count = b / 4, dtype = "f32", iters = iters, time_us = us,
    algbw = alg, busbw = alg * factor[op], wrong = all[NV], host_us = median(all, REPS + 1, REPS),
    raw_us = plain and median(all, 2 * REPS + 1, REPS), raw_host_us = plain and median(all, 3 * REPS + 1, REPS) }
end

-- ---- reporting -------------------------------------------------------------------------

local nmerged = 1 -- how many runs (this one and --merge's) the written table takes its fastest from

local function fmt_row(r)
  return string.format("%12d %12d %6s %-15s %10.2f %8.2f %8.2f %6d", r.bytes, r.count, r.dtype, r.op, r.time_us,
    r.algbw, r.busbw, r.wrong)
end

-- The records of a results CSV (this benchmark's or nccl_loop.c's), in order.
local function csv_records(path)
  local out, head = {}, nil
  local f = assert(io.open(path, "r"), "cannot read " .. path)
  for line in f:lines() do
    local cells = {}
    for c in (line .. ","):gmatch("([^,]*),") do cells[#cells + 1] = c end
    if not head then head = cells
    else
      local r = {}
      for k, name in ipairs(head) do r[name] = tonumber(cells[k]) or cells[k] end
      out[#out + 1] = r
    end
  end
  f:close()
  return out
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
  os.execute("mkdir -p " .. opt.out)
  local base = opt.out .. "/comm-" .. opt.tag
  local cmd = string.format("./distlab run -n %d --device %s experiments/comm_bench.lua %s", opt.report_only and w.size or N,
    opt.report_only and w.device or on_gpu and "cuda" or w.device, table.concat(arg, " "))
  local csv = assert(io.open(base .. ".csv", "w"))
  csv:write("impl,op,bytes,count,dtype,iters,time_us,algbw_GBps,busbw_GBps,wrong,host_us,raw_us,raw_host_us\n")
  local function opt2(v) return v and string.format("%.2f", v) or "" end
  for _, r in ipairs(rows) do
    csv:write(string.format("%s,%s,%d,%d,%s,%d,%.2f,%.2f,%.2f,%d,%s,%s,%s\n", r.impl, r.op, r.bytes, r.count, r.dtype,
      r.iters, r.time_us, r.algbw, r.busbw, r.wrong, opt2(r.host_us), opt2(r.raw_us), opt2(r.raw_host_us)))
  end
  csv:close()
  local md = { "# Communicator benchmark: " .. opt.tag, "",
    string.format("- device: %s x %d (%s backend)", device_name, N, backend),
    "- date: " .. os.date("!%Y-%m-%d %H:%M UTC"),
    "- command: `" .. cmd .. "`",
    "- NCCL watchdog: " .. (os.getenv("DISTLAB_NCCL_WATCHDOG") == "0" and "off" or "on"),
    "- method: f32, out of place; 5 warm-up ops, " .. REPS .. " x [barrier, `iters` ops between events], max over ranks, " ..
      "median over repetitions; busbw factors of nccl-tests; host us = the host's time to issue one op (where it " ..
      "approaches the device time, the loop is host-bound)", "" }
  local ref, nref = nil, 0
  for path in (opt.compare or ""):gmatch("[^,]+") do ref, nref = read_csv(path, ref), nref + 1 end
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
  local worst_bw, worst_at, lat = 1e9, "-", {}
  for _, r in ipairs(rows) do
    local c = ref and ref[r.op .. ":" .. r.bytes]
    if c then
      local ratio = r.busbw / c.busbw_GBps
      if r.bytes >= 2 ^ 20 and ratio < worst_bw then worst_bw, worst_at = ratio, r.op .. " " .. r.bytes end
      if r.bytes == round_bytes(opt.b) then lat[#lat + 1] = string.format("%s %+.2f us", r.op, r.time_us - c.time_us) end
      local function h(v) return tonumber(v) and string.format("%.2f", v) or "-" end
      md[#md + 1] = string.format("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.3f | %+.2f | %s | %s | %d |", r.op, r.bytes,
        r.time_us, c.time_us, r.busbw, c.busbw_GBps, ratio, r.time_us - c.time_us, h(r.host_us), h(c.host_us), r.wrong)
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
      if r.bytes == round_bytes(opt.b) then small[#small + 1] = string.format("%s %+.2f us", r.op, r.time_us - r.raw_us) end
      md[#md + 1] = string.format("| %s | %d | %.2f | %.2f | %+.2f | %.3f | %.2f | %.2f |", r.op, r.bytes, r.time_us,
        r.raw_us, r.time_us - r.raw_us, ratio, r.host_us or 0, r.raw_host_us or 0)
    end
    md[#md + 1] = ""
    if wat ~= "-" then md[#md + 1] = string.format("Worst busbw ratio to raw NCCL at sizes >= 1 MiB: %.3f (%s).", worst, wat) end
    md[#md + 1] = string.format("At %d B, distlab minus raw NCCL: %s.", round_bytes(opt.b), table.concat(small, ", "))
  end
  if ref then
    md[#md + 1] = ""
    if worst_at ~= "-" then
      md[#md + 1] = string.format("Worst busbw ratio at sizes >= 1 MiB: %.3f (%s); the bar is >= 0.97.", worst_bw, worst_at)
    end
    md[#md + 1] = string.format("Latency at %d B, distlab minus plain NCCL: %s; the bar is <= 2 us.",
      round_bytes(opt.b), table.concat(lat, ", "))
  end
  local f = assert(io.open(base .. ".md", "w"))
  f:write(table.concat(md, "\n") .. "\n")
  f:close()
  print("wrote " .. base .. ".csv and " .. base .. ".md")
end

-- ---- main ----------------------------------------------------------------------------

local rows, total_wrong = {}, 0
if me == 0 then
  print(string.format("# distlab comm_bench: %s x %d, %s backend, %d..%d bytes", device_name, N, backend,
    round_bytes(opt.b), maxb))
  print(string.format("#%11s %12s %6s %-15s %10s %8s %8s %6s", "size", "count", "type", "op", "time_us", "algbw",
    "busbw", "#wrong"))
end
-- --report-only: the rows of an earlier run's CSV, in its order
local function csv_rows(path)
  local out = {}
  for _, r in ipairs(csv_records(path)) do
    out[#out + 1] = { impl = r.impl, op = r.op, bytes = r.bytes, count = r.count, dtype = r.dtype, iters = r.iters,
      time_us = r.time_us, algbw = r.algbw_GBps, busbw = r.busbw_GBps, wrong = r.wrong, host_us = tonumber(r.host_us),
      raw_us = tonumber(r.raw_us), raw_host_us = tonumber(r.raw_host_us) }
  end
  return out
end

if opt.report_only then
  rows = csv_rows(opt.report_only)
  for _, r in ipairs(rows) do total_wrong = total_wrong + r.wrong end
  opt.ops = "" -- nothing to measure
end
for op in opt.ops:gmatch("[^,]+") do
  if not make[op] then error("unknown op " .. op, 0) end
  local s = opt.b
  while s <= opt.e do
    local r = measure(op, s)
    rows[#rows + 1] = r
    total_wrong = total_wrong + r.wrong
    if me == 0 then
      print(fmt_row(r))
      io.stdout:flush()
    end
    s = s * 2
  end
end
if me == 0 and opt.merge then
  -- this run's CSV is written from rows; rows take the fastest of the earlier runs
  for path in opt.merge:gmatch("[^,]+") do
    local prior = read_csv(path)
    nmerged = nmerged + 1
    for _, r in ipairs(rows) do
      local o = prior[r.op .. ":" .. r.bytes]
      local ru = o and tonumber(o.raw_us)
      if ru and (not r.raw_us or ru < r.raw_us) then r.raw_us, r.raw_host_us = ru, tonumber(o.raw_host_us) end
      if o and o.time_us < r.time_us then
        r.time_us, r.algbw, r.busbw, r.host_us = o.time_us, o.algbw_GBps, o.busbw_GBps, tonumber(o.host_us)
        r.wrong = r.wrong + o.wrong
      elseif o then
        r.wrong = r.wrong + o.wrong
      end
    end
  end
end
if me == 0 then write_results(rows) end
w:barrier()
if total_wrong > 0 then
  io.stderr:write(string.format("comm_bench: %d wrong elements\n", total_wrong))
  os.exit(1)
end
