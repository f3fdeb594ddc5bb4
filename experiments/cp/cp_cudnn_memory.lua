-- experiments/cp/cp_cudnn_memory.lua — cuDNN's workspace in the CP schedules:
-- the peak of the memory tag "cudnn_workspace" (everything dl.attn's cudnn
-- backend takes: cuDNN's own workspace and the temporaries around it),
-- forward and backward, per rank, in MiB and units (one per-rank Q), for the
-- strategies that run on cuDNN (p2p main and double+incremental, all_gather,
-- a2a) with backend = "cudnn", causal, bshd and thd (two sequences of S).
--   ./distlab run -n 2 --device cuda experiments/cp/cp_cudnn_memory.lua [S] [--s S]
--       measured on the GPU(s) (ranks may share one: the tags count per rank);
--       then every schedule measured runs once more (planted: --plant noop |
--       scale=X), its forward+backward on fresh inputs checked against fp64
--       single-rank attention at sampled rows (distlab.bench.cp_check:
--       --check-elements / D query rows for out, lse, dq, a quarter as many key
--       rows for dk, dv; TE's bf16 tolerance element-wise, normwise 8e-3, bias
--       2^-10); a wrong element makes the exit code 1
--   ./distlab run --device meta --world 2 --rank 0 experiments/cp/cp_cudnn_memory.lua
--       the same schedules on meta, where the workspace is counted by the
--       formula of core/ops/attn/attn_cudnn.c (nothing runs: no data checked)
-- On cpu (no cuDNN) it says so and checks nothing. --quick: S = 256.
-- Prints one line per (layout, strategy): `cudnn_ws <device> ...`, which
-- scripts/gpu/cudnn.sh puts beside each other.
local dl = require "distlab"
local presets = require "distlab.cp.presets"
local cpc = require "distlab.bench.cp_check"

local world = dl.comm.world()
local argv, S_arg = {}, nil
for i, a in ipairs(arg or {}) do
  if i == 1 and tonumber(a) then S_arg = tonumber(a) else argv[#argv + 1] = a end
end
local h = dl.bench.harness {
  name = "cp_cudnn_memory", family = "cp", comm = world, writes = false, argv = argv,
  usage = "./distlab run -n 2 --device cuda experiments/cp/cp_cudnn_memory.lua [S] [options]",
  about = "cuDNN's workspace in the CP schedules, forward and backward, per rank; see the file's header",
  options = {
    { "s", "size", 16384, "sequence length S per sequence (or the first argument)", meta = "S" },
    { "check-elements", "int", 100000, "(cuda) output elements of out (and of dq) the fp64 check covers per " ..
      "layout (query rows: this / D; key rows for dk, dv: a quarter as many)", meta = "N" },
  },
}
local on_meta, on_cuda = world.backend == "meta", tostring(world.device):match("^cuda") ~= nil
if not on_meta and not on_cuda then
  h:unchecked("cuDNN runs on cuda only: nothing measured or run here (meta counts the workspace by its formula)")
  h:finish()
  return
end
if on_meta then h:unchecked("counts cuDNN's workspace on meta by its formula: nothing runs") end
local S = S_arg or ((h.quick and not h.given.s) and 256 or h.opt.s)
local B, H, D = 2, 16, 128
local names = { main = true, ["double+incremental"] = true, all_gather = true, a2a = true }
local ran = {} -- the schedules measured on cuda, checked after
for _, layout in ipairs({ "bshd", "thd" }) do
  for _, st in ipairs(presets.list) do
    if names[st.name] then
      local C = world.size
      local shape, seq = { B, S / C, H, D }, nil
      if layout == "thd" then
        shape = { B * S / C, H, D }
        seq = { cu_seqlens_q = { 0, S, 2 * S }, cu_seqlens_q_padded = { 0, S, 2 * S } }
      end
      local o = presets.options(st)
      o.comm, o.layout, o.mask, o.backend = world, layout, "causal", "cudnn"
      local cp = dl.cp.attention(o)
      local m = cp:memory(shape, shape, shape, { seq = seq })
      ran[#ran + 1] = { cp = cp, layout = layout, name = st.name }
      local ws = {}
      for _, pass in ipairs({ "fwd", "bwd" }) do
        ws[pass] = 0
        for _, r in ipairs(m[pass].rows) do
          if r.tag == "cudnn_workspace" then ws[pass] = r.peak end
        end
      end
      local unit = m.fwd.unit
      if world.rank == 0 then
        print(string.format("cudnn_ws %-4s C=%d %-4s %-19s fwd %8.2f MiB %6.3f units  bwd %8.2f MiB %6.3f units  (unit %.0f MiB)",
          world.device:match("^%a+"), C, layout, st.name, ws.fwd / 1048576, ws.fwd / unit, ws.bwd / 1048576,
          ws.bwd / unit, unit / 1048576))
      end
    end
  end
end
if on_cuda then
  -- Data: every schedule measured, once more on fresh inputs (one set per layout)
  local c
  for i, r in ipairs(ran) do
    if not c or c.x.layout ~= r.layout then -- layout by layout: one set of inputs at a time
      c = nil
      collectgarbage("collect")
      c = cpc.new { inputs = cpc.inputs { layout = r.layout, B = B, S = S, H = H, D = D, seed = 900 + i }, comm = world,
        elements = h.opt.check_elements, seed = i }
    end
    local wrong, rel = c:verify(h, string.format("cudnn %s %s C=%d", r.layout, r.name, world.size), r.cp, world)
    h:print("cudnn_check %-4s %-19s %s (normwise error at most %.1e)", r.layout, r.name,
      wrong == 0 and "ok" or wrong .. " wrong", rel)
  end
end
local i = dl.attn.cudnn_info()
if world.rank == 0 and i.version > 0 then
  print(string.format("cudnn %d from %s; %d plans built in %.0f ms", i.version, i.path, i.builds, i.build_ms))
end
h:finish()
