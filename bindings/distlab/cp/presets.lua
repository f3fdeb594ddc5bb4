-- distlab.cp.presets — the named context-parallel strategies the benchmarks
-- report and the specs cover, defined once (experiments/cp/cp_bench.lua,
-- experiments/cp/cp_memory.lua and spec/cp_spec.lua read them).
--
--   main                 p2p ring, a K/V buffer per step, per-step outputs merged
--                        after the loop (TransformerEngine's main)
--   double               2 K/V buffers, post-loop merge
--   double+incremental   2 buffers, online-softmax merge per step (seed 000's PR)
--   fused                2 buffers, the merge in the attention kernel's epilogue
--   fused, dkv local     fused; in the backward each step computes its dK/dV share
--                        into a local buffer while the travelling dK/dV arrive
--                        (TE's main: one buffer more, the transfer hidden)
--   all_gather           gather K/V, then attend
--   all_gather, overlap  attend to the local K/V while the gathers run (bshd, sbhd)
--   a2a                  all-to-all (Ulysses)
--   a2a, overlap         two head groups in a pipeline
--
--   presets.list                 the strategies in this order: {name =, algo =, ...}
--   presets.get(name)            one of them (an error naming the known ones otherwise)
--   presets.options(st)          its dl.cp.attention options (algo, comm_buffers,
--                                correction, dkv, overlap), without name and layouts
--   presets.applies(st, layout)  false where the strategy does not take the layout
-- Each strategy's `units`: its forward peak above the inputs, in units of one
-- per-rank Q (MHA, C >= 3; l = one per-rank LSE), as its schedule file
-- states it (the files give exact bytes; cp_memory checks them on meta).
local M = {}

M.list = {
  { name = "main", algo = "p2p", comm_buffers = "per_step", correction = "post_loop", units = "3C + C l" },
  { name = "double", algo = "p2p", comm_buffers = 2, correction = "post_loop", units = "4 + C (1 + l)" },
  { name = "double+incremental", algo = "p2p", comm_buffers = 2, correction = "incremental", units = "7 + 3 l" },
  { name = "fused", algo = "p2p", comm_buffers = 2, correction = "fused", units = "5 + l" },
  { name = "fused, dkv local", algo = "p2p", comm_buffers = 2, correction = "fused", dkv = "local", units = "5 + l" },
  { name = "all_gather", algo = "all_gather", units = "3C" },
  { name = "all_gather, overlap", algo = "all_gather", overlap = true, layouts = { bshd = true, sbhd = true },
    units = "3C + 1 + l" },
  { name = "a2a", algo = "a2a", units = "6 + l" },
  { name = "a2a, overlap", algo = "a2a", overlap = true, units = "6 + 2 l" },
}

local OPTION_KEYS = { "algo", "comm_buffers", "correction", "dkv", "overlap" }

function M.get(name)
  for _, st in ipairs(M.list) do
    if st.name == name then return st end
  end
  local names = {}
  for i, st in ipairs(M.list) do names[i] = st.name end
  error(string.format("cp.presets: no strategy named %s (known: %s)", tostring(name), table.concat(names, "; ")), 2)
end

function M.options(st)
  local o = {}
  for _, k in ipairs(OPTION_KEYS) do o[k] = st[k] end
  return o
end

function M.applies(st, layout) return st.layouts == nil or st.layouts[layout] == true end

return M
