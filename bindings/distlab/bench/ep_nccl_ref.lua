-- distlab.bench.ep_nccl_ref — nccl_ep's outputs (distlab.ep_nccl) in the shape of
-- ours, so that distlab.bench.ep_ref checks them against the routing as it checks
-- ours, and the experts' outputs y in nccl_ep's shape. ep_bench and the equivalence
-- specs (spec/ep/nccl_equiv.lua) use it.
--
--   o = ep_ref's {N, me, E, B, H, K, output, dtype} plus algorithm = "low_latency" |
--       "high_throughput" (output: nccl_ep's, "expert_major" | "rank_major" | "flat")
--   ref.ours_output(o) -> the output of ours whose checks apply: high_throughput's
--       expert_major -> expert_major, flat -> rank_major (a row per token and rank)
--   ref.as_ours(o, recv, all) -> recv on the host as ours has it: low latency's as it
--       is, but rank_major's weights 0 where the expert id is -1 (nccl_ep keeps the
--       token's weight there); high throughput's expert_major rows from offsets[e]
--       into x [L, N*B, H]; flat's rows, each found among the tokens of `all` (ep_ref's
--       inputs of every source) that picked an expert here, into x [N, B, H] by source
--       (a row that is no such token is left out: the counts then disagree)
--   ref.expert_outputs(o, recv) -> cpu bf16 y shaped like recv.x: expert e's rows
--       times coef(e) (ep_ref's); where nccl_ep leaves the weighting to the caller
--       (high throughput), each row weighted first (expert_major: by its weight; flat:
--       over its selections here), then rounded once
local ffi = require "ffi"
local tensor = require "distlab.tensor"
local ep_ref = require "distlab.bench.ep_ref"

local T = tensor.methods
local M = {}

local function host(t) return t and T.to(T.contiguous(t), "cpu") end
local function ptr(t, ct) return ffi.cast(ct, T.data_ptr(t)) end
local function empty(shape, dtype) return tensor.empty(shape, { dtype = dtype, device = "cpu" }) end

function M.ours_output(o)
  if o.algorithm == "high_throughput" and o.output == "flat" then return "rank_major" end
  return o.output
end

-- low latency rank_major: weights of selections elsewhere to 0
local function zero_elsewhere(recv)
  local ids, w = host(recv.expert_ids), T.clone(host(recv.weights))
  local pid, pw = ptr(ids, "int32_t*"), ptr(w, "float*")
  for i = 0, T.numel(ids) - 1 do
    if pid[i] < 0 then pw[i] = 0 end
  end
  return { x = recv.x, scales = recv.scales, counts = recv.counts, expert_ids = ids, weights = w }
end

-- high throughput expert_major: expert e's counts[e] rows from row offsets[e]
local function unpack_experts(o, recv)
  local NB, H, L = o.N * o.B, o.H, o.E / o.N
  local x, counts, offs = host(recv.x), host(recv.counts), host(recv.offsets)
  local pc, po = ptr(counts, "int32_t*"), ptr(offs, "int32_t*")
  local x3 = T.fill_(empty({ L, NB, H }, "bf16"), 0)
  local px, p3 = ptr(x, "uint16_t*"), ptr(x3, "uint16_t*")
  local S = T.size(x, 1)
  for le = 0, L - 1 do
    local n = math.max(0, math.min(pc[le], NB, S - po[le]))
    if n > 0 then ffi.copy(p3 + le * NB * H, px + po[le] * H, 2 * n * H) end
  end
  return { x = x3, counts = counts }
end

-- high throughput flat: each row's source and token, from the bytes of the tokens routed here; its
-- selections here are packed first in a row (NCCL EP's order), put back at their place k in the
-- token's routing (ours' rank_major keeps the token's K places, -1 where the expert is elsewhere)
local function by_source(o, recv, all)
  local N, me, B, H, K, L = o.N, o.me, o.B, o.H, o.K, o.E / o.N
  local owners = {} -- row bytes -> list of {source, its token's routing row} that sent such a token here
  for s = 0, N - 1 do
    local inp = all[s + 1]
    local xs, pi = host(inp.x), ptr(host(inp.idx), "int32_t*")
    local n = T.size(xs, 1)
    for t = 0, n - 1 do
      local here = false
      for k = 0, K - 1 do here = here or (pi[t * K + k] >= 0 and math.floor(pi[t * K + k] / L) == me) end
      if here then
        local key = ffi.string(ptr(xs, "uint16_t*") + t * H, 2 * H)
        owners[key] = owners[key] or {}
        local route = {}
        for k = 0, K - 1 do route[k] = pi[t * K + k] end
        table.insert(owners[key], { s = s, route = route })
      end
    end
  end
  local x, ids, w = host(recv.x), T.to(host(recv.expert_ids), "i32"), host(recv.weights) -- flat's ids: i64
  local total = ptr(host(recv.counts), "int32_t*")[0]
  local x3 = T.fill_(empty({ N, B, H }, "bf16"), 0)
  local ids3, w3 = T.fill_(empty({ N, B, K }, "i32"), -1), T.fill_(empty({ N, B, K }, "f32"), 0)
  local counts = T.fill_(empty({ N }, "i32"), 0)
  local px, pid, pw = ptr(x, "uint16_t*"), ptr(ids, "int32_t*"), ptr(w, "float*")
  local p3, pid3, pw3, pc = ptr(x3, "uint16_t*"), ptr(ids3, "int32_t*"), ptr(w3, "float*"), ptr(counts, "int32_t*")
  for r = 0, math.min(total, T.size(x, 1)) - 1 do
    local list = owners[ffi.string(px + r * H, 2 * H)]
    local own = list and table.remove(list, 1)
    local s = own and own.s
    if s and pc[s] < B then
      local j = pc[s]
      pc[s] = j + 1
      ffi.copy(p3 + (s * B + j) * H, px + r * H, 2 * H)
      for i = 0, K - 1 do
        local id = pid[r * K + i]
        if id >= 0 then -- its place in the token's routing (a selection the routing lacks: left at place i)
          local at = i
          for k = 0, K - 1 do
            if own.route[k] == me * L + id then at = k end
          end
          pid3[(s * B + j) * K + at] = id
          pw3[(s * B + j) * K + at] = pw[r * K + i]
        end
      end
    end
  end
  return { x = x3, counts = counts, expert_ids = ids3, weights = w3 }
end

function M.as_ours(o, recv, all)
  if o.algorithm ~= "high_throughput" then
    return o.output == "rank_major" and zero_elsewhere(recv) or recv
  end
  if o.output == "expert_major" then return unpack_experts(o, recv) end
  return by_source(o, recv, all)
end

function M.expert_outputs(o, recv)
  local me, K, L = o.me, o.K, o.E / o.N
  if o.algorithm ~= "high_throughput" then
    local y = T.fill_(empty(T.size(recv.x), "bf16"), 0)
    for slot, e in pairs(ep_ref.expert_outputs(o, recv)) do
      T.copy_(T.narrow(T.select(y, 1, slot + 1), 1, 1, e.rows), e.y)
    end
    return y
  end
  local v = T.to(host(recv.x), "f64")
  local pc = ptr(host(recv.counts), "int32_t*")
  local wts = host(recv.weights)
  local pw = ptr(wts, "float*")
  local live = {} -- the rows received; the others (poisoned, maybe) go back as 0
  local function scale(row, c)
    T.mul_(T.narrow(v, 1, row + 1, 1), c)
    live[row] = true
  end
  if o.output == "expert_major" then
    local po = ptr(host(recv.offsets), "int32_t*")
    for le = 0, L - 1 do
      for r = po[le], po[le] + pc[le] - 1 do scale(r, pw[r] * ep_ref.coef(me * L + le)) end
    end
  else
    local ids = T.to(host(recv.expert_ids), "i32") -- i64 from NCCL EP
    local pid = ptr(ids, "int32_t*")
    for r = 0, pc[0] - 1 do
      local c = 0
      for k = 0, K - 1 do
        if pid[r * K + k] >= 0 then c = c + pw[r * K + k] * ep_ref.coef(me * L + pid[r * K + k]) end
      end
      scale(r, c)
    end
  end
  for r = 0, T.size(v, 1) - 1 do
    if not live[r] then T.fill_(T.narrow(v, 1, r + 1, 1), 0) end
  end
  return T.to(v, "bf16")
end

-- Interpreted: raw pointers out of tensors, then allocations (tensor.lua's note).
for _, fn in ipairs { zero_elsewhere, unpack_experts, by_source, M.expert_outputs } do jit.off(fn) end

return M
