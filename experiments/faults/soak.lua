-- experiments/faults/soak.lua — a soak (issue 53): for --duration seconds, the ranks run a
-- mix of every multi-rank operator with shapes that change from op to op, check every
-- result, and sample memory; wrong results and memory that grows fail the run.
--
--   ./distlab run -n 4 --device cuda experiments/faults/soak.lua [options]   (4 ranks sharing
--       one GPU under MPS: scripts/gpu/soak.sh)
--   ./distlab run -n 4 --device cpu experiments/faults/soak.lua --duration 20 --warmup 5 --sample 5
--     --duration S   seconds of ops (default 600)      --warmup S   memory before this is not
--     --sample S     memory sampled every S seconds    judged (default 60)
--     --seed N       the RNG every rank draws the same ops and shapes from
--     --reps N       runs of each drawn case, each on fresh data and checked (default 3)
--     --kinds LIST   allreduce,ep,overlap,cp (default all)
--     --plant KIND[:noop|:scale=X]   an error put into every op of KIND (default scale=0.02:
--                    outputs times 1.02), to show that the checks see it; --plant noop|scale=X
--                    (as every bench takes it): into every kind
--     --steps N      stop after N steps too (0: no limit)
--     --first all|kinds   the first pass: every variant of every kind (default), or one case
--                    of each kind (a short run: spec/soak_spec.lua)
--     --pool N       N shapes per variant drawn once at the start; the first pass then runs each
--                    of them too, and every later step picks a variant and one of its N shapes
--                    (fresh data each time). 0 (default): every step draws its shapes afresh.
--                    Libraries load code and grow their own tables on a shape they first meet
--                    (cuBLASLt's kernels for a new GEMM shape): memory that grows with new
--                    shapes is not memory that grows with ops; with a pool, growth after the
--                    first pass is the ops' own
--     --quick        one step of each kind, one rep, memory sampled but not judged (the
--                    benches' smallest case: spec/bench_plant_spec.lua runs it)
--     --tol BYTES    how far memory may move after the warm-up (default 1M)
--     --out DIR --tag NAME   the results file DIR/soak-NAME.md (default
--                    experiments/results/faults, NAME the GPU model in lower case, or cpu)
--
-- Method. Each step draws (experiments/faults/soak_ops.lua) a kind in turn (all-reduce
-- with every algorithm of dl.allreduce.algos; EP dispatch/combine, both layouts, both
-- outputs, bf16 and fp8, one launch or send/recv apart; ag_gemm and gemm_rs, every
-- variant of dl.overlap.variants; CP forward + backward, every preset of dl.cp.presets
-- that takes the layout, bshd/sbhd/thd, causal), its variant and its shapes, makes the op
-- (an EP buffer, an overlap op, a CP object: made and freed each step, so that their
-- buffers come and go), runs it --reps times on fresh inputs and checks each result on
-- the host against an fp64 reference at sampled rows (soak_ops.lua says which), then
-- frees it. The first pass runs every variant of every kind once, every size at its
-- largest, so that every code path has run and the high-water marks are reached before
-- memory is judged: from the later of --warmup and the end of that pass. Rank 0's clock
-- decides, broadcast before each step, when to sample and when to stop. A sample: the
-- JIT's traces flushed and Lua's garbage collected, the device synchronized, a barrier,
-- the allocator's allocated and cached bytes read, its cache emptied, a barrier, then its
-- reserved bytes, the device's used bytes (cudaMemGetInfo: all processes on the GPU; cuda
-- only) and the process's VmRSS (/proc/self/status; its anonymous, file and shared-memory
-- parts, the Lua heap, malloc's bytes in use, threads and open files reported beside it).
-- Before RSS is read, glibc gives its free pages back (malloc_trim(0)): the pages it keeps
-- inside its heap after a large step's frees are not memory in use, and left there they
-- came and went as single samples 1.5 MiB high on 4 cpu ranks (no growth before or after).
-- malloc in use (mallinfo2: heap and mmapped blocks) tells a leak of malloc'ed memory (ours,
-- or a library's) from pages a driver maps itself: RSS that grows while it stays flat is the
-- latter.
-- Host memory judged: the process's own, RSS's anonymous and shared-memory parts. Its
-- file-backed part (pages of the libraries' code and data, the page cache's, which the kernel
-- brings in at a code path's first use and may drop at will) is reported, not judged: on an
-- H200 (24d627e) ranks 1-3 moved 1.4-1.8 MiB up and down with malloc flat, unplaced then.
-- Verdict: 0 wrong elements, and allocated, reserved, device used and host private memory
-- each within --tol (max - min over the samples judged) on every rank.
-- Large host blocks are kept out of glibc's heap (mallopt M_MMAP_THRESHOLD 128 KiB, no
-- dynamic threshold), so a freed reference buffer goes back to the system rather than
-- staying in RSS at whatever size the largest shape left.
-- Exit code 1 on any wrong result or growth, 2 on an error (its message on stderr, the
-- results file written with what rank 0 had).
local ffi = require "ffi"
local dl = require "distlab"
local options = require "distlab.bench.options"
local markdown = require "distlab.bench.markdown"
local json = require "distlab.json"
local verify = require "distlab.bench.verify"
local ops = dofile(dl.root .. "/experiments/faults/soak_ops.lua")

pcall(ffi.cdef, "int mallopt(int param, int value);")
pcall(ffi.cdef, "int getpid(void);")
pcall(ffi.cdef, "int malloc_trim(size_t pad);")
pcall(ffi.cdef, [[struct mallinfo2 { size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks,
  fordblks, keepcost; }; struct mallinfo2 mallinfo2(void);]])
ffi.C.mallopt(-3, 131072) -- M_MMAP_THRESHOLD

local w = dl.comm.world()
local N, me, dev = w.size, w.rank, w.device
local gpu = dev:match("^cuda") ~= nil

local parser = options.new({
  { "duration", "number", 600, "seconds of ops" },
  { "warmup", "number", 60, "seconds before memory is judged" },
  { "sample", "number", 60, "seconds between memory samples" },
  { "seed", "int", 1, "the RNG's seed (every rank draws the same ops and shapes)" },
  { "reps", "int", 3, "runs of each drawn case, each on fresh data, each checked" },
  { "kinds", "list", table.concat(ops.kinds, ","), "kinds of op to mix", values = ops.kinds },
  { "plant", "string", nil, "KIND[:noop|:scale=X]: an error in every op of KIND (default scale=0.02)" },
  { "tol", "size", "1M", "bytes memory may move after the warm-up" },
  { "steps", "int", 0, "stop after this many steps too (0: no limit)" },
  { "first", "choice", "all", "the first pass, every size at its largest: every variant of every kind, or one case "
    .. "of each kind", values = { "all", "kinds" } },
  { "pool", "int", 0, "shapes per variant drawn once at the start, the steps then pick among them (0: every "
    .. "step draws afresh)" },
  { "quick", "flag", nil, "one step of each kind, one rep; memory sampled, not judged" },
  { "out", "string", "experiments/results/faults", "results folder", meta = "DIR" },
  { "tag", "string", nil, "the results file is soak-TAG.md (default: GPU model, or cpu)" },
  { "command", "string", nil, "the command to record (default: this one)" },
}, { program = "soak", usage = "./distlab run -n 4 --device cuda experiments/faults/soak.lua [options]",
  about = "a mix of every multi-rank op, every result checked, memory sampled; see the file's header" })
local ok_parse, opt = pcall(parser.parse, parser, arg)
if not ok_parse then
  io.stderr:write(tostring(opt), "\n")
  os.exit(2)
end
if opt.help then
  if me == 0 then print(parser:help()) end
  os.exit(0)
end

if opt.quick then opt.steps, opt.reps, opt.duration, opt.warmup = #opt.kinds, 1, 1e9, 1e9 end
local plant = {}
if opt.plant then
  local kind, how = opt.plant:match("^([%w_]+):?(.*)$")
  local ok_plant, p = pcall(verify.parse_plant, ops[kind or ""] and (how ~= "" and how or "scale=0.02") or opt.plant)
  if not ok_plant then
    io.stderr:write(string.format("soak: --plant %s: expected KIND[:noop|:scale=X] (KIND one of %s), noop or scale=X\n",
      opt.plant, table.concat(ops.kinds, ", ")))
    os.exit(2)
  end
  for _, k in ipairs(ops.kinds) do if not ops[kind or ""] or k == kind then plant[k] = p end end
end
local tag = opt.tag or (gpu and (markdown.device_name(dev):match("([AHBL]%d+)") or "gpu"):lower() or "cpu")
local ctx = { w = w, N = N, me = me, dev = dev, gpu = gpu, reps = opt.reps, plant = plant }

-- ---- memory --------------------------------------------------------------------------------------

local MiB = 1048576

-- VmRSS and its parts (anonymous, file-backed, shared memory), bytes
local function rss()
  local f = io.open("/proc/self/status", "r")
  if not f then return -1 end
  local kb = {}
  for line in f:lines() do
    local k, v = line:match("^(%w+):%s*(%d+) kB")
    if k then kb[k] = tonumber(v) * 1024 end
    kb.threads = kb.threads or tonumber(line:match("^Threads:%s*(%d+)"))
  end
  f:close()
  local p = io.popen("ls /proc/" .. (ffi.C.getpid()) .. "/fd 2>/dev/null | wc -l")
  local fds = p and tonumber(p:read("*a")) or -1
  if p then p:close() end
  return kb.VmRSS or -1, kb.RssAnon, kb.RssFile, kb.RssShmem, kb.threads, fds
end

-- One sample (collective): every rank at once
local function sample(t)
  -- compiled traces are let go (they come back as the code runs): what the JIT holds grows
  -- with every new path the random cases take, up to its limits, and is not what is judged
  jit.flush()
  collectgarbage("collect")
  collectgarbage("collect")
  dl.synchronize(dev)
  -- every rank past the step's frees (a peer's mapping of a buffer we free here is closed)
  w:barrier()
  local before = dl.mem.stats(dev)
  dl.mem.empty_cache(dev)
  w:barrier()
  local st = dl.mem.stats(dev)
  local s = { t = t, allocated = st.allocated, cached = before.reserved, reserved = st.reserved }
  ffi.C.malloc_trim(0)
  local mi = ffi.C.mallinfo2()
  s.malloc = tonumber(mi.uordblks) + tonumber(mi.hblkhd)
  s.rss, s.anon, s.file, s.shmem, s.threads, s.fds = rss()
  -- the process's own pages (VmRSS where the kernel gives no parts)
  s.private = s.anon and s.anon + (s.shmem or 0) or s.rss
  s.lua = collectgarbage("count") * 1024
  if st.driver_total and st.driver_total > 0 then s.device = st.driver_total - st.driver_free end
  w:barrier()
  return s
