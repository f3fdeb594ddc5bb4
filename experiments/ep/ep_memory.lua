-- experiments/ep/ep_memory.lua — per-rank bytes of the expert-parallel
-- buffer (distlab.ep), both layouts, for B=128, H=7168, K=8, E=256 and
-- N = 2..64 ranks: from the layouts' formulas (dl.ep.formula) and from the
-- allocator on the meta device (each part charged to its tag ep_<part>;
-- they must be equal, byte for byte: a miss counts as wrong data, exit code
-- 1), beside DeepEP's and NCCL EP's formulas for the same configuration
-- (per_rank above NCCL EP's figure would count as wrong too).
--
--   ./distlab run --device meta experiments/ep/ep_memory.lua [--out DIR]
--       writes DIR/ep-memory.md, ep-memory.csv and ep-memory.png (gnuplot,
--       where it exists); DIR default experiments/results/ep
--   ./distlab run -n N --device cuda experiments/ep/ep_memory.lua [--gpu-experts 16,256]
--       the same count on GPUs (issue 20), N = the world's ranks, every layout,
--       output and dtype at each E: the allocator's tags, ep:bytes() and the
--       formula (the buffer as cuda maps it, whole 2 MiB pages; the outputs
--       in the allocator's blocks), beside the driver's free-memory delta
--       across the buffer's creation (the allocator's cache emptied first);
--       writes DIR/ep-memory-gpu-<gpu>x<N>.md and .csv (rank 0's figures); and where
--       NCCL EP runs (dl.ep.buffer{backend = "nccl_ep"}: an NCCL communicator, the
--       library; docs/ep.md), its buffers' bytes from its own accounting (ep:bytes():
--       handle, what it allocated through its hooks, the rest of the GPU memory its
--       group and handle took) beside ours and its formula below, at each E
--
-- Bytes only: no dispatch or combine runs (ep_bench checks their data), so
-- the run says it checks no data and --plant has nothing to go into.
--
-- The other libraries' formulas, as their sources compute them:
--   DeepEP, csrc/config.hpp LowLatencyLayout (v1, the layout pplx-kernels and
--     Perplexity measured against): dispatch message msg_d = 16 + max(2H,
--     H + 4 H/128), combine message msg_c = 2H; send max(B msg_d, E B msg_c),
--     receive max(E B msg_d, E B msg_c), signals align128(4E), each doubled
--     (odd/even buffers), the sum rounded up as get_low_latency_rdma_size_hint
--     does ((n + 128) / 128 * 128).
--   NCCL EP, the rank-major layout of the seed's pull request (contrib/nccl_ep,
--     LowLatencyLayout): dispatch receive N B msg_d with msg_d = align16(4 + 8K)
--     + 2H (token id, then an expert id and a weight per selection), combine
--     receive K B msg_c with msg_c = 2H + 4 H/128 (the token and its per-128
--     scale metadata), each doubled: 2 (N B msg_d + K B msg_c), the figure the
--     issue quotes (~60 MB at N=8). Its code keeps one receive region of the
--     larger of the two and, beside them, send buffers of E B msg_c, doubled;
--     the quoted figure leaves those out, and so does this column.
local dl = require "distlab"
local bench = dl.bench

local world = dl.comm.world()
local h = bench.harness {
  name = "ep_memory", family = "ep", comm = world, tag = true,
  usage = "./distlab run --device meta|cuda experiments/ep/ep_memory.lua [options]",
  about = "per-rank bytes of both EP layouts, formulas vs the allocator (meta; cuda: and the driver), beside DeepEP and NCCL EP",
  options = {
    { "max-tokens", "int", 128, "B: tokens a rank sends per call at most", meta = "B" },
    { "hidden", "int", 7168, "H", meta = "H" },
    { "experts", "int", 256, "E (meta)", meta = "E" },
    { "gpu-experts", "counts", "16,256", "E on GPUs (those the ranks divide)", meta = "E" },
    { "topk", "int", 8, "K", meta = "K" },
  },
}
local on_gpu = tostring(world.device):match("^cuda") ~= nil
if world.backend ~= "meta" and not on_gpu then
  io.stderr:write("ep_memory: run it on the meta device (it counts bytes, it moves none) or on GPUs (--device cuda)\n")
  os.exit(2)
