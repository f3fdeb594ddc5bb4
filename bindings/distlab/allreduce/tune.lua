-- distlab.allreduce.tune — measuring the algorithms and writing the dispatch
-- table that algo = "auto" follows (distlab.allreduce.table reads it).
-- dl.allreduce.tune, .time_call, .fmt_bytes, .serialize and .default_sizes
-- are these.
local core = require "distlab.core"
local graph = require "distlab.graph"
local T = require "distlab.allreduce.table"

local C, fail = core.C, core.fail

local U = {}

-- Default sizes: the sweep's (experiments/allreduce_sweep.lua), 8 KiB .. 1 GiB.
U.default_sizes = {}
for _, kb in ipairs { 8, 16, 32, 64, 128, 256 } do U.default_sizes[#U.default_sizes + 1] = kb * 1024 end
for _, rows in ipairs { 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 3062, 4096 } do
  U.default_sizes[#U.default_sizes + 1] = rows * 8192 * 2
end
for _, mb in ipairs { 128, 256, 512, 1024 } do U.default_sizes[#U.default_sizes + 1] = mb * 2 ^ 20 end

-- Grids worth trying for an algorithm at a size: the kernels' own sizing and
-- a few fixed ones, none with blocks that would get less than 128 vectors
-- (2 KiB; the core spreads the vectors evenly over the blocks, so a block
-- may cover less than one step of its threads), or less than a warp's 32
-- for the Lamport kernels, whose blocks shrink to the positions they get
-- (the core's shape_for), so that a small call can use more multiprocessors.
local function grid_choices(a, algo, nbytes)
  if algo == "nccl" then return { 0 } end
  local vecs = math.ceil(nbytes / 16)
  if algo:match("^two_shot") then vecs = math.ceil(vecs / a.size) end
  local least = algo:match("_lamport$") and 32 or 128
  local most = math.min(a.max_blocks, math.max(1, math.ceil(vecs / least)))
  local sms = a.sms > 0 and a.sms or 4
  -- above 16 MB only whole-GPU grids: one or two blocks a multiprocessor (at 4 ranks
  -- two_shot_lamport took 132 blocks at 4-8 MB and 264 at 16 MB on H200s)
  local tries = nbytes > 16 * 2 ^ 20 and { sms, 2 * sms } or { 8, 16, 32, 64, sms, 2 * sms }
  -- the Lamport two-shot between them as well at 2-8 MB (4 ranks on H200s: 3 MB took 22.9 us at 132 and
  -- 264 blocks, 23.9 at 64, where PyTorch's two-shot took 22.6; 4 MB 27.3 at 64 against 29.0 at 132)
  if algo == "two_shot_lamport" and nbytes >= 2 * 2 ^ 20 and nbytes <= 8 * 2 ^ 20 then
    for _, g in ipairs { 96, math.floor(3 * sms / 2) } do tries[#tries + 1] = g end
  end
  -- one_shot_lamport only on grids resident at once. On two waves of blocks
  -- (2 ranks, 2 MB, 264 blocks of 512 threads, one a multiprocessor then) it
  -- fell into a mode of about 194 us a call that lasts (2 H200s;
  -- allreduce-stall-h200.md), which the tune's few timed replays need not
  -- meet. Its kernel fits two full blocks (a.threads each) a multiprocessor
  -- at 2 ranks (kernels/allreduce/one_shot.cu, lamport_occupancy), one at
  -- others; its blocks shrink to the positions they get (the core's shape_for).
  local function resident(g)
    if algo ~= "one_shot_lamport" or g <= sms then return true end
    local per_sm = (a.size == 2 and 2 or 1) * a.threads
    local t = math.min(a.threads, math.ceil(vecs / g / 32) * 32)
    return g <= sms * math.floor(per_sm / t)
  end
  local out, seen = { 0 }, {}
  for _, g in ipairs(tries) do
    if g <= most and not seen[g] and resident(g) then
      seen[g] = true
      out[#out + 1] = g
    end
  end
  return out
end

-- Median time (us) of one call, max over the ranks of comm.
local function time_call(a, fn, replays)
  local comm = a.comm
  local st = graph.bench(fn, { ops = 10, warmup = 3, replays = replays, before = function() comm:barrier() end })
  a:check()
  local dl = require "distlab"
  local v = dl.full({ 1 }, st.median * 1e3, { dtype = "f64", device = comm.device })
  comm:all_reduce(v, "max")
  return v:item()
end
U.time_call = time_call

-- Does algo (with grid g) sum right on t (in place)? rank + 1 everywhere, the
-- first, middle and last elements read back; every rank learns if any saw
-- a wrong one, so all leave the same cases out.
local function probe(a, algo, g, t)
  local dl = require "distlab"
  local comm = a.comm
  local n = t:numel()
  t:fill_(comm.rank + 1)
  a:run(t, { algo = algo, blocks = g })
  a:check()
  local want, bad = comm.size * (comm.size + 1) / 2, 0
  for _, i in ipairs { 1, math.floor((n + 1) / 2), n } do
    if t:narrow(1, i, 1):item() ~= want then bad = 1 end
  end
  local v = dl.full({ 1 }, bad, { dtype = "f64", device = comm.device })
  comm:all_reduce(v, "max")
  return v:item() == 0
end

local function fmt_bytes(b)
  if b >= 2 ^ 30 and b % 2 ^ 30 == 0 then return (b / 2 ^ 30) .. " GiB" end
  if b >= 2 ^ 20 then return string.format("%.4g MiB", b / 2 ^ 20) end
  return string.format("%.4g KiB", b / 1024)
end
U.fmt_bytes = fmt_bytes

local function serialize(entries)
  local out = { "-- all-reduce dispatch tables (distlab.allreduce): one entry per device and world size.",
    "-- rows: the algorithm (and grid, 0 = the kernels' own) for sizes up to `upto` bytes;",
    "-- the last row has no upto and covers everything larger.", "return {" }
  for _, e in ipairs(entries) do
    out[#out + 1] = "  {"
    for _, k in ipairs { "device", "world", "dtype", "date", "source", "provisional" } do
      if e[k] ~= nil then out[#out + 1] = string.format("    %s = %s,", k, type(e[k]) == "string" and string.format("%q", e[k]) or tostring(e[k])) end
    end
    for _, k in ipairs { "rows", "zc_rows" } do
      if e[k] then
        out[#out + 1] = "    " .. k .. " = {"
        for _, r in ipairs(e[k]) do
          out[#out + 1] = string.format("      { %salgo = %q, blocks = %d%s },", r.upto and ("upto = " .. r.upto .. ", ") or "",
            r.algo, r.blocks or 0, r.us and string.format(", us = %.2f, at = %d", r.us, r.at) or "")
        end
        out[#out + 1] = "    },"
      end
    end
    out[#out + 1] = "  },"
  end
  out[#out + 1] = "}"
  return table.concat(out, "\n") .. "\n"
end
U.serialize = serialize

-- The fastest algorithm and grid on x (in place), every candidate timed
-- (each appended to `measured`, zc marking an input in the zero-copy
-- region), near-ties timed again: {algo, blocks, us, at}.
local function fastest(a, x, algos, opts, log, measured, zc)
  local n, es = x:numel(), C.dl_dtype_size(x.dtype_id)
  local replays = opts.replays or 30
  replays = math.max(5, math.min(replays, math.floor(replays * 8 * 2 ^ 20 / (n * es))))
  local best
  local here = {} -- this size's measurements
  for _, algo in ipairs(algos) do
    for _, g in ipairs(grid_choices(a, algo, n * es)) do
      if not probe(a, algo, g, x) then
        log(string.format("tune %10s%s: %s blocks %d gives wrong sums; left out", fmt_bytes(n * es), zc and " zc" or "",
          algo, g))
        goto next
      end
      x:zero_()
      local us = time_call(a, function() a:run(x, { algo = algo, blocks = g }) end, replays)
      here[#here + 1] = { bytes = n * es, algo = algo, blocks = g, us = us, timings = 1, zc = zc }
      measured[#measured + 1] = here[#here]
      if not best or us < best.us then best = { algo = algo, blocks = g, us = us, at = n * es } end
      ::next::
    end
  end
  if not best then fail("tune: no algorithm gave right sums at %s%s", fmt_bytes(n * es), zc and " (zero copy)" or "") end
  -- near-ties again, in turns (times are the max over ranks: every rank sees the same list)
  local close = {}
  for _, m in ipairs(here) do if m.us <= best.us * 1.05 then close[#close + 1] = m end end
  if #close > 1 then
    for _ = 1, opts.rematch or 2 do
      for _, m in ipairs(close) do
        local us = time_call(a, function() a:run(x, { algo = m.algo, blocks = m.blocks }) end, replays)
        m.us, m.timings = math.min(m.us, us), m.timings + 1
      end
    end
    best = nil
    for _, m in ipairs(close) do
      if not best or m.us < best.us then best = { algo = m.algo, blocks = m.blocks, us = m.us, at = n * es } end
    end
  end
  log(string.format("tune %10s%s: %-14s blocks %3d  %9.2f us", fmt_bytes(n * es), zc and " zc" or "   ", best.algo,
    best.blocks, best.us))
  return best
end

-- Rows from each measured size's best: each size rules up to the geometric
-- middle of it and the next, and neighbours with the same choice merge.
local function rows_of(rows)
  for i, r in ipairs(rows) do
    if rows[i + 1] then r.upto = math.floor(math.sqrt(r.at * rows[i + 1].at) / 16) * 16 end
  end
  local merged = {}
  for _, r in ipairs(rows) do
    local last = merged[#merged]
    if last and last.algo == r.algo and last.blocks == r.blocks then
      last.upto = r.upto
    else
      merged[#merged + 1] = r
    end
  end
  return merged
end

-- dl.allreduce.tune{sizes = {...}, comm =, file =, algos =, replays = 30, dtype = "bf16", log = print,
--                   rematch = 2, zc = true}
-- -> entry (rows, zc_rows, and every measurement in entry.measured), file
-- Candidates within 5% of the best at a size are timed `rematch` more times,
-- in turns, each keeping its fastest: one timing's noise does not pick the row.
-- zc (default on): the sizes that fit the zero-copy region are measured again
-- with the input there (ar:buffer), in place, every algorithm: entry.zc_rows,
-- what "auto" runs on such an input.
function U.tune(opts)
  opts = require("distlab.args").options(opts, { "comm", "sizes", "algos", "dtype", "log", "zc", "file", "replays",
    "rematch" }, "allreduce.tune")
  local dl = require "distlab"
  local comm = opts.comm or dl.comm.world()
  local ar = require "distlab.allreduce"
  local a = ar.get(comm)
  local sizes = opts.sizes or U.default_sizes
  local algos = opts.algos or ar.algos
  local dtype = opts.dtype or "bf16"
  local es = C.dl_dtype_size(core.dtype_id(dtype))
  local log = opts.log or (comm.rank == 0 and print or function() end)
  local measured, rows, zc_rows = {}, {}, {}
  table.sort(sizes)
  for _, bytes in ipairs(sizes) do
    local n = math.max(1, math.floor(bytes / es))
    local x = dl.zeros({ n }, { dtype = dtype, device = comm.device })
    rows[#rows + 1] = fastest(a, x, algos, opts, log, measured, false)
    x:free()
  end
  if opts.zc ~= false then
    for _, bytes in ipairs(sizes) do
      local n = math.max(1, math.floor(bytes / es))
      if n * es <= a.max_bytes then
        zc_rows[#zc_rows + 1] = fastest(a, a:buffer({ n }, dtype), algos, opts, log, measured, true)
      end
    end
  end
  local name = T.device_name(comm)
  local entry = { device = name, world = comm.size, dtype = dtype, date = os.date("!%Y-%m-%d %H:%M UTC"),
    source = "dl.allreduce.tune", rows = rows_of(rows), zc_rows = #zc_rows > 0 and rows_of(zc_rows) or nil,
    measured = measured }
  local file = opts.file or os.getenv("DISTLAB_AR_TABLE") or T.home_file()
  if comm.rank == 0 then
    local entries = {}
    for _, e in ipairs(T.read_entries(file) or {}) do
      if not (e.device == name and e.world == comm.size) then entries[#entries + 1] = e end
    end
    table.insert(entries, 1, entry)
    os.execute("mkdir -p '" .. file:match("^(.*)/[^/]*$") .. "'")
    local f = assert(io.open(file .. ".tmp", "w"))
    f:write(serialize(entries))
    f:close()
    assert(os.rename(file .. ".tmp", file))
  end
  comm:barrier()
  T.forget() -- every rank reads the new table on its next "auto"
  return entry, file
end

return U