end

local METRICS = { { "allocated", "allocated" }, { "reserved", "reserved (after emptying the cache)" },
  { "device", "device used (all processes)" }, { "private", "host private (RSS anonymous + shared memory)" } }
-- reported beside them, not judged: where RSS that grew went
local SHOWN = { { "rss", "host RSS (reported, not judged)" }, { "anon", "RSS anonymous (reported, not judged)" },
  { "file", "RSS file-backed (reported, not judged)" },
  { "shmem", "RSS shared memory (reported, not judged)" },
  { "malloc", "malloc in use (reported, not judged)" }, { "lua", "Lua heap (reported, not judged)" } }
for i, m in ipairs(METRICS) do table.insert(SHOWN, i, m) end

-- memory is judged from the later of --warmup and the end of the first pass (nil: not reached)
local judged_from = nil

-- max - min of each metric over the samples judged: {metric = bytes}, and how many
local function growth(samples)
  local g, n = {}, 0
  for _, s in ipairs(samples) do
    if judged_from and s.t >= judged_from then
      n = n + 1
      for _, m in ipairs(SHOWN) do
        local v = s[m[1]]
        if v then
          local e = g[m[1]] or { lo = v, hi = v }
          e.lo, e.hi = math.min(e.lo, v), math.max(e.hi, v)
          g[m[1]] = e
        end
      end
    end
  end
  for k, e in pairs(g) do g[k] = e.hi - e.lo end
  return g, n