end
h:unchecked(on_gpu and "counts the EP buffer's bytes: it makes buffers and runs no dispatch or combine " ..
  "(experiments/ep/ep_bench.lua checks those)" or "counts the EP buffer's bytes on meta: nothing runs")
local B, H, E, K = h.opt.max_tokens, h.opt.hidden, h.opt.experts, h.opt.topk
local Ns = {}
for _, N in ipairs { 2, 4, 8, 16, 32, 64 } do if E % N == 0 then Ns[#Ns + 1] = N end end
local MiB = 2 ^ 20

local function align(n, a) return math.ceil(n / a) * a end

local function deepep(N)
  local msg_d = 16 + math.max(2 * H, H + 4 * H / 128)
  local msg_c = 2 * H
  local send = math.max(B * msg_d, E * B * msg_c)
  local recv = math.max(E * B * msg_d, E * B * msg_c)
  local total = 2 * send + 2 * recv + 2 * align(4 * E, 128)
  return math.floor((total + 128) / 128) * 128
end

local function nccl_ep(N)
  local msg_d = align(4 + 8 * K, 16) + 2 * H
  local msg_c = 2 * H + 4 * H / 128
  return 2 * (N * B * msg_d + K * B * msg_c)
end

-- The allocator's charge of a part against the formula: exact, but on GPUs
-- the outputs, tensors in the allocator's 512-byte blocks (at most 4 KiB above).
local function same(part, charged, want)
  if on_gpu and part == "outputs" then return charged >= want and charged < want + 4096 end
  return charged == want
end

-- One buffer of N ranks at E experts: the bytes the allocator charged to each
-- tag while it lived, and the formula's. On meta a world of N ranks (this
-- process rank 0); on GPUs the world itself, with the driver's free memory
-- before and with the buffer (the allocator's cache emptied first) and the
-- cache's growth, and the formula as cuda maps the buffer (whole 2 MiB pages,
-- the rounding counted as signals: core/ops/ep/ep.c).
local function measure(N, layout, output, dtype, experts)
  local o = { max_tokens = B, hidden = H, experts = experts or E, topk = K, layout = layout, output = output,
    dtype = dtype }
  local dev = on_gpu and world.device or "meta"
  local comm = world
  if on_gpu then
    collectgarbage("collect")
    dl.synchronize(dev)
    dl.mem.empty_cache(dev)
    world:barrier()
  else
    comm = dl.comm.meta(N, 0)
  end
  local st0 = dl.mem.stats(dev)
  o.comm = comm
  local ep = dl.ep.buffer(o)
  if on_gpu then dl.synchronize(dev) end
  local st1, got = dl.mem.stats(dev), ep:bytes()
  local before, after = st0.tags, st1.tags
  o.comm, o.ranks = nil, N
  local f = dl.ep.formula(o)
  if on_gpu then
    f.total = math.ceil(f.total / (2 * MiB)) * (2 * MiB)
    f.signals = f.total - f.dispatch_send - f.dispatch_recv - f.combine_send - f.combine_recv
  end
  local row = { N = N, E = o.experts, layout = layout, output = output, dtype = dtype, formula = f, bytes = got,
    charged = {} }
  if on_gpu then row.driver, row.reserved = st0.driver_free - st1.driver_free, st1.reserved - st0.reserved end
  for _, part in ipairs(dl.ep.parts) do
    local tag = "ep_" .. part
    local now = (after[tag] and after[tag].current or 0) - (before[tag] and before[tag].current or 0)
    row.charged[part] = part == "total" and 0 or now
  end
  for _, part in ipairs(dl.ep.parts) do
    if part ~= "total" then row.charged.total = row.charged.total + (part == "outputs" and 0 or row.charged[part]) end
  end
  row.ok = true
  for _, part in ipairs(dl.ep.parts) do
    if got[part] ~= f[part] or not same(part, row.charged[part], f[part]) then row.ok = false end
  end
  ep:free()
  if not on_gpu then comm:free() end
  h:check(function()
    local wrong = 0
    for _, part in ipairs(dl.ep.parts) do
      if got[part] ~= f[part] or not same(part, row.charged[part], f[part]) then
        wrong = wrong + 1
        io.stderr:write(string.format("ep_memory: N=%d E=%d %s %s %s: %s is %d (ep:bytes) / %d (allocator), formula %d\n",
          N, o.experts, layout, output, dtype, part, got[part], row.charged[part], f[part]))
      end
    end
    return wrong
  end)
  return row
