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
local M = {}

M.list = {
  { name = "main", algo = "p2p", comm_buffers = "per_step", correction = "post_loop" },
  { name = "double", algo = "p2p", comm_buffers = 2, correction = "post_loop" },
  { name = "double+incremental", algo = "p2p", comm_buffers = 2, correction = "incremental" },
  { name = "fused", algo = "p2p", comm_buffers = 2, correction = "fused" },
  { name = "fused, dkv local", algo = "p2p", comm_buffers = 2, correction = "fused", dkv = "local" },
  { name = "all_gather", algo = "all_gather" },
  { name = "all_gather, overlap", algo = "all_gather", overlap = true, layouts = { bshd = true, sbhd = true } },
  { name = "a2a", algo = "a2a" },
  { name = "a2a, overlap", algo = "a2a", overlap = true },
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