end

-- ---- the loop ------------------------------------------------------------------------------------

local rng = ops.rng(opt.seed)
local stats, order = {}, {} -- "kind|variant" -> {kind, variant, steps, ops, wrong, elements, shapes}
local msgs, samples = {}, {}
local total_wrong, steps = 0, 0

local function record(kind, c, n_ops, wrong, elements, msg)
  local k = ops[kind]
  local key = kind .. "|" .. k.label(c)
  local s = stats[key]
  if not s then
    s = { kind = kind, variant = k.label(c), steps = 0, ops = 0, wrong = 0, elements = 0 }
    stats[key] = s
    order[#order + 1] = key
  end
  s.steps, s.ops, s.wrong, s.elements = s.steps + 1, s.ops + n_ops, s.wrong + wrong, s.elements + elements
  total_wrong = total_wrong + wrong
  if wrong > 0 and #msgs < 20 then
    msgs[#msgs + 1] = string.format("step %d, %s %s %s: %d wrong: %s", steps, kind, k.label(c), k.shape(c), wrong, msg)
    io.stderr:write(string.format("soak: data check failed on rank %d of %d: %s\n", me, N, msgs[#msgs]))
  end
end

-- rank 0's clock, on every rank: {elapsed, sample now, stop now}
local ctl = dl.zeros({ 3 }, { dtype = "f32", device = dev })
local t0 = dl.now_us()
local next_sample = 0
local function control()
  if me == 0 then
    local el = (dl.now_us() - t0) / 1e6
    local stop = el >= opt.duration or (opt.steps > 0 and steps >= opt.steps)
    ctl:copy_(dl.from_table({ el, (el >= next_sample or stop) and 1 or 0, stop and 1 or 0 }, { dtype = "f32" }):to(dev))
  end
  w:broadcast(ctl, 0)
  local v = ctl:to("cpu"):tolist()
  return v[1], v[2] ~= 0, v[3] ~= 0
end

local function progress(el)
  if me ~= 0 then return end
  local by = {}
  for _, key in ipairs(order) do
    local s = stats[key]
    by[s.kind] = (by[s.kind] or 0) + s.ops
  end
  local parts = {}
  for _, k in ipairs(opt.kinds) do parts[#parts + 1] = k .. " " .. (by[k] or 0) end
  local s = samples[#samples]
  local mem = string.format("allocated %.3f MiB, reserved %.3f MiB%s, RSS %.3f MiB (anon %.3f, file %.3f, shmem %.3f; "
    .. "Lua heap %.3f, malloc in use %.3f; %d threads, %d fds; rank 0)", s.allocated / MiB, s.reserved / MiB,
    s.device and string.format(", device used %.3f MiB", s.device / MiB) or "", s.rss / MiB, (s.anon or 0) / MiB,
    (s.file or 0) / MiB, (s.shmem or 0) / MiB, s.lua / MiB, s.malloc / MiB, s.threads or -1, s.fds or -1)
  io.stdout:write(string.format("[soak +%.0f s] steps %d; ops: %s; wrong %d; %s\n", el, steps, table.concat(parts, ", "),
    total_wrong, mem))
  io.stdout:flush()
end

-- the first pass: every variant of every kind, the kinds in turn, every size at its largest
local first = {}
do
  local lists, most = {}, 0
  for i, k in ipairs(opt.kinds) do
    lists[i] = opt.first == "all" and ops[k].variants(ctx) or { rng:pick(ops[k].variants(ctx)) }
    most = math.max(most, #lists[i])
  end
  for j = 1, most do
    for i, k in ipairs(opt.kinds) do
      if lists[i][j] then first[#first + 1] = { kind = k, v = lists[i][j] } end
    end
  end
end

-- --pool N: every variant's N shapes, drawn now; the first pass runs each of them after the
-- largest ones (the kinds in turn), so that every shape has met its libraries before judging
local pool = {}
if opt.pool > 0 then
  local most = 0
  for _, k in ipairs(opt.kinds) do
    pool[k] = {}
    for _, v in ipairs(ops[k].variants(ctx)) do
      local shapes = {}
      for _ = 1, opt.pool do shapes[#shapes + 1] = ops[k].draw(rng, ctx, false, v) end
      pool[k][#pool[k] + 1] = shapes
    end
    most = math.max(most, #pool[k] * opt.pool)
  end
  for j = 1, most do
    for _, k in ipairs(opt.kinds) do
      local per = pool[k]
      local vi, si = (j - 1) % #per + 1, math.floor((j - 1) / #per) + 1
      if per[vi] and per[vi][si] then first[#first + 1] = { kind = k, case = per[vi][si] } end
    end
  end
end

-- a pooled case again, on fresh data (its seed redrawn; its shapes as drawn)
local function from_pool(kind)
  local per = pool[kind]
  local c = {}
  for key, val in pairs(per[rng:int(1, #per)][rng:int(1, opt.pool)]) do c[key] = val end
  c.seed = rng:int(1, 2 ^ 20)
  return c
end

local function soak()
  local kinds = opt.kinds
  while true do
    local el, do_sample, stop = control()
    if steps == #first and not judged_from then judged_from = math.max(opt.warmup, el) end
    if do_sample then
      samples[#samples + 1] = sample(el)
      progress(el)
      while next_sample <= el do next_sample = next_sample + opt.sample end
    end
    if stop then break end
    local kind, c
    if steps < #first then
      kind = first[steps + 1].kind
      c = first[steps + 1].case or ops[kind].draw(rng, ctx, true, first[steps + 1].v)
    else
      kind = kinds[steps % #kinds + 1]
      c = opt.pool > 0 and from_pool(kind) or ops[kind].draw(rng, ctx, false)
    end
    steps = steps + 1
    record(kind, c, ops[kind].run(c, ctx))
  end
end

local ok, err = xpcall(soak, debug.traceback)
local elapsed = (dl.now_us() - t0) / 1e6

-- ---- every rank's figures to rank 0 (the store), the results file -----------------------------

local mine = { rank = me, stats = stats, order = order, samples = samples, msgs = msgs, wrong = total_wrong,
  steps = steps, error = not ok and tostring(err) or nil }
local all = { [0] = mine }
if ok then
  local store = dl.comm.store()
  local prefix = "soak/" .. (os.getenv("DISTLAB_JOB_ID") or "job") .. "/"
  store:set(prefix .. me, json.encode(mine))
  if me == 0 then for r = 1, N - 1 do all[r] = json.decode(store:get(prefix .. r), "rank " .. r .. "'s figures") end end
else
  io.stderr:write(string.format("soak: rank %d of %d failed after %.0f s: %s\n", me, N, elapsed, tostring(err)))
end

local function mib(b) return b and string.format("%.3f", b / MiB) or "-" end

local status = ok and 0 or 2
local grown = {}
for r = 0, N - 1 do
  local a = all[r]
  if a then
    local g, n = growth(a.samples)
    a.growth, a.judged = g, n
    for _, m in ipairs(METRICS) do
      if g[m[1]] and g[m[1]] > opt.tol then grown[#grown + 1] = string.format("rank %d %s grew %.3f MiB", r, m[2], g[m[1]] / MiB) end
    end
    if n < 2 and ok and not opt.quick then
      grown[#grown + 1] = string.format("rank %d: %d sample(s) judged (2 needed; %s)", r, n, judged_from and
        string.format("judged from %.0f s", judged_from) or "the first pass over every variant did not finish")
    end
  end
end
local wrong = 0
for r = 0, N - 1 do if all[r] then wrong = wrong + all[r].wrong end end
if ok and (wrong > 0 or #grown > 0) then status = 1 end

if me == 0 then
  local verdict
  if not ok then verdict = "FAILED: an error ended the run (below)"
  elseif status == 0 and opt.quick then verdict = "PASSED: 0 wrong (--quick: memory sampled, not judged)"
  elseif status == 0 then verdict = string.format("PASSED: 0 wrong, memory flat within %s MiB from %.0f s on",
      mib(opt.tol), judged_from)
  else verdict = string.format("FAILED: %d wrong elements%s", wrong, #grown > 0 and ("; " .. table.concat(grown, "; ")) or "") end
  local info = markdown.run_info { comm = w, command = opt.command }
  local lines = markdown.header(string.format("Soak: %d ranks, %s, %.0f s of mixed ops (experiments/faults/soak.lua)", N,
    gpu and (markdown.device_name(dev) .. " shared") or dev, elapsed), info, {
    string.format("ranks: %d on %s%s", N, dev, gpu and (os.getenv("CUDA_MPS_PIPE_DIRECTORY") and ", under MPS" or
      ", MPS not named in the environment") or ""),
    string.format("options: duration %g s, warm-up %g s, samples every %g s, seed %d, %d reps per case, kinds %s, " ..
      "first pass over %s (%d steps), memory tolerance %s MiB%s", opt.duration, opt.warmup, opt.sample, opt.seed,
      opt.reps, table.concat(opt.kinds, ","), (opt.first == "all" and "every variant" or "one case of each kind") ..
      (opt.pool > 0 and string.format(" and then every shape of the pool (%d per variant, drawn at the start; "
        .. "every later step picks one of them)", opt.pool) or ""), #first,
      mib(opt.tol),
      opt.plant and (", PLANTED " .. opt.plant) or ""),
    "method: see experiments/faults/soak.lua's header (and soak_ops.lua for each kind's reference)",
  })
  lines[#lines + 1] = ""
  lines[#lines + 1] = "**Verdict: " .. verdict .. "**"
  lines[#lines + 1] = ""
  -- ops of each kind and variant, summed over ranks where each rank checks its own results
  local rows, by_kind = {}, {}
  for _, key in ipairs(mine.order) do
    local s = mine.stats[key]
    local wr, el = 0, 0
    for r = 0, N - 1 do
      local x = all[r] and all[r].stats[key]
      if x then wr, el = wr + x.wrong, el + x.elements end
    end
    rows[#rows + 1] = { s.kind, s.variant, s.steps, s.ops, el, wr }
    local k = by_kind[s.kind] or { 0, 0, 0, 0 }
    by_kind[s.kind] = { k[1] + s.steps, k[2] + s.ops, k[3] + el, k[4] + wr }
  end
  table.sort(rows, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  lines[#lines + 1] = "## Ops"
  lines[#lines + 1] = ""
  lines[#lines + 1] = "Each step: a case drawn, its op made, run and checked --reps times, freed. ops: calls per rank " ..
    "(EP and CP count dispatch + combine, forward + backward as two); elements checked and wrong: over all ranks."
  lines[#lines + 1] = ""
  local trows = {}
  for _, k in ipairs(opt.kinds) do
    local v = by_kind[k] or { 0, 0, 0, 0 }
    trows[#trows + 1] = { "**" .. k .. "**", "(all)", v[1], v[2], v[3], v[4] }
    for _, r in ipairs(rows) do if r[1] == k then trows[#trows + 1] = r end end
  end
  for _, l in ipairs(markdown.table({ "kind", "variant", "steps", "ops", "elements checked", "wrong" }, trows,
    { "l", "l", "r", "r", "r", "r" })) do lines[#lines + 1] = l end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "## Memory"
  lines[#lines + 1] = ""
  lines[#lines + 1] = "MiB at each sample; per rank allocated / reserved (after emptying the cache) / host private; the " ..
    "cache before emptying in brackets. Judged from " .. (judged_from and string.format("%.0f s on (the later of the " ..
    "warm-up, %g s, and the end of the first pass over every variant)", judged_from, opt.warmup) or
    "nowhere: the first pass over every variant did not finish") .. "."
  lines[#lines + 1] = ""
  local head = { "t (s)", "device used" }
  for r = 0, N - 1 do head[#head + 1] = "rank " .. r end
  local mrows = {}
  for i, s in ipairs(mine.samples) do
    local row = { string.format("%.0f%s", s.t, judged_from and s.t >= judged_from and "" or " (warm-up)"), mib(s.device) }
    for r = 0, N - 1 do
      local x = all[r] and all[r].samples[i]
      row[#row + 1] = x and string.format("%s / %s / %s [%s]", mib(x.allocated), mib(x.reserved), mib(x.private), mib(x.cached))
        or "-"
    end
    mrows[#mrows + 1] = row
  end
  for _, l in ipairs(markdown.table(head, mrows)) do lines[#lines + 1] = l end
  lines[#lines + 1] = ""
  local grows = {}
  for _, m in ipairs(SHOWN) do
    local row = { m[2] }
    for r = 0, N - 1 do
      local g = all[r] and all[r].growth and all[r].growth[m[1]]
      row[#row + 1] = g and string.format("%.1f KiB", g / 1024) or "-"
    end
    grows[#grows + 1] = row
  end
  local ghead = { "growth after the warm-up (max - min)" }
  for r = 0, N - 1 do ghead[#ghead + 1] = "rank " .. r end
  for _, l in ipairs(markdown.table(ghead, grows)) do lines[#lines + 1] = l end
  local bad = {}
  for r = 0, N - 1 do for _, m in ipairs(all[r] and all[r].msgs or {}) do bad[#bad + 1] = "rank " .. r .. ": " .. m end end
  if #bad > 0 or not ok then
    lines[#lines + 1] = ""
    lines[#lines + 1] = "## Wrong results and errors (the first of each rank)"
    lines[#lines + 1] = ""
    lines[#lines + 1] = "```"
    if not ok then lines[#lines + 1] = "rank 0 error: " .. tostring(err) end
    for _, m in ipairs(bad) do lines[#lines + 1] = m end
    lines[#lines + 1] = "```"
  end
  os.execute(string.format("mkdir -p '%s'", opt.out))
  local path = markdown.write(opt.out .. "/soak-" .. tag .. ".md", lines)
  print(string.format("soak: %s; %d steps in %.0f s; results: %s", verdict, steps, elapsed, path))
end
if ok then w:barrier() end
os.exit(status)
