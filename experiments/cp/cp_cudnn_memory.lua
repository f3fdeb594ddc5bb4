-- experiments/cp/cp_cudnn_memory.lua — cuDNN's workspace in the CP schedules:
-- the peak of the memory tag "cudnn_workspace" (everything dl.attn's cudnn
-- backend takes: cuDNN's own workspace and the temporaries around it),
-- forward and backward, per rank, in MiB and units (one per-rank Q), for the
-- strategies that run on cuDNN (p2p main and double+incremental, all_gather,
-- a2a) with backend = "cudnn", causal, bshd and thd (two sequences of S).
--   ./distlab run -n 2 --device cuda experiments/cp/cp_cudnn_memory.lua [--s S]
--       measured on the GPU(s) (ranks may share one: the tags count per rank)
--   ./distlab run --device meta --world 2 --rank 0 experiments/cp/cp_cudnn_memory.lua
--       the same schedules on meta, where the workspace is counted by the
--       formula of core/ops/attn/attn_cudnn.c
-- Prints one line per (layout, strategy): `cudnn_ws <device> ...`, which
-- scripts/gpu/cudnn.sh puts beside each other.
local dl = require "distlab"
local presets = require "distlab.cp.presets"

local world = dl.comm.world()
local S = tonumber(arg and arg[1]) or 16384
local B, H, D = 2, 16, 128
local names = { main = true, ["double+incremental"] = true, all_gather = true, a2a = true }
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
      local m = dl.cp.attention(o):memory(shape, shape, shape, { seq = seq })
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
local i = dl.attn.cudnn_info()
if world.rank == 0 and i.version > 0 then
  print(string.format("cudnn %d from %s; %d plans built in %.0f ms", i.version, i.path, i.builds, i.build_ms))
end
