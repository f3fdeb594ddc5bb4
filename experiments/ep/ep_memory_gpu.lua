-- experiments/ep/ep_memory_gpu.lua — the expert-parallel buffer's bytes on
-- GPUs (issue 20): for every layout, output and dtype at B, H, K and each E
-- (N ranks, one a GPU or sharing), what the allocator charged to each tag
-- ep_<part> while the buffer lived, ep:bytes(), and the formula
-- (dl.ep.formula), which must all be equal (a miss counts as wrong data,
-- exit code 1), beside the driver's free-memory delta: the device's free
-- memory before the buffer and with it, the allocator's cache emptied first.
-- That delta holds the symmetric buffer's physical pages (the driver's
-- granularity) and the outputs' blocks as the allocator rounds them.
--
--   ./distlab run -n N --device cuda experiments/ep/ep_memory_gpu.lua [--out DIR]
--       writes DIR/ep-memory-gpu-<gpu>x<N>.md and .csv (default
--       experiments/results/ep); rank 0's figures (every rank's buffer is the same)
local dl = require "distlab"
local bench = dl.bench

local world = dl.comm.world()
local h = bench.harness {
  name = "ep_memory_gpu", family = "ep", comm = world, tag = true,
  usage = "./distlab run -n N --device cuda experiments/ep/ep_memory_gpu.lua [options]",
  about = "EP buffer bytes on GPUs: allocator tags, ep:bytes() and formulas, beside the driver's free-memory delta",
  options = {
    { "max-tokens", "int", 128, "B: tokens a rank sends per call at most", meta = "B" },
    { "hidden", "int", 7168, "H", meta = "H" },
    { "experts", "string", "16,256", "E (those N divides)", meta = "E" },
    { "topk", "int", 8, "K", meta = "K" },
  },
}
if world.backend == "meta" or world.device == "cpu" then
  io.stderr:write("ep_memory_gpu: run it on GPUs (--device cuda); ep_memory.lua counts the bytes on meta\n")
  os.exit(2)
end
local B, H, K, N = h.opt.max_tokens, h.opt.hidden, h.opt.topk, world.size
local Es = {}
for e in tostring(h.opt.experts):gmatch("%d+") do
  if tonumber(e) % N == 0 then Es[#Es + 1] = tonumber(e) end
end
local MiB = 2 ^ 20
local PAGE = 2 * MiB -- what the symmetric buffer maps on cuda: whole pages
local function mib(b) return b and string.format("%.1f", b / MiB) or "-" end
-- the allocator's charge against the formula: the outputs are tensors, each in
-- the allocator's blocks (512 bytes), so up to a few KiB above; the rest exact
local function same(part, charged, want)
  if part == "outputs" then return charged >= want and charged < want + 4096 end
  return charged == want
end

-- One buffer: the allocator's tags, ep:bytes(), the formula and the driver's delta.
local function measure(E, layout, output, dtype)
  local o = { comm = world, max_tokens = B, hidden = H, experts = E, topk = K, layout = layout, output = output,
    dtype = dtype }
  collectgarbage("collect")
  dl.synchronize(world.device)
  dl.mem.empty_cache(world.device)
  world:barrier()
  local st0 = dl.mem.stats(world.device)
  local ep = dl.ep.buffer(o)
  dl.synchronize(world.device)
  local st1 = dl.mem.stats(world.device)
  local got = ep:bytes()
  o.comm, o.ranks = nil, N
  -- the layout's formula (meta's figures), with cuda's rounding: the symmetric
  -- buffer maps whole 2 MiB pages (the rounding counts as signals, ep.c)
  local f = dl.ep.formula(o)
  if tostring(world.device):match("^cuda") then f.total = math.ceil(f.total / PAGE) * PAGE end
  f.signals = f.total - f.dispatch_send - f.dispatch_recv - f.combine_send - f.combine_recv
  local row = { E = E, layout = layout, output = output, dtype = dtype, bytes = got, formula = f, charged = {},
    driver = st0.driver_free - st1.driver_free, reserved = st1.reserved - st0.reserved }
  local total = 0
  for _, part in ipairs(dl.ep.parts) do
    if part ~= "total" then
      local tag = "ep_" .. part
      local now = (st1.tags[tag] and st1.tags[tag].current or 0) - (st0.tags[tag] and st0.tags[tag].current or 0)
      row.charged[part] = now
      if part ~= "outputs" then total = total + now end
    end
  end
  row.charged.total = total
  ep:free()
  h:check(function()
    local wrong = 0
    for _, part in ipairs(dl.ep.parts) do
      if got[part] ~= f[part] or not same(part, row.charged[part], f[part]) then
        wrong = wrong + 1
        io.stderr:write(string.format("ep_memory_gpu: E=%d %s %s %s: %s is %d (ep:bytes) / %d (allocator), formula %d\n",
          E, layout, output, dtype, part, got[part], row.charged[part], f[part]))
      end
    end
    return wrong
  end)
  return row
end

local rows = {}
for _, E in ipairs(Es) do
  for _, dtype in ipairs { "bf16", "fp8" } do
    for _, layout in ipairs { "per_expert", "per_rank" } do
      for _, output in ipairs { "expert_major", "rank_major" } do
        rows[#rows + 1] = measure(E, layout, output, dtype)
      end
    end
  end
end

local gpu = h.tag
local cols = { "E", "layout", "output", "dtype" }
for _, p in ipairs(dl.ep.parts) do cols[#cols + 1] = p end
for _, p in ipairs(dl.ep.parts) do cols[#cols + 1] = "formula_" .. p end
for _, p in ipairs(dl.ep.parts) do cols[#cols + 1] = "allocator_" .. p end
cols[#cols + 1] = "driver_delta"
cols[#cols + 1] = "reserved_delta"
local out = {}
for i, r in ipairs(rows) do
  local line = { r.E, r.layout, r.output, r.dtype }
  for _, p in ipairs(dl.ep.parts) do line[#line + 1] = r.bytes[p] end
  for _, p in ipairs(dl.ep.parts) do line[#line + 1] = r.formula[p] end
  for _, p in ipairs(dl.ep.parts) do line[#line + 1] = r.charged[p] end
  line[#line + 1] = r.driver
  line[#line + 1] = r.reserved
  out[i] = line
end
local csv = h:csv("ep-memory-gpu-" .. gpu .. ".csv", cols, out)

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
  local ok = true
  for _, part in ipairs(dl.ep.parts) do
    if r.bytes[part] ~= r.formula[part] or not same(part, r.charged[part], r.formula[part]) then ok = false end
  end
  p("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |", r.E, r.layout, r.output, r.dtype, mib(r.bytes.total),
    mib(r.bytes.outputs), ok and "yes" or "NO", mib(r.driver), mib(r.reserved), mib(r.driver - r.bytes.total - r.bytes.outputs))
end
local path = h:markdown("ep-memory-gpu-" .. gpu .. ".md", "Expert-parallel buffer bytes on GPUs: allocator, formula, driver",
  md, { "GPU: " .. dl.build_info() })
print(table.concat(md, "\n"))
print("wrote " .. path .. " and " .. csv)
h:finish()