end

-- The CSV of rows: keys, then every part as ep:bytes(), the formula and the allocator, then extra columns.
local function write_csv(name, keys, rows, extra)
  local cols = {}
  for _, k in ipairs(keys) do cols[#cols + 1] = k end
  for _, p in ipairs(dl.ep.parts) do cols[#cols + 1] = p end
  for _, p in ipairs(dl.ep.parts) do cols[#cols + 1] = "formula_" .. p end
  for _, p in ipairs(dl.ep.parts) do cols[#cols + 1] = "allocator_" .. p end
  for _, x in ipairs(extra) do cols[#cols + 1] = x[1] end
  local out = {}
  for i, r in ipairs(rows) do
    local line = {}
    for _, k in ipairs(keys) do line[#line + 1] = r[k] end
    for _, p in ipairs(dl.ep.parts) do line[#line + 1] = r.bytes[p] end
    for _, p in ipairs(dl.ep.parts) do line[#line + 1] = r.formula[p] end
    for _, p in ipairs(dl.ep.parts) do line[#line + 1] = r.charged[p] end
    for _, x in ipairs(extra) do line[#line + 1] = x[2](r) end
    out[i] = line
  end
  return h:csv(name, cols, out)
end

if on_gpu then -- the GPU count (issue 20), then done
  local N, rows, Es = world.size, {}, {}
  local function mb(b) return string.format("%.1f", b / MiB) end
  for _, v in ipairs(h.opt.gpu_experts) do
    if v % N == 0 then Es[#Es + 1] = v end
  end
  if #Es == 0 then
    error("ep_memory: no E of --gpu-experts " .. table.concat(h.opt.gpu_experts, ",") .. " is a multiple of " .. N ..
      " ranks", 0)
  end
  for _, e in ipairs(Es) do
    for _, dtype in ipairs { "bf16", "fp8" } do
      for _, layout in ipairs { "per_expert", "per_rank" } do
        for _, output in ipairs { "expert_major", "rank_major" } do
          rows[#rows + 1] = measure(N, layout, output, dtype, e)
        end
      end
    end
  end
  local base = "ep-memory-gpu-" .. h.tag
  local csv = write_csv(base .. ".csv", { "E", "layout", "output", "dtype" }, rows,
    { { "driver_delta", function(r) return r.driver end }, { "reserved_delta", function(r) return r.reserved end } })
  local md = {}
  local function p(fmt, ...) md[#md + 1] = string.format(fmt, ...) end
  p("Per rank, B=%d, H=%d, K=%d, %d ranks: the symmetric buffer (`buffer`: dispatch and combine regions, control", B, H, K, N)
  p("words, rounding and signal pad) and the outputs, as the allocator charged them to their tags while the buffer")
  p("lived, against `ep:bytes()` and `dl.ep.formula` (`allocator = formula`; a miss would fail the run): the regions")
  p("byte for byte, the buffer as the formula's total rounded up to whole 2 MiB pages (what cuda maps), the outputs")
  p("within the allocator's 512-byte blocks (at most 4 KiB above). Beside them, the driver's free-memory delta")
  p("across the buffer's creation (the allocator's cache emptied first), and the allocator's cache growth over the")
  p("same span (the buffer's pages and the outputs' blocks both come through it); the last column is what the")
  p("driver took beyond the buffer and the outputs (the cache's 2 MiB segments). Rank 0's figures.")
  p("")
  p("| E | layout | output | dtype | buffer MiB | outputs MiB | allocator = formula | driver delta MiB | allocator's cache MiB | driver - buffer - outputs MiB |")
  p("|---:|---|---|---|---:|---:|---|---:|---:|---:|")
  for _, r in ipairs(rows) do
    p("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |", r.E, r.layout, r.output, r.dtype, mb(r.bytes.total),
      mb(r.bytes.outputs), r.ok and "yes" or "NO", mb(r.driver), mb(r.reserved),
      mb(r.driver - r.bytes.total - r.bytes.outputs))
  end
  -- NCCL EP's buffers at the same B, H, K, E, where it runs (every rank fails alike)
  local ok, probe = pcall(dl.ep.buffer, { backend = "nccl_ep", comm = world, max_tokens = 1, hidden = 512,
    experts = N, topk = 1 })
  p("")
  if not ok then
    p("NCCL EP's buffers: not measured here (%s).", tostring(probe):gsub("\n", " "))
  else
    probe:free()
    local ours = {}
    for _, r in ipairs(rows) do ours[r.E .. r.layout .. r.output .. r.dtype] = r.bytes.total end
    p("NCCL EP's buffers (`dl.ep.buffer{backend = \"nccl_ep\"}`, nccl-extensions 0.1.0) at the same B, H, K, by its")
    p("own accounting (`ep:bytes()`): `handle` its routing buffers (ncclEpHandleMemSize), `library` what it allocated")
    p("through its allocator hooks (its 32 MiB workspace among them), `window` the rest of what the GPU lost while its")
    p("group and handle were made (its NCCL-registered buffer, NCCL's device communicator); beside ours at the same")
    p("output (per_rank, the layout of its low latency) and the seed's rank-major formula, 2 (N B msg_d + K B msg_c).")
    p("")
    p("| E | algorithm | output | dtype | handle MiB | library MiB | window MiB | total MiB | ours per_rank MiB | formula MiB |")
    p("|---:|---|---|---|---:|---:|---:|---:|---:|---:|")
    local configs = { { "low_latency", "expert_major" }, { "low_latency", "rank_major" },
      { "high_throughput", "expert_major" }, { "high_throughput", "flat" } }
    for _, e in ipairs(Es) do
      for _, dtype in ipairs { "bf16", "fp8" } do
        for _, c in ipairs(configs) do
          local fits = (dtype == "bf16" or c[1] == "low_latency" and H % 512 == 0) and
            (c[1] == "low_latency" and H % 128 == 0 or c[1] == "high_throughput" and e % 4 == 0)
          if fits then
            local b = dl.ep.buffer { backend = "nccl_ep", comm = world, max_tokens = B, hidden = H, experts = e,
              topk = K, algorithm = c[1], output = c[2], dtype = dtype }
            local by = b:bytes()
            b:free()
            local mine = ours[e .. "per_rank" .. (c[2] == "flat" and "rank_major" or c[2]) .. dtype]
            p("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |", e, c[1], c[2], dtype, mb(by.handle), mb(by.library),
              mb(by.window), mb(by.total), mine and mb(mine) or "-", mb(nccl_ep(N)))
          end
        end
      end
    end
  end
  local path = h:markdown(base .. ".md", "Expert-parallel buffer bytes on GPUs: allocator, formula, driver", md,
    { "GPU: " .. dl.build_info() })
  print(table.concat(md, "\n"))
  print("wrote " .. path .. " and " .. csv)
  h:finish()
  return
end

local rows, at = {}, {}
-- the issue's bar: per_rank no larger than NCCL EP's rank-major figure
local function within_nccl_ep(r)
  h:check(function()
    if r.layout ~= "per_rank" or r.bytes.total <= nccl_ep(r.N) then return 0 end
    io.stderr:write(string.format("ep_memory: N=%d per_rank %s: %d bytes, above NCCL EP's %d\n", r.N, r.dtype,
      r.bytes.total, nccl_ep(r.N)))
    return 1
  end)
end
for _, dtype in ipairs { "bf16", "fp8" } do
  for _, N in ipairs(Ns) do
    for _, layout in ipairs { "per_expert", "per_rank" } do
      for _, output in ipairs { "expert_major", "rank_major" } do
        local r = measure(N, layout, output, dtype)
        within_nccl_ep(r)
        rows[#rows + 1] = r
        at[table.concat({ N, layout, output, dtype }, "/")] = r
      end
    end
  end
end

-- ---- CSV ---------------------------------------------------------------------------------

local csv = write_csv("ep-memory.csv", { "N", "layout", "output", "dtype" }, rows,
  { { "deepep_ll", function(r) return deepep(r.N) end }, { "nccl_ep_rank_major", function(r) return nccl_ep(r.N) end } })

-- ---- the report ------------------------------------------------------------------------

local md = {}
local function p(fmt, ...) md[#md + 1] = string.format(fmt, ...) end
local function get(N, layout, dtype, output) return at[table.concat({ N, layout, output or "expert_major", dtype or "bf16" }, "/")] end
local function mib(b) return string.format("%.1f", b / MiB) end

p("Symmetric buffer bytes per rank of distlab's expert-parallel dispatch/combine (`distlab.ep`), B=%d, H=%d,", B, H)
p("K=%d, E=%d, bf16 payloads, counted on the meta device: every part is charged to its allocator tag", K, E)
p("(`ep_dispatch_recv`, ...) exactly as the buffer lays it out on a GPU, and each equals `dl.ep.formula`")
p("(the layout of `kernels/ep/ep.h`) byte for byte, in every row of `ep-memory.csv` (both outputs, bf16")
p("and fp8; a miss would fail the run). per_expert: a message per (token, k), dispatch slots [L][N][B]")
p("and combine slots [E][B]; per_rank: one message per (token, destination rank), its header carrying")
p("the token index and its expert ids and weights for that rank, slots [N][B] and [K][B] (the seed's")
p("\"after\"). Both write straight into the receiver's slots (no send buffers) and keep one set of")
p("slots (a handshake instead of odd/even buffers), but for per_rank with rank_major output up to")
p("N B = 256 rows received (here N = 2): two halves, odd and even calls, of Lamport slots (no flag: the")
p("receiver polls the rows, empties them, and the half is written again two calls later; `kernels/ep/ep.h`),")
p("[2][K][B] for the combine and, with bf16 payloads, [2][N][B] and N count words for the dispatch. Headers")
p("and messages are padded to 128-byte lines (payloads start a line). The")
p("table's rows are expert_major, `ep-memory.csv` has both. DeepEP's and NCCL EP's columns are their formulas")
p("(sources and terms in the header of `experiments/ep/ep_memory.lua`).")
p("")
p("| N | per_expert MiB | per_rank MiB | per_expert / per_rank | allocator = formula | DeepEP LL MiB | NCCL EP rank-major MiB | per_rank / NCCL EP |")
p("|---:|---:|---:|---:|---|---:|---:|---:|")
local worst_ratio, worst_n = math.huge, nil
for _, N in ipairs(Ns) do
  local pe, pr = get(N, "per_expert"), get(N, "per_rank")
  local ratio = pe.bytes.total / pr.bytes.total
  if ratio < worst_ratio then worst_ratio, worst_n = ratio, N end
  local equal = pe.charged.total == pe.formula.total and pr.charged.total == pr.formula.total
  p("| %d | %s | %s | %.1fx | %s | %s | %s | %.2f |", N, mib(pe.bytes.total), mib(pr.bytes.total), ratio,
    equal and "yes" or "NO", mib(deepep(N)), mib(nccl_ep(N)), pr.bytes.total / nccl_ep(N))
end

local e8 = get(8, "per_rank")
p("")
p("At N=8 (one node of 8 GPUs): per_rank %.1f MiB (%.1f MB) against per_expert %.1f MiB, DeepEP's %.2f GB and NCCL EP's",
  e8.bytes.total / MiB, e8.bytes.total / 1e6, get(8, "per_expert").bytes.total / MiB, deepep(8) / 1e9)
p("%.1f MB (the issue's ~1.9 GB and ~60 MB). per_rank stays below NCCL EP's rank-major figure at every N:", nccl_ep(8) / 1e6)
p("the same messages (header align16(4 + 8K), the token), one set of receive slots instead of two and no")
p("per-128 metadata in the combine messages. Against per_expert it is %.1fx smaller at N=%d and more at", worst_ratio, worst_n)
p("fewer ranks: with equal policies the ratio is (E B (msg_d + msg_c)) / (N B msg_d + K B msg_c), about")
p("2E / (N + K) = %.1f at N=64, so the 10x of the issue holds up to N=32 and cannot at N=64 with E=256 (the",
  2 * E / (64 + K))
p("[N][B] dispatch slots alone are E/N = 4 times fewer than [L][N][B] there); against DeepEP's buffer, which")
p("also keeps send buffers and doubles everything, per_rank is %.0fx smaller at N=64.",
  deepep(64) / get(64, "per_rank").bytes.total)

p("\n### By part at N=8 and N=64 (MiB; send parts are 0: messages go straight into the peers' slots)\n")
p("| N | layout | dispatch recv | combine recv | signals | total | message bytes (dispatch / combine) |")
p("|---:|---|---:|---:|---:|---:|---|")
for _, N in ipairs { 8, 64 } do
  for _, layout in ipairs { "per_expert", "per_rank" } do
    local r = get(N, layout)
    if r then
      p("| %d | %s | %s | %s | %.3f | %s | %d / %d |", N, layout, mib(r.bytes.dispatch_recv), mib(r.bytes.combine_recv),
        r.bytes.signals / MiB, mib(r.bytes.total), r.formula.msg_dispatch, r.formula.msg_combine)
    end
  end
end

p("\n### fp8 dispatch (e4m3 codes + an fp32 scale per 128 values), MiB per rank\n")
p("| N | per_expert | per_rank | ratio |")
p("|---:|---:|---:|---:|")
for _, N in ipairs(Ns) do
  local pe, pr = get(N, "per_expert", "fp8"), get(N, "per_rank", "fp8")
  p("| %d | %s | %s | %.1fx |", N, mib(pe.bytes.total), mib(pr.bytes.total), pe.bytes.total / pr.bytes.total)
end

p("\n### The outputs the expert GEMMs read (not symmetric; tag `ep_outputs`), MiB per rank, bf16\n")
p("Whatever the layout: expert_major x [L, N*B, H] (as DeepEP's packed_recv_x: E B H elements), or")
p("rank_major x [N, B, H] with expert ids and weights [N, B, K]; plus the routing kept for combine")
p("and a [B, H] combine output.\n")
p("| N | expert_major | rank_major |")
p("|---:|---:|---:|")
for _, N in ipairs(Ns) do
  p("| %d | %s | %s |", N, mib(get(N, "per_rank", "bf16", "expert_major").bytes.outputs),
    mib(get(N, "per_rank", "bf16", "rank_major").bytes.outputs))
end

-- the plot: total MiB per rank against N
local dat = os.tmpname()
local f = assert(io.open(dat, "w"))
for _, N in ipairs(Ns) do
  f:write(string.format("%d %.6f %.6f %.6f %.6f\n", N, get(N, "per_expert").bytes.total / MiB,
    get(N, "per_rank").bytes.total / MiB, deepep(N) / MiB, nccl_ep(N) / MiB))
end
f:close()
local png = h:path("ep-memory.png")
local drawn, note = bench.plot.gnuplot(string.format([[
set terminal pngcairo size 900,560 font ",11" noenhanced
set output '%s'
set title "EP buffer per rank: B=%d, H=%d, K=%d, E=%d, bf16 (meta; allocator = formulas)"
set logscale xy 2
set xtics (2, 4, 8, 16, 32, 64)
set xrange [1.8:72]
set xlabel "ranks N"
set ylabel "MiB per rank"
set key bottom right
set grid
plot '%s' using 1:2 with linespoints lw 2 title 'distlab per_expert', \
     '%s' using 1:3 with linespoints lw 2 title 'distlab per_rank', \
     '%s' using 1:4 with lines dt 2 lw 2 title 'DeepEP LL (config.hpp)', \
     '%s' using 1:5 with lines dt 2 lw 2 title 'NCCL EP rank-major (2 x receive regions)'
]], png, B, H, K, E, dat, dat, dat, dat), png)
os.remove(dat)
if drawn then p("\n![bytes per rank against N](ep-memory.png)") end

local path = h:markdown("ep-memory.md", "Expert-parallel dispatch/combine: buffer bytes per rank", md,
  { "meta device: " .. dl.build_info() })
print(table.concat(md, "\n"))
if note then print(note) end
print("wrote " .. path .. ", " .. csv .. (drawn and ", " .. png or ""))
h:finish()
