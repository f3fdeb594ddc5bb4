-- experiments/block/configs.lua — the block's shapes and its schedule options
-- (experiments/block/block.lua runs them; spec/block_spec.lua iterates them).
--
-- Shapes. tokens is per rank (T: the rows of the block on one rank); the
-- sequence is T x ranks tokens, cut for context parallelism and then for
-- tensor parallelism's sequence split. dsv3 is DeepSeek-V3's MoE layer
-- (hidden 7168, 256 routed experts, top-8, expert FFN 2048, one shared
-- expert of FFN 2048) with multi-head attention of 128 heads of 128 in
-- place of MLA; M.shape(name, scale) scales hidden, heads, experts and both
-- FFNs by `scale` (top-k and head dim stay) to fit the GPUs at hand.
local M = {}

M.shapes = {
  tiny = { hidden = 32, heads = 8, head_dim = 16, experts = 8, topk = 2, ffn = 16, shared_ffn = 32, tokens = 16 },
  check = { hidden = 128, heads = 8, head_dim = 64, experts = 16, topk = 4, ffn = 64, shared_ffn = 128, tokens = 64 },
  small = { hidden = 256, heads = 8, head_dim = 64, experts = 16, topk = 4, ffn = 128, shared_ffn = 256, tokens = 128 },
  dsv3 = { hidden = 7168, heads = 128, head_dim = 128, experts = 256, topk = 8, ffn = 2048, shared_ffn = 2048,
    tokens = 4096 },
}

-- n rounded to a multiple of m (at least m)
local function multiple(n, m) return math.max(m, math.floor(n / m + 0.5) * m) end

-- A shape by name, scaled, with the divisibility the ranks need: heads by tp
-- (and by cp x tp for a2a), experts by the ranks, widths by 64.
function M.shape(name, scale, ranks, tp)
  local base = M.shapes[name]
  if not base then
    local names = {}
    for k in pairs(M.shapes) do names[#names + 1] = k end
    table.sort(names)
    error(string.format("unknown shape %q (%s)", tostring(name), table.concat(names, ", ")), 0)
  end
  local s = {}
  for k, v in pairs(base) do s[k] = v end
  scale = scale or 1
  if scale ~= 1 then
    s.hidden = multiple(base.hidden * scale, 64)
    s.heads = multiple(base.heads * scale, 2 * ranks)
    s.experts = multiple(base.experts * scale, ranks)
    s.ffn = multiple(base.ffn * scale, 64)
    s.shared_ffn = multiple(base.shared_ffn * scale, 64)
  end
  s.topk = math.min(s.topk, s.experts)
  s.name = scale == 1 and name or string.format("%s x%g", name, scale)
  return s
end

-- ---- schedule options -----------------------------------------------------------------

-- What each option swaps (block.lua's --help prints this):
M.doc = {
  cp = "context-parallel attention: p2p (ring), all_gather, a2a (Ulysses)",
  correction = "p2p: how the ring's partial outputs merge: fused, incremental, post_loop",
  comm_buffers = "p2p: K/V receive buffers: 2 (double buffering) or per_step",
  cp_overlap = "all_gather: attend to local K/V under the gathers (bshd); a2a: two head groups pipelined",
  ag = "QKV projection (and the output projection's input gradient): all-gather + GEMM over TP: "
    .. "p2p, ring, nccl_then_gemm",
  rs = "output projection (and the QKV input gradient): GEMM + reduce-scatter over TP: p2p, ring, gemm_then_nccl",
  transport = "p2p/ring transfers: get (the receiver pulls) or put (the sender pushes)",
  copy = "p2p/ring copies: ce (copy engine) or sm (a copy kernel)",
  ep = "EP buffer layout: per_rank (top-k ids in the message) or per_expert (a slot per expert and source)",
  ep_backend = "EP: ours or nccl_ep (NCCL EP, where its library is there)",
  overlap = "second stream: shared expert beside dispatch/experts/combine, expert and projection weight "
    .. "gradients and gradient all-reduces beside the input-gradient chain",
}

M.default = { cp = "p2p", correction = "fused", comm_buffers = 2, cp_overlap = false, ag = "p2p", rs = "p2p",
  transport = "get", copy = "ce", ep = "per_rank", ep_backend = "ours", overlap = true }

-- The option table: every axis and its values, one change from the default
-- at a time (a value may change more than one option, or need bshd).
M.axes = {
  { "cp", { { cp = "all_gather" }, { cp = "all_gather", cp_overlap = true, layout = "bshd" }, { cp = "a2a" },
    { cp = "a2a", cp_overlap = true } } },
  { "correction", { { correction = "incremental" }, { correction = "post_loop" } } },
  { "comm_buffers", { { comm_buffers = "per_step" } } },
  { "ag", { { ag = "ring" }, { ag = "nccl_then_gemm" } } },
  { "rs", { { rs = "ring" }, { rs = "gemm_then_nccl" } } },
  { "transport", { { transport = "put" } } },
  { "copy", { { copy = "sm" } } },
  { "ep", { { ep = "per_expert" } } },
  { "overlap", { { overlap = false } } },
}

-- The schedules a GPU run compares, each a set of changes from the default.
M.named = {
  serial = { ag = "nccl_then_gemm", rs = "gemm_then_nccl", cp = "p2p", correction = "post_loop",
    comm_buffers = "per_step", ep = "per_expert", overlap = false },
  overlap = {},
  ring = { ag = "ring", rs = "ring", transport = "put", cp = "all_gather", cp_overlap = true, layout = "bshd" },
  ulysses = { cp = "a2a", cp_overlap = true },
}
M.named_order = { "serial", "overlap", "ring", "ulysses" }

-- "cp=a2a,cp_overlap=true" (sorted keys), or "default"
function M.label(changes)
  local keys = {}
  for k in pairs(changes) do keys[#keys + 1] = k end
  table.sort(keys)
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = k .. "=" .. tostring(changes[k]) end
  return #parts > 0 and table.concat(parts, ",") or "default"
end

-- The schedule: the default with changes applied.
function M.schedule(changes)
  local s = {}
  for k, v in pairs(M.default) do s[k] = v end
  for k, v in pairs(changes or {}) do s[k] = v end
  return s
end

-- Variants by name: "default", "axes" (the default, then every entry of
-- M.axes), a named schedule ("serial", ...), "named" (all of them), or a
-- list of those joined by "+".
function M.variants(which)
  local out = {}
  for part in tostring(which):gmatch("[^+]+") do
    if part == "default" then
      out[#out + 1] = { name = "default", changes = {} }
    elseif part == "axes" then
      out[#out + 1] = { name = "default", changes = {} }
      for _, ax in ipairs(M.axes) do
        for _, ch in ipairs(ax[2]) do out[#out + 1] = { name = M.label(ch), changes = ch } end
      end
    elseif part == "named" then
      for _, n in ipairs(M.named_order) do out[#out + 1] = { name = n, changes = M.named[n] } end
    elseif M.named[part] then
      out[#out + 1] = { name = part, changes = M.named[part] }
    else
      error(string.format("unknown variants %q (default, axes, named, %s)", part, table.concat(M.named_order, ", ")), 0)
    end
  end
  return out
end

return M
