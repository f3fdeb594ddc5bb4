-- experiments/cp_memory.lua — peak memory per rank of every context-parallel
-- strategy, forward and backward, by tag, in MiB and in units (one unit =
-- one per-rank Q tensor), for seed 000's configuration: B=2, S=262144,
-- H=16, D=128, bf16, causal, thd (two sequences of S) and bshd.
--
--   ./distlab run --device meta experiments/cp_memory.lua
--       CP = 2..64 on the meta device: exact bytes from the same schedule
--       code the GPUs run, the highest of ranks 0, C/2, C-1. Writes
--       experiments/results/cp-memory.md, cp-memory-meta.csv, cp-memory.png
--       (and takes the GPU columns from cp-memory-gpu.csv when it exists).
--   ./distlab run -n 2 --device cuda experiments/cp_memory.lua [dir]
--       measured on the GPUs at CP=2, and at CP=1 (each GPU alone; main and
--       fused): dir/cp-memory-gpu.csv (default experiments/results).
--       CP_MEM_S=... shortens the sequence (units do not depend on it).
local dl = require "distlab"

local results = dl.root .. "/experiments/results"
local B, H, D = 2, 16, 128
local S = tonumber(os.getenv("CP_MEM_S") or "262144")
local TAGS = { "inputs", "comm_buffers", "out_per_step", "lse_per_step", "accumulator", "workspace", "seqlens" }

