-- experiments/cp/cp_memory.lua — peak memory per rank of every context-parallel
-- strategy (distlab.cp.presets), forward and backward, by tag, in MiB and in
-- units (one unit = one per-rank Q tensor), for seed 000's configuration:
-- B=2, S=262144, H=16, D=128, bf16, causal, thd (two sequences of S) and bshd.
--
--   ./distlab run --device meta experiments/cp/cp_memory.lua [--out DIR]
--       CP = 2..64 on the meta device: exact bytes from the same schedule
--       code the GPUs run, the highest of ranks 0, C/2, C-1. Writes
--       DIR/cp-memory.md, cp-memory-meta.csv, cp-memory.png (gnuplot, where it
--       exists) (DIR default experiments/results/cp), and takes the GPU
--       columns from --gpu CSV (default DIR/cp-memory-gpu.csv) when it exists.
--   ./distlab run -n N --device cuda experiments/cp/cp_memory.lua [--out DIR]
--       [--backend ours|cudnn] [--tag TAG]
--       measured on the GPUs at CP=N, and at CP=1 (each GPU alone; main and
--       fused): DIR/cp-memory-gpu[-TAG].csv and .md, distlab's allocator's
--       peaks beside the driver's free-memory delta (what NCCL, cuDNN and the
--       CUDA runtime take shows there). --s shortens the sequence (units do
--       not depend on it).
-- The presets with a backward-only option (dkv) are left out: cp:memory
-- measures the schedule's buffers, which that option does not change
-- forward. Every forward peak measured on meta must equal the schedule's
-- formula; a miss is counted as wrong (#wrong, exit code 1). On meta nothing
-- runs, so no data is checked there (the run says so). On cpu and cuda every
-- schedule measured runs once more, after all the measurements, its forward
-- and backward (planted: --plant noop | scale=X) on fresh inputs, checked
-- against fp64 single-rank attention at sampled rows (distlab.bench.cp_check:
-- --check-elements / D query rows for out, lse, dq, a quarter as many key rows
-- for dk, dv, spread over the whole sequence, every rank's shard; at S =
-- 262144 a row sums over up to 262k keys, hence the small default; TE's bf16
-- tolerance element-wise, normwise 8e-3, bias 2^-10): the GPU table's #wrong.
-- --quick: S = 64 and H = 4 on cpu/cuda; on meta CP = 2, 8, 64 only.
local dl = require "distlab"
local bench = dl.bench
local presets = require "distlab.cp.presets"

local world = dl.comm.world()
local on_meta = world.backend == "meta"
local h = bench.harness {
  name = "cp_memory", family = "cp", comm = world,
  usage = "./distlab run --device meta experiments/cp/cp_memory.lua [options]  (or -n 2 --device cuda)",
  about = "peak memory per rank of every CP strategy, forward and backward, by tag; see the file's header",
  options = {
    { "s", "size", 262144, "sequence length S per sequence (units do not depend on it)", meta = "S" },
    { "gpu", "string", nil, "(meta) the GPU run's CSV for the measured table (default DIR/cp-memory-gpu.csv)",
      meta = "CSV" },
    { "backend", "choice", "ours", "(cuda) the attention backend of the steps", values = { "ours", "cudnn" } },
    { "tag", "string", nil, "(cuda) name the files cp-memory-gpu-TAG.{csv,md} (e.g. h200x4)", meta = "TAG" },
    { "check-elements", "int", 16384, "(cpu, cuda) output elements of out (and of dq) the fp64 check covers per " ..
      "layout (query rows: this / D; key rows for dk, dv: a quarter as many)", meta = "N" },
  },
}
local B, H, D = 2, 16, 128
local S = h.opt.s
if h.quick and not on_meta then -- the smallest case: a short sequence, 4 heads (a2a's overlap needs 2C)
  if not h.given.s then S = 64 end
  H = 4
end
if on_meta then h:unchecked("counts the schedules' bytes on meta: nothing runs (on cpu and cuda the schedules run and are checked)") end
local TAGS = { "inputs", "comm_buffers", "out_per_step", "lse_per_step", "accumulator", "workspace", "seqlens" }

local strategies = {}
for _, st in ipairs(presets.list) do
  if st.dkv == nil then strategies[#strategies + 1] = st end
end

-- One measurement: this rank's shard shapes and seqlens for C ranks.
local function measure(comm, st, layout)
  local C = comm.size
  local shape, seq = { B, S / C, H, D }, nil
  if layout == "thd" then
    shape = { B * S / C, H, D }
    seq = { cu_seqlens_q = { 0, S, 2 * S }, cu_seqlens_q_padded = { 0, S, 2 * S } }
  end
  local o = presets.options(st)
  o.comm, o.layout, o.mask = comm, layout, "causal"
  if not on_meta then o.backend = h.opt.backend end
  local made, cp = pcall(dl.cp.attention, o)
  -- a strategy whose merge lives in our kernel's epilogue cannot run on cudnn: left out
  if not made and o.backend == "cudnn" then return nil end
  if not made then error(cp, 0) end
  -- the driver's side (cuda): free memory before and after, the allocator's cache emptied
  -- first, so the delta holds what the run took from the device: the allocator's blocks
  -- (still cached at the end, at least the peak) and what NCCL, cuDNN and the CUDA
  -- runtime allocate themselves; reserved_delta is the allocator's part of it
  local st0
  if not on_meta then
    collectgarbage("collect")
    dl.synchronize(comm.device)
    dl.mem.empty_cache(comm.device)
    st0 = dl.mem.stats(comm.device)
  end
  local m = cp:memory(shape, shape, shape, { seq = seq })
  local unit = m.fwd.unit
  local row = { device = comm.device, layout = layout, strategy = st.name, C = C, rank = comm.rank, unit = unit,
    cp = cp, comm = comm }
  if st0 then
    dl.synchronize(comm.device)
    local st1 = dl.mem.stats(comm.device)
    if st0.driver_free >= 0 then -- cuda only
      row.driver_delta = st0.driver_free - st1.driver_free
      row.reserved_delta = st1.reserved - st0.reserved
    end
  end
  for _, pass in ipairs({ "fwd", "bwd" }) do
    local rep = m[pass]
    row[pass] = rep.peak
    row[pass .. "_formula"] = m.formula[pass]
    for _, t in ipairs(TAGS) do row[pass .. ":" .. t] = 0 end
    for _, tr in ipairs(rep.rows) do
      if row[pass .. ":" .. tr.tag] then row[pass .. ":" .. tr.tag] = tr.at_peak end
    end
  end
  return row
end

local function csv_header()
  local cols = { "device", "layout", "strategy", "C", "rank", "unit", "fwd", "fwd_formula", "bwd", "bwd_formula",
    "driver_delta", "reserved_delta", "backend" }
  for _, p in ipairs({ "fwd", "bwd" }) do
    for _, t in ipairs(TAGS) do cols[#cols + 1] = p .. ":" .. t end
  end
  cols[#cols + 1] = "wrong"
  return cols
end

local function write_csv(name, rows)
  local cols, out = csv_header(), {}
  for k, r in ipairs(rows) do
    out[k] = {}
    for i, c in ipairs(cols) do out[k][i] = r[c] end
  end
  return h:csv(name, cols, out)
end

-- The rows of a CSV this experiment wrote, numbers as numbers; nil when it is missing.
local function read_csv(path)
  local head, recs = bench.csv.read(path)
  if not head then return nil end
  for _, r in ipairs(recs) do
    for k, v in pairs(r) do r[k] = tonumber(v) or v end
  end
  return recs
end

-- ---- on the GPUs ------------------------------------------------------------------------

if not on_meta then
  local function mib(b) return b and string.format("%.1f", b / 2 ^ 20) or "-" end
  local rows, left = {}, {}
  local alone = world:split(function(r) return r, 0 end)
  for _, layout in ipairs({ "thd", "bshd" }) do
    for _, st in ipairs(strategies) do
      if not presets.applies(st, layout) then goto next end
      if st.name == "main" or st.name == "fused" then rows[#rows + 1] = measure(alone, st, layout) end
      local r = measure(world, st, layout)
      if not r then
        left[#left + 1] = st.name
        goto next
      end
      rows[#rows + 1] = r
      if world.rank == world.size - 1 then
        print(string.format("%-5s %-19s CP=%d  fwd %8.1f MiB (%5.2f units; meta %5.2f)  bwd %8.1f MiB (%5.2f; meta %5.2f)" ..
          "  driver %s MiB (allocator's cache %s)", layout, st.name, r.C, r.fwd / 2 ^ 20, r.fwd / r.unit,
          r.fwd_formula / r.unit, r.bwd / 2 ^ 20, r.bwd / r.unit, r.bwd_formula / r.unit, mib(r.driver_delta),
          mib(r.reserved_delta)))
      end
      ::next::
    end
  end
  world:barrier()
  -- Data: every schedule measured, once more on fresh inputs (one set per layout), checked
  local cpc = require "distlab.bench.cp_check"
  local c
  for i, r in ipairs(rows) do
    if not c or c.x.layout ~= r.layout then -- the rows come layout by layout: one set of inputs at a time
      c = nil
      collectgarbage("collect")
      c = cpc.new { inputs = cpc.inputs { layout = r.layout, B = B, S = S, H = H, D = D, seed = 700 + i }, comm = world,
        elements = h.opt.check_elements, seed = i }
    end
    r.wrong = c:verify(h, string.format("%s %s CP=%d", r.layout, r.strategy, r.C), r.cp, r.comm)
    if world.rank == world.size - 1 then
      print(string.format("%-5s %-19s CP=%d  data: %s", r.layout, r.strategy, r.C,
        r.wrong == 0 and "ok" or r.wrong .. " wrong (stderr)"))
    end
  end
  -- The last rank writes: its peak is the highest (post_loop bshd keeps the most there).
  if world.rank == world.size - 1 then
    local device = bench.markdown.device_name(world.device)
    for _, r in ipairs(rows) do r.device, r.backend = device, h.opt.backend end
    local name = "cp-memory-gpu" .. (h.opt.tag and "-" .. h.opt.tag or "")
    local csv = write_csv(name .. ".csv", rows)
    local md = bench.markdown.table({ "layout", "strategy", "CP", "fwd MiB", "fwd units", "meta fwd units", "bwd MiB",
      "bwd units", "meta bwd units", "driver MiB", "allocator's cache MiB", "driver - cache MiB", "#wrong" }, {},
      { "l", "l", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r" })
    for _, r in ipairs(rows) do
      md[#md + 1] = string.format("| %s | %s | %d | %.1f | %.2f | %.2f | %.1f | %.2f | %.2f | %s | %s | %s | %d |",
        r.layout, r.strategy, r.C, r.fwd / 2 ^ 20, r.fwd / r.unit, r.fwd_formula / r.unit, r.bwd / 2 ^ 20,
        r.bwd / r.unit, r.bwd_formula / r.unit, mib(r.driver_delta), mib(r.reserved_delta),
        mib(r.driver_delta and r.driver_delta - r.reserved_delta), r.wrong)
    end
    local path = h:markdown(name .. ".md", "CP peak memory measured on " .. device .. " (attention backend " ..
      h.opt.backend .. ")", md, {
      string.format("B=%d, S=%d, H=%d, D=%d, bf16, causal; rank %d of %d (the highest peak); CP=1: each device " ..
        "alone (main, fused). fwd/bwd: distlab's allocator, peak over what was allocated before, in MiB and " ..
        "units (one per-rank Q); meta: the schedule's formula. driver: the device's free memory before the " ..
        "run (the allocator's cache emptied) minus after it (its blocks still cached, at least the peak): what " ..
        "the run took from the device; allocator's cache: the growth of the allocator's reserved bytes; the " ..
        "difference is what NCCL, cuDNN and the CUDA runtime allocated themselves (NCCL's buffers on a " ..
        "communicator's first collective, cuDNN's handle and plans), and the allocator's rounding. #wrong: the " ..
        "schedule run once more after the measurements on fresh inputs, its results against fp64 single-rank " ..
        "attention at sampled rows (experiments/cp/cp_memory.lua's header), wrong elements over the ranks.%s", B, S, H, D,
        world.rank, world.size, #left > 0 and (" Left out with backend cudnn (their merge lives in our kernel's " ..
        "epilogue): " .. table.concat(left, ", ") .. ".") or "") })
    print("wrote " .. csv .. " and " .. path)
  end
  h:finish()
  return
end

-- ---- on meta: CP = 2..64 ------------------------------------------------------------------

local rows, worst = {}, {}
for _, layout in ipairs({ "thd", "bshd" }) do
  for _, st in ipairs(strategies) do
    for _, C in ipairs(h.quick and { 2, 8, 64 } or { 2, 4, 8, 16, 32, 64 }) do
      if (st.algo ~= "a2a" or H % (C * (st.overlap and 2 or 1)) == 0) and presets.applies(st, layout) then
        for _, r in ipairs({ 0, C / 2, C - 1 }) do
          local comm = dl.comm.meta(C, r)
          local row = measure(comm, st, layout)
          comm:free()
          h:check(function()
            if row.fwd == row.fwd_formula then return 0 end
            io.stderr:write(string.format("cp_memory: %s %s C=%d rank %d: forward peak %d differs from the formula %d\n",
              layout, st.name, C, r, row.fwd, row.fwd_formula))
            return 1
          end)
          rows[#rows + 1] = row
          local key = layout .. "/" .. st.name .. "/" .. C
          if not worst[key] or row.fwd > worst[key].fwd then worst[key] = row end
        end
      end
    end
  end
end
write_csv("cp-memory-meta.csv", rows)

-- ---- the report ----------------------------------------------------------------------------

local Cs = { 2, 4, 8, 16, 32, 64 }
local out = {}
local function p(fmt, ...) out[#out + 1] = string.format(fmt, ...) end
local function cell(layout, name, C, f)
  local r = worst[layout .. "/" .. name .. "/" .. C]
  return r and f(r) or "—"
end
local function table_of(title, f, with_formula)
  p("\n### %s\n", title)
  p("| layout | strategy | %s |%s", table.concat(Cs, " | "):gsub("(%d+)", "CP=%1"), with_formula and " formula |" or "")
  p("|---|---|%s%s", string.rep("---:|", #Cs), with_formula and "---|" or "")
  for _, layout in ipairs({ "thd", "bshd" }) do
    for _, st in ipairs(strategies) do
      local cells = {}
      for i, C in ipairs(Cs) do cells[i] = cell(layout, st.name, C, f) end
      p("| %s | %s | %s |%s", layout, st.name, table.concat(cells, " | "), with_formula and (" " .. st.units .. " |") or "")
    end
  end
end
local function units(key) return function(r) return string.format("%.2f", r[key] / r.unit) end end

p("Seed 000's configuration: B=2, S=262144, H=16, D=128, bf16, causal; thd = two")
p("sequences of S. One unit = one per-rank Q tensor, B·(S/C)·H·D·2 bytes (%d MiB at CP=2,", 2 * S / 2 * H * D * 2 / 2 ^ 20)
p("%d MiB at CP=64); l = one per-rank LSE = 1/64 unit. Measured on the meta device (exact", 2 * S / 64 * H * D * 2 / 2 ^ 20)
p("bytes, the same schedule code the GPUs run; `experiments/cp/cp_memory.lua`), on the rank")
p("with the highest peak of ranks 0, C/2 and C-1. Every measured forward peak equals the")
p("formula written at the top of its schedule file (checked by the run and by")
p("`spec/cp_spec.lua`). Strategies: main = p2p, comm_buffers \"per_step\", correction")
p("\"post_loop\" (TransformerEngine's main); double = 2 comm buffers, post_loop;")
p("double+incremental = seed 000's PR; fused = 2 buffers, the merge in the attention kernel's")
p("epilogue. all_gather and a2a for comparison (a2a needs H divisible by C); all_gather, overlap")
p("attends to the local K/V while the gathers run (bshd/sbhd only), so its (out, lse) accumulator")
p("exists during the gathers: one unit and an LSE more than all_gather. a2a, overlap runs two head")
p("groups in a pipeline (heads per rank even, so C <= 8 here): one LSE more than a2a.")
table_of("Forward peak, units above the inputs (the seed's \"P2P algo\" column)",
  function(r) return string.format("%.2f", (r.fwd - r["fwd:inputs"]) / r.unit) end, true)
local function wu(name, C) return worst["thd/" .. name .. "/" .. C] end
local function above(r) return (r.fwd - r["fwd:inputs"]) / r.unit end
p("\nAgainst the seed: main grows by 3 units per rank (%.2f at CP=8, %.2f at CP=64; the",
  above(wu("main", 8)), above(wu("main", 64)))
p("seed gives 3C+2 for thd and 3C+3 for bshd: the same growth, 2C of K/V buffers and C")
p("per-step outputs; the constants differ by what each implementation keeps beside them,")
p("ours frees the K/V buffers before it allocates the merged output). Double buffering")
p("alone still grows with C through the per-step outputs. Double+incremental (the seed's")
p("PR) is constant: %.2f units (seed: ~8",
  above(wu("double+incremental", 64)))
p("thd, ~9 bshd). Fused is constant and lowest: %.2f units (target <= 6): two K/V buffers and",
  above(wu("fused", 64)))
p("the running (O, L), nothing per step. With the inputs, at CP=64: main %.2f GiB,",
  wu("main", 64).fwd / 2 ^ 30)
p("double+incremental %.2f GiB, fused %.2f GiB (the seed: ~6.3 GiB to ~1.1 GiB; its GiB",
  wu("double+incremental", 64).fwd / 2 ^ 30, wu("fused", 64).fwd / 2 ^ 30)
p("figures count more than the schedule's own buffers, e.g. cuDNN's forward workspace, which")
p("our attention kernel does not take).")
p("At CP=2 the ring needs one receive buffer, so every p2p strategy is lower there.")
table_of("Forward peak including the inputs q, k, v, GiB", function(r) return string.format("%.2f", r.fwd / 2 ^ 30) end)
table_of("Backward peak including q, k, v, dout, out, lse (units)", units("bwd"))

p("\n### Forward peak by tag (units at the peak), CP=8 and CP=64\n")
p("| layout | strategy | CP | %s | total |", table.concat(TAGS, " | "))
p("|---|---|---:|%s---:|", string.rep("---:|", #TAGS))
for _, layout in ipairs({ "thd", "bshd" }) do
  for _, st in ipairs(strategies) do
    for _, C in ipairs({ 8, 64 }) do
      local r = worst[layout .. "/" .. st.name .. "/" .. C]
      if r then
        local cells = {}
        for i, t in ipairs(TAGS) do cells[i] = string.format("%.2f", r["fwd:" .. t] / r.unit) end
        p("| %s | %s | %d | %s | %.2f |", layout, st.name, C, table.concat(cells, " | "), r.fwd / r.unit)
      end
    end
  end
end

local gpu_csv = h.opt.gpu or h:path("cp-memory-gpu.csv")
local gpu = read_csv(gpu_csv)
p("\n### Measured on GPUs\n")
if not gpu then
  p("Not measured yet: `scripts/gpu/cp.sh` on a 2-GPU machine writes `cp-memory-gpu.csv`;")
  p("rerunning this experiment on meta then adds the table here.")
else
  -- when and how: the GPU run's markdown header (an older run left a .txt line)
  local base = gpu_csv:match("([^/]+)$")
  local head = bench.markdown.read_header((gpu_csv:gsub("%.csv$", ".md")))
  local when = io.open((gpu_csv:gsub("%.csv$", ".txt")), "r")
  if head and head.date then
    p("Measured %s on %s, commit `%s`, `%s` (`%s`).\n", head.date, head.device or "?", head.commit or "?",
      head.command or "?", base)
  elseif when then
    p("Measured %s (`%s`).\n", (when:read("*l") or ""), base)
  end
  if when then when:close() end
  p("%s, the last rank. CP=1: each GPU alone; CP=2: both. Units above the inputs (fwd) and", gpu[1].device)
  p("with the held tensors (bwd); meta = the formula for the same shapes.")
  p("Differences from meta: the caching allocator rounds every block up to 512 bytes.\n")
  p("| layout | strategy | CP | fwd MiB | fwd units | meta | bwd MiB | bwd units | meta |")
  p("|---|---|---:|---:|---:|---:|---:|---:|---:|")
  for _, r in ipairs(gpu) do
    p("| %s | %s | %d | %.1f | %.2f | %.2f | %.1f | %.2f | %.2f |", r.layout, r.strategy, r.C, r.fwd / 2 ^ 20,
      (r.fwd - r["fwd:inputs"]) / r.unit, (r.fwd_formula - 3 * r.unit) / r.unit, r.bwd / 2 ^ 20, r.bwd / r.unit, r.bwd_formula / r.unit)
  end
end

-- The plot: forward units above the inputs against C, from the CSV just written.
local dat = os.tmpname()
local f = assert(io.open(dat, "w"))
for _, layout in ipairs({ "thd", "bshd" }) do
  for _, st in ipairs(strategies) do
    f:write(string.format("# %s %s\n", layout, st.name))
    local any = false
    for _, C in ipairs(Cs) do
      local r = worst[layout .. "/" .. st.name .. "/" .. C]
      if r then f:write(string.format("%d %.4f\n", C, (r.fwd - r["fwd:inputs"]) / r.unit)) any = true end
    end
    if not any then f:write("2 NaN\n") end -- keeps the block, so the indices stay in step
    f:write("\n\n")
  end
end
f:close()
local plots = {}
for i, st in ipairs(strategies) do
  plots[i] = string.format("'%s' index IDX+%d with linespoints lw 2 dt %d title '%s'", dat, i - 1,
    st.algo == "p2p" and 1 or 2, st.name)
end
local png = h:path("cp-memory.png")
local gp = string.format([[
set terminal pngcairo size 1200,480 font ",11" noenhanced
set output '%s'
set multiplot layout 1,2 title "CP forward peak per rank above the inputs (B=2, S=262144, H=16, D=128, bf16, causal; meta)"
set logscale xy 2
set xtics (2, 4, 8, 16, 32, 64)
set xrange [1.8:72]
set xlabel "CP size C"
set ylabel "units (one per-rank Q tensor)"
set key top left
set grid
set title "thd"
plot %s
set title "bshd"
plot %s
unset multiplot
]], png, (table.concat(plots, ", "):gsub("IDX", "0")), (table.concat(plots, ", "):gsub("IDX", tostring(#strategies))))
local drawn, note = bench.plot.gnuplot(gp, png)
os.remove(dat)
if drawn then p("\n![forward peak per rank against C](cp-memory.png)") end

local path = h:markdown("cp-memory.md", "Context-parallel attention: peak memory per rank", out,
  { "meta device: " .. dl.build_info() })
print(table.concat(out, "\n"))
if note then print(note) end
print("wrote " .. path .. ", cp-memory-meta.csv" .. (drawn and ", cp-memory.png" or ""))
h:finish()