local strategies = {
  { name = "main", algo = "p2p", comm_buffers = "per_step", correction = "post_loop" },
  { name = "double", algo = "p2p", comm_buffers = 2, correction = "post_loop" },
  { name = "double+incremental", algo = "p2p", comm_buffers = 2, correction = "incremental" },
  { name = "fused", algo = "p2p", comm_buffers = 2, correction = "fused" },
  { name = "all_gather", algo = "all_gather" },
  { name = "all_gather, overlap", algo = "all_gather", overlap = true, only = "bshd" },
  { name = "a2a", algo = "a2a" },
  { name = "a2a, overlap", algo = "a2a", overlap = true },
}
-- a strategy that takes one layout only (all_gather's overlap: bshd/sbhd)
local function applies(st, layout) return not st.only or st.only == layout end
-- Units above the inputs, MHA, C >= 3, l = one LSE = 1/64 unit here.
local formulas = {
  main = "3C + C l", double = "4 + C (1 + l)", ["double+incremental"] = "7 + 3 l",
  fused = "5 + l", all_gather = "3C", ["all_gather, overlap"] = "3C + 1 + l", a2a = "6 + l",
  ["a2a, overlap"] = "6 + 2 l",
}

-- One measurement: this rank's shard shapes and seqlens for C ranks.
local function measure(comm, st, layout)
  local C = comm.size
  local shape, seq = { B, S / C, H, D }, nil
  if layout == "thd" then
    shape = { B * S / C, H, D }
    seq = { cu_seqlens_q = { 0, S, 2 * S }, cu_seqlens_q_padded = { 0, S, 2 * S } }
  end
  local cp = dl.cp.attention { comm = comm, algo = st.algo, comm_buffers = st.comm_buffers,
    correction = st.correction, overlap = st.overlap, layout = layout, mask = "causal" }
  local m = cp:memory(shape, shape, shape, { seq = seq })
  local unit = m.fwd.unit
  local row = { device = comm.device, layout = layout, strategy = st.name, C = C, rank = comm.rank, unit = unit }
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
  local cols = { "device", "layout", "strategy", "C", "rank", "unit", "fwd", "fwd_formula", "bwd", "bwd_formula" }
  for _, p in ipairs({ "fwd", "bwd" }) do
    for _, t in ipairs(TAGS) do cols[#cols + 1] = p .. ":" .. t end
  end
  return cols
end

local function write_csv(path, rows)
  local cols = csv_header()
  local f = assert(io.open(path, "w"))
  f:write(table.concat(cols, ","), "\n")
  for _, r in ipairs(rows) do
    local v = {}
    for i, c in ipairs(cols) do v[i] = tostring(r[c]) end
    f:write(table.concat(v, ","), "\n")
  end
  f:close()
end

local function read_csv(path)
  local f = io.open(path)
  if not f then return nil end
  local cols, rows = nil, {}
  for line in f:lines() do
    local v = {}
    for x in line:gmatch("[^,]+") do v[#v + 1] = x end
    if not cols then cols = v
    else
      local r = {}
      for i, c in ipairs(cols) do r[c] = tonumber(v[i]) or v[i] end
      rows[#rows + 1] = r
    end
  end
  f:close()
  return rows
end

-- ---- on the GPUs ------------------------------------------------------------------------

local world = dl.comm.world()
if world.backend ~= "meta" then
  local dir = arg[1] or results
  local rows = {}
  local alone = world:split(function(r) return r, 0 end)
  for _, layout in ipairs({ "thd", "bshd" }) do
    for _, st in ipairs(strategies) do
      if not applies(st, layout) then goto next end
      if st.name == "main" or st.name == "fused" then rows[#rows + 1] = measure(alone, st, layout) end
      rows[#rows + 1] = measure(world, st, layout)
      if world.rank == world.size - 1 then
        local r = rows[#rows]
        print(string.format("%-5s %-19s CP=%d  fwd %8.1f MiB (%5.2f units; meta %5.2f)  bwd %8.1f MiB (%5.2f; meta %5.2f)",
          layout, st.name, r.C, r.fwd / 2 ^ 20, r.fwd / r.unit, r.fwd_formula / r.unit, r.bwd / 2 ^ 20,
          r.bwd / r.unit, r.bwd_formula / r.unit))
      end
      ::next::
    end
  end
  world:barrier()
  -- The last rank writes: its peak is the highest (post_loop bshd keeps the most there).
  if world.rank == world.size - 1 then
    for _, r in ipairs(rows) do r.device = world.backend == "nccl" and dl.cuda_device_name(0):gsub(",", " ") or world.device end
    write_csv(dir .. "/cp-memory-gpu.csv", rows)
    -- when and how, for the table's caption
    local f = assert(io.open(dir .. "/cp-memory-gpu.txt", "w"))
    f:write(string.format("%s, %d ranks, `CP_MEM_S=%d ./distlab run -n %d --device cuda experiments/cp_memory.lua`\n",
      os.date("!%Y-%m-%d %H:%M UTC"), world.size, S, world.size))
    f:close()
    print("wrote " .. dir .. "/cp-memory-gpu.csv and .txt")
  end
  return
end

-- ---- on meta: CP = 2..64 ------------------------------------------------------------------

local rows, worst = {}, {}
for _, layout in ipairs({ "thd", "bshd" }) do
  for _, st in ipairs(strategies) do
    for _, C in ipairs({ 2, 4, 8, 16, 32, 64 }) do
      if (st.algo ~= "a2a" or H % (C * (st.overlap and 2 or 1)) == 0) and applies(st, layout) then
        for _, r in ipairs({ 0, C / 2, C - 1 }) do
          local comm = dl.comm.meta(C, r)
          local row = measure(comm, st, layout)
          comm:free()
          assert(row.fwd == row.fwd_formula, "forward peak differs from the formula: " .. st.name)
          rows[#rows + 1] = row
          local key = layout .. "/" .. st.name .. "/" .. C
          if not worst[key] or row.fwd > worst[key].fwd then worst[key] = row end
        end
      end
    end
  end
end
write_csv(results .. "/cp-memory-meta.csv", rows)

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
      p("| %s | %s | %s |%s", layout, st.name, table.concat(cells, " | "), with_formula and (" " .. formulas[st.name] .. " |") or "")
    end
  end
end
local function units(key) return function(r) return string.format("%.2f", r[key] / r.unit) end end

p("# Context-parallel attention: peak memory per rank")
p("")
p("Generated %s by `./distlab run --device meta experiments/cp_memory.lua` (meta device: %s).",
  os.date("!%Y-%m-%d %H:%M UTC"), dl.build_info())
p("")
p("Seed 000's configuration: B=2, S=262144, H=16, D=128, bf16, causal; thd = two")
p("sequences of S. One unit = one per-rank Q tensor, B·(S/C)·H·D·2 bytes (%d MiB at CP=2,", 2 * S / 2 * H * D * 2 / 2 ^ 20)
p("%d MiB at CP=64); l = one per-rank LSE = 1/64 unit. Measured on the meta device (exact", 2 * S / 64 * H * D * 2 / 2 ^ 20)
p("bytes, the same schedule code the GPUs run; `experiments/cp_memory.lua`), on the rank")
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

local gpu = read_csv(results .. "/cp-memory-gpu.csv")
p("\n### Measured on GPUs\n")
if not gpu then
  p("Not measured yet: `scripts/gpu/cp.sh` on a 2-GPU machine writes `cp-memory-gpu.csv`;")
  p("rerunning this experiment on meta then adds the table here.")
else
  local when = io.open(results .. "/cp-memory-gpu.txt", "r")
  if when then
    p("Measured %s (`cp-memory-gpu.csv`).\n", (when:read("*l") or ""))
    when:close()
  end
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
local gp = string.format([[
set terminal pngcairo size 1200,480 font ",11" noenhanced
set output '%s/cp-memory.png'
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
]], results, (table.concat(plots, ", "):gsub("IDX", "0")), (table.concat(plots, ", "):gsub("IDX", tostring(#strategies))))
local ok = os.execute("gnuplot <<'EOF'\n" .. gp .. "EOF\n")
os.remove(dat)
if ok == 0 or ok == true then p("\n![forward peak per rank against C](cp-memory.png)") end

local md = assert(io.open(results .. "/cp-memory.md", "w"))
md:write(table.concat(out, "\n"), "\n")
md:close()
print(table.concat(out, "\n"))
